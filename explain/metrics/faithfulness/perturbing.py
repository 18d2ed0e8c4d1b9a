"""What the faithfulness metrics share: the baseline each explained target is perturbed
towards, the pixels per step of a curve, the grid of patches that some metrics remove whole,
and random subsets of pixels removed against the map's sum over them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...baselines import make_baselines
from ..base import Pairs, draws, perturbed_scores, ranks

__all__ = [
    "baselines_for",
    "block_keys",
    "group_drops",
    "group_sums",
    "random_subsets",
    "ranked_groups",
    "removal_effects",
    "step_pixels",
]


def baselines_for(pairs: Pairs, baseline) -> Tensor:
    """``make_baselines`` for the pairs; a per-image baseline tensor (N, ...) is repeated
    for each of an image's k targets."""
    k = pairs.per_image
    if isinstance(baseline, Tensor) and k > 1 and baseline.dim() == 4 and baseline.shape[0] * k == len(pairs.images):
        baseline = baseline.repeat_interleave(k, dim=0)
    return make_baselines(pairs.images, baseline)


def step_pixels(step: int | float | None, height: int, width: int) -> int:
    """Pixels per step: an int counts pixels, a float in (0, 1] is a fraction of the image,
    ``None`` is one row's worth (Petsiuk et al.'s 224 pixels at 224 x 224).

    >>> step_pixels(0.25, 4, 4), step_pixels(3, 4, 4), step_pixels(None, 4, 6)
    (4, 3, 6)
    """
    if step is None:
        return width
    if isinstance(step, float) and 0 < step <= 1:
        return max(1, round(step * height * width))
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(
            f"step must be a number of pixels (int >= 1) or a fraction of the image in (0, 1], got {step!r}"
        )
    return step


def block_keys(maps: Tensor, patch_size: int, descending: bool = True) -> tuple[Tensor, int]:
    """Each pixel's key: the rank of its patch on a grid of ``patch_size`` squares, patches
    ranked by their summed relevance; with the number of patches. Where a side is not a
    multiple of ``patch_size`` the grid is centred, the border patches cut (as Quantus lays
    it out)."""
    m, height, width = maps.shape

    def padding(side: int) -> tuple[int, int]:
        extra = -side % patch_size
        return extra // 2, extra - extra // 2

    (top, bottom), (left, right) = padding(height), padding(width)
    padded = F.pad(maps, (left, right, top, bottom))
    rows, columns = padded.shape[1] // patch_size, padded.shape[2] // patch_size
    sums = padded.view(m, rows, patch_size, columns, patch_size).sum((2, 4)).flatten(1)
    patch_rank = ranks(sums, descending=descending).view(m, rows, columns)
    keys = patch_rank.repeat_interleave(patch_size, 1).repeat_interleave(patch_size, 2)
    return keys[:, top : top + height, left : left + width], rows * columns


def random_subsets(seed: int | None, indices: list[int], counts: Tensor, height: int, width: int, device) -> Tensor:
    """Boolean masks (len(indices), H, W): mask ``j`` holds ``counts[j]`` pixels drawn
    uniformly without replacement, from random draw ``indices[j]`` of ``seed``
    (:func:`~explain.metrics.base.draws`: the same masks for every image, whatever its batch).

    >>> masks = random_subsets(0, [0, 1], torch.tensor([3, 5]), 4, 4, "cpu")
    >>> masks.shape, masks.flatten(1).sum(1).tolist()
    (torch.Size([2, 4, 4]), [3, 5])
    """
    uniform = draws(seed, indices, (height * width,), torch.device(device))
    order = ranks(uniform, descending=False)
    return (order < counts.to(order.device).view(-1, 1)).view(-1, height, width)


def removal_effects(
    model: nn.Module, pairs: Pairs, masks: Tensor, substrate: Tensor, *, batch_size: int | None, score
) -> tuple[Tensor, Tensor]:
    """Each map's sum over each mask (R, H, W), and the drop of the target's score when the
    masked pixels (all channels) take the ``substrate``'s values: f(x) - f(x'), both
    (M, R). The masks are the same for every image; the intact images run in the same
    batches, as column 0."""
    masks = masks.to(pairs.images.device)
    every = torch.cat([masks.new_zeros(1, *masks.shape[1:]), masks])

    def perturb(rows: Tensor, columns: Tensor) -> Tensor:
        return torch.where(every[columns][:, None], substrate[rows], pairs.images[rows])

    scores = perturbed_scores(
        model, pairs.images, pairs.targets, len(every), perturb, batch_size=batch_size, score=score
    )
    sums = pairs.maps.flatten(1).double() @ masks.flatten(1).double().T
    return sums, (scores[:, :1] - scores[:, 1:]).double()


def group_drops(
    model: nn.Module, pairs: Pairs, groups: Tensor, count: int, fill, *, repeats: int = 1, batch_size, score
) -> tuple[Tensor, Tensor]:
    """The target's score on the intact images (M,) and on copies with one group of pixels
    replaced, (M, count, repeats): group ``g`` holds the pixels whose ``groups`` id (M, H, W)
    is ``g``. ``fill(rows, group, repeat)`` gives the replacement images of a batch, or
    ``fill`` is one tensor of them (M, C, H, W)."""
    columns = 1 + count * repeats

    def perturb(rows: Tensor, column: Tensor) -> Tensor:
        group, repeat = (column - 1).div(repeats, rounding_mode="floor"), (column - 1) % repeats
        replaced = (groups[rows] == group.view(-1, 1, 1)) & (column > 0).view(-1, 1, 1)
        values = fill(rows, group, repeat) if callable(fill) else fill[rows]
        return torch.where(replaced[:, None], values, pairs.images[rows])

    scores = perturbed_scores(model, pairs.images, pairs.targets, columns, perturb, batch_size=batch_size, score=score)
    return scores[:, 0], scores[:, 1:].reshape(len(scores), count, repeats)


def ranked_groups(maps: Tensor, step, *, descending: bool = True) -> tuple[Tensor, int]:
    """Each pixel's group: its rank in the map's order (highest first, or lowest with
    ``descending=False``), integer-divided by ``step`` pixels (a number or a fraction of the
    image); with the number of groups, the last one smaller where ``step`` does not divide
    the image."""
    height, width = maps.shape[-2:]
    size = step_pixels(step, height, width)
    groups = ranks(maps, descending=descending).div(size, rounding_mode="floor")
    return groups, -(-height * width // size)


def group_sums(maps: Tensor, groups: Tensor, count: int) -> Tensor:
    """Each map's sum over each of its groups, (M, count), in float64."""
    sums = torch.zeros(len(maps), count, dtype=torch.float64, device=maps.device)
    return sums.scatter_add_(1, groups.flatten(1), maps.flatten(1).double())
