"""Continuity: the map's strongest variation as the image is translated sideways."""

from __future__ import annotations

import torch
from torch import Tensor

from ...base import Explainer
from ...checks import positive_int
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, pairs_of
from .neighbourhood import explained_neighbours, largest

__all__ = ["continuity", "translate", "translations"]


def translations(width: int, steps: int) -> list[int]:
    """The horizontal shifts continuity compares, as Quantus's Continuity walks them:
    ``steps`` shifts of dx = (2 * width + 1) // steps pixels from -width + dx on, the shift
    0 (the image itself) left out.

    >>> translations(12, 6)
    [-8, -4, 4, 8, 12]
    """
    dx = (2 * width + 1) // positive_int("steps", steps)
    if dx == 0:
        raise ValueError(f"steps must be at most 2 * width + 1 = {2 * width + 1} for images {width} pixels wide")
    return [-width + k * dx for k in range(1, steps + 1) if k * dx != width]


def translate(images: Tensor, shifts: Tensor, fill: Tensor) -> Tensor:
    """Each image of ``images`` (B, ..., W) moved ``shifts[i]`` pixels along its last axis
    (positive: to the right), the columns it uncovers set to ``fill[i]``.

    >>> translate(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([1]), torch.tensor([0.0])).tolist()
    [[0.0, 1.0, 2.0]]
    """
    b, width = images.shape[0], images.shape[-1]
    lead = [1] * (images.dim() - 2)
    source = torch.arange(width, device=images.device) - shifts.to(images.device)[:, None]
    inside = ((source >= 0) & (source < width)).view(b, *lead, width)
    moved = images.gather(-1, source.clamp(0, width - 1).view(b, *lead, width).expand_as(images))
    return torch.where(inside, moved, fill.view(b, *lead, 1).to(images.dtype))


@with_pass_options
def continuity(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    steps: int = 28,
    batch_size: int | None = None,
) -> Score:
    """Continuity: the largest change of the map per change of the image as the image is
    translated sideways (lower is better: the explanation varies continuously).

    Montavon, Samek & Müller, "Methods for Interpreting and Understanding Deep Neural
    Networks", Digital Signal Processing 73, 2018 (section on explanation continuity): the
    strongest variation of the explanation in the input domain,
    max over x' != x of ||R(x) - R(x')||_1 / ||x - x'||_2,
    R the map (``Explanation.maps``) of the same target, re-explained by ``explainer`` at
    x', ||x - x'|| over every input value. As Quantus 0.6 (Continuity), the x' are the
    image translated horizontally by ``steps`` shifts of (2W + 1) // ``steps`` pixels from
    about -W to +W (28 by default: 27 explanations per image at 224 px), the
    uncovered columns filled with the image's minimum; x' = x is left out (the paper's
    x' != x: Quantus's shift 0 would divide a rounding difference by 1e-9). The map is
    compared as the explainer scales it: Quantus takes its absolute value and divides it by
    the batch's largest value first (give it ``abs=False, normalise=False``). Earlier Quantus
    versions returned, per translation, each patch's sum of the map and the model's score,
    and scored the correlation of the two curves, by their own account an addition to the
    paper's method; 0.6 and explain compute the paper's quantity.

    ``curves["continuity"]`` (N, S) holds the ratio at each shift (``steps``, in pixels;
    NaN where the shift leaves the image unchanged), ``values`` its largest.
    """
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    shifts = torch.tensor(translations(pairs.images.shape[-1], steps), device=pairs.images.device)

    def perturb(images: Tensor, samples: list[int]) -> Tensor:
        return translate(images, shifts[samples], images.flatten(1).amin(1))

    ratios = torch.empty(len(pairs.targets), len(shifts), device=pairs.images.device)

    def visit(part: slice, r: Tensor, moved: Tensor, again: Explanation) -> None:
        change = (again.maps - pairs.maps[r]).flatten(1).abs().sum(1)
        distance = (moved - pairs.images[r]).flatten(1).float().norm(dim=1)
        ratios.view(-1)[part] = torch.where(distance > 0, change / distance, float("nan"))

    explained_neighbours(explainer, pairs, len(shifts), perturb, batch_size, visit)
    return Score(
        metric="continuity",
        values=pairs.unflatten(largest(ratios)),
        higher_is_better=False,
        curves={"continuity": pairs.unflatten(ratios)},
        steps=shifts.float().cpu(),
    )
