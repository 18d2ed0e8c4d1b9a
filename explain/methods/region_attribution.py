"""Region attributions: image regions ranked by the attribution they hold.

:class:`XRAI` (Kapishnikov et al., ICCV 2019) builds its regions from overlapping
Felzenszwalb segments at several scales and adds them greedily, the one whose new pixels
carry the most Integrated Gradients attribution per pixel first. Its numbers follow Google
PAIR's ``saliency`` package (the authors' code), which the tests check it against; the IG
passes run in inner batches from the memory budget, the ranking on the images' device.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..base import NotApplicable, register
from ..checks import checked_number, positive_int
from ..superpixels import felzenszwalb_regions
from .attribution_base import Batched, ScoredModel
from .path_attribution import score_gradients
from .segment_attribution import TakesSegments

__all__ = ["XRAI", "ranked_regions", "riemann_integrated_gradients", "xrai_ranking"]

#: A region must add at least this many pixels to the regions before it to be ranked (PAIR's).
MIN_PIXEL_DIFF = 50


def riemann_integrated_gradients(
    scored: ScoredModel, images: Tensor, baselines: Tensor, owners: Tensor, k: int, steps: int, rows: int
) -> Tensor:
    """Integrated Gradients of each of ``images`` (B, C, H, W) from its baseline, as PAIR's
    ``saliency`` package sums them: (x - x') times the mean of dS/dx at ``steps`` points
    ``linspace(0, 1, steps)`` of the straight line, S of explained target ``k`` of image
    ``owners[b]``; the points in inner batches of ``rows`` rows."""
    alphas = torch.linspace(0.0, 1.0, steps, dtype=torch.float64, device=images.device)
    pairs = [(b, a) for b in range(len(images)) for a in range(steps)]
    totals = torch.zeros_like(images, dtype=torch.float64)
    start, span = baselines.double(), images.double() - baselines.double()
    for first in range(0, len(pairs), rows):
        batch = pairs[first : first + rows]
        which = torch.tensor([b for b, _ in batch], device=images.device)
        along = alphas[[a for _, a in batch]].view(-1, 1, 1, 1)
        points = start[which] + along * span[which]
        totals.index_add_(0, which, score_gradients(scored, points, owners[which], k, rows))
    return totals * span / steps


def xrai_ranking(
    attribution: Tensor, regions: Tensor, area_threshold: float = 1.0, min_pixel_diff: int = MIN_PIXEL_DIFF
) -> Tensor:
    """XRAI's heatmap (H, W) of one image from its pixel attributions (H, W) and candidate
    ``regions`` (M, H, W): regions are added greedily, each time the one whose pixels not yet
    covered have the highest mean attribution (regions adding under ``min_pixel_diff``
    pixels are dropped), until ``area_threshold`` of the image is covered; the new pixels of
    each get its gain, pixels no region reached the mean attribution over them.
    Kapishnikov et al. 2019, Algorithm 1, as PAIR's ``XRAI._xrai``.

    >>> attribution = torch.tensor([[1.0, 1.0], [0.0, 3.0]])
    >>> regions = torch.tensor([[[True, True], [False, False]], [[False, False], [False, True]]])
    >>> xrai_ranking(attribution, regions, min_pixel_diff=1).tolist()   # the lone pixel: the mean of those left
    [[1.0, 1.0], [0.0, 3.0]]
    """
    return ranked_regions(attribution, regions, area_threshold, min_pixel_diff)[0]


def ranked_regions(
    attribution: Tensor, regions: Tensor, area_threshold: float = 1.0, min_pixel_diff: int = MIN_PIXEL_DIFF
) -> tuple[Tensor, Tensor]:
    """:func:`xrai_ranking`'s heatmap (H, W) and each region's gain (M,): the mean attribution
    of the pixels it added when it was added, NaN for a region never added (it would have
    added under ``min_pixel_diff`` pixels, or the area threshold was reached before it).

    >>> attribution = torch.tensor([[3.0, 3.0], [0.0, 1.0]])
    >>> regions = torch.tensor([[[True, True], [False, True]], [[False, False], [False, True]]])
    >>> ranked_regions(attribution, regions, min_pixel_diff=1)[1].tolist()   # the second adds nothing
    [2.3333333333333335, nan]
    """
    values = attribution.flatten().double()
    candidates = regions.flatten(1).to(values.device)
    # Each region's uncovered pixels and their attribution, lowered as regions are added: the
    # pixels a region adds are read once, not every candidate's whole mask at every step.
    counts, sums = candidates.sum(dim=1), weighted_sums(candidates, values)
    alive = torch.ones(len(candidates), dtype=torch.bool, device=values.device)
    covered = torch.zeros_like(values, dtype=torch.bool)
    heatmap = torch.full_like(values, -torch.inf)
    added_gains = torch.full((len(candidates),), torch.nan, dtype=values.dtype, device=values.device)
    covered_pixels = 0
    while covered_pixels / len(values) <= area_threshold:
        alive &= counts >= max(min_pixel_diff, 1)
        if not bool(alive.any()):
            break
        gains = torch.where(alive, sums / counts.clamp_min(1), -torch.inf)
        best = int(gains.argmax())  # the first of equal gains, as PAIR's strict comparison
        new = candidates[best] & ~covered
        heatmap[new] = added_gains[best] = gains[best]
        covered |= new
        alive[best] = False
        added = new.nonzero().squeeze(1)
        covered_pixels += len(added)
        counts -= candidates[:, added].sum(dim=1)
        sums -= weighted_sums(candidates[:, added], values[added])
    left = heatmap == -torch.inf
    if bool(left.any()):
        heatmap[left] = values[left].mean()
    return heatmap.view(attribution.shape), added_gains


def weighted_sums(masks: Tensor, values: Tensor) -> Tensor:
    """``masks`` (M, P) bool times ``values`` (P,): each mask's sum of values, a few rows
    of masks at a time in the values' dtype."""
    return torch.cat([chunk.to(values.dtype) @ values for chunk in masks.split(128)])


@register
class XRAI(TakesSegments, Batched):
    """XRAI: image regions ranked by the Integrated Gradients attribution they gain.

    Overlapping Felzenszwalb segments (scales 50 to 1200, dilated) are added greedily, the
    one whose new pixels have the highest mean attribution first; each pixel's value is the
    gain of the region that added it, so the map ranks regions. The attribution is IG from
    a black and a white baseline (the image's minimum and maximum), averaged, its largest
    channel per pixel.

    Kapishnikov et al., "XRAI: Better Attributions Through Regions", ICCV 2019, sec. 3
    (Algorithm 1); segments, IG sum (``steps`` points, 100) and ranking as Google PAIR's
    ``saliency`` package (``explain.superpixels.felzenszwalb_regions``,
    ``riemann_integrated_gradients`` and ``xrai_ranking`` of this module). ``raw`` is the heatmap,
    (N, 1, H, W); the default ``reduction="sum"`` keeps its sign (regions that lower the
    score rank last). Regions adding under ``min_pixel_diff`` new pixels are dropped (PAIR's
    50). Grey or colour images only (NotApplicable otherwise).

    ``segments=`` (a call's: masks or a label image per image, see :mod:`explain.segments`)
    are the candidate regions instead of the Felzenszwalb segments, used as given (not
    dilated), as PAIR's ``GetMask(segments=)`` takes them (the paper's regions may come
    from any segmentation, sec. 3.1); then images of any number of channels. Each segment's
    score (``segment_scores``) is its gain when XRAI added it, NaN for a segment it never
    added (its new pixels under ``min_pixel_diff``, or added after the area threshold);
    the map stays XRAI's heatmap.
    """

    name = "xrai"
    formula = (
        "Felzenszwalb regions (6 scales, dilated) ranked by the IG they gain, black and white baselines; "
        "`raw` (N, 1, H, W), signed"
    )
    runs_on = "explain + scikit-image (PAIR `saliency`'s numbers)"
    family = "gradient attribution"
    images_only = "its regions are Felzenszwalb segments of a 2-D image; use guidedig or ig"
    cost = "1 forward + 2 x {steps} forward + backward"

    def __init__(
        self,
        model: nn.Module,
        *,
        steps: int = 100,
        dilation_radius: int = 5,
        area_threshold: float = 1.0,
        reduction: str = "sum",
        min_pixel_diff: int = MIN_PIXEL_DIFF,
        **options,
    ):
        super().__init__(model, reduction=reduction, **options)
        self.steps = positive_int("steps", steps)
        self.min_pixel_diff = positive_int("min_pixel_diff", min_pixel_diff)
        if isinstance(dilation_radius, bool) or not isinstance(dilation_radius, int) or dilation_radius < 0:
            raise ValueError(f"dilation_radius must be a non-negative int (pixels), got {dilation_radius!r}")
        self.dilation_radius = dilation_radius
        self.area_threshold = checked_number("area_threshold", area_threshold, positive=True)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + 2 * self.steps)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        given = scored.memo.get("segments")
        if given is None and images.shape[1] not in (1, 3):
            raise NotApplicable(
                f"XRAI segments grey or colour images (1 or 3 channels), not {images.shape[1]} channels; "
                "use ig or guidedig for other inputs"
            )
        n = len(images)
        low = images.flatten(1).amin(1).view(-1, 1, 1, 1).expand_as(images)
        high = images.flatten(1).amax(1).view(-1, 1, 1, 1).expand_as(images)
        owners = torch.arange(n, device=images.device).repeat(2)
        rows = self.rows(images, 2 * n * self.steps)
        attributions = riemann_integrated_gradients(
            scored, images.repeat(2, 1, 1, 1), torch.cat([low, high]), owners, k, self.steps, rows
        )
        pixels = ((attributions[:n] + attributions[n:]) / 2).amax(dim=1)
        if given is None and "regions" not in scored.memo:
            scored.memo["regions"] = [felzenszwalb_regions(image, self.dilation_radius) for image in images]
        regions = scored.memo["regions"] if given is None else given
        ranked = [
            ranked_regions(p, r, self.area_threshold, self.min_pixel_diff) for p, r in zip(pixels, regions, strict=True)
        ]
        if given is not None:
            dtype = torch.float64 if images.dtype == torch.float64 else torch.float32
            scored.memo.setdefault("segment_scores", []).append([gains.to(dtype) for _, gains in ranked])
        return torch.stack([heatmap for heatmap, _ in ranked])[:, None].to(images.dtype)
