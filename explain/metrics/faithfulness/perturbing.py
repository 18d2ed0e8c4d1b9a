"""What the faithfulness metrics share: the baseline each explained target is perturbed
towards, the pixels per step of a curve, and the grid of patches that some metrics remove
whole."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ...baselines import make_baselines
from ..base import Pairs, ranks

__all__ = ["baselines_for", "block_keys", "step_pixels"]


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
