"""Localisation: does the map point at the object, given where the object is?

Each metric takes the object's region per image as a boolean mask (N, H, W) or as boxes
(N, 4) of ``(x0, y0, x1, y1)`` in pixels (a pixel is inside when its centre is). An image
with an empty region scores NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import checked_number, positive_int
from ..explanation import Explanation
from ..passes import with_pass_options
from ..regions import region_masks
from .base import Score, check_finite

__all__ = [
    "attribution_localisation",
    "auc",
    "energy_pointing_game",
    "pointing_game",
    "relevance_mass",
    "relevance_rank",
    "top_k_intersection",
]


def _maps_and_masks(explanation: Explanation | Tensor, regions: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    maps = explanation.maps if isinstance(explanation, Explanation) else torch.as_tensor(explanation)
    if maps.dim() not in (3, 4):
        raise ValueError(f"maps must be (N, H, W) or (N, k, H, W), got {tuple(maps.shape)}")
    shape = tuple(maps.shape[:-2])
    masks = region_masks(regions, (maps.shape[-2], maps.shape[-1])).to(maps.device)
    if masks.shape[0] != maps.shape[0]:
        raise ValueError(f"{masks.shape[0]} regions for {maps.shape[0]} maps: give one region per image")
    if maps.dim() == 4:  # topk: every target of an image is judged against its region
        masks = masks.repeat_interleave(maps.shape[1], dim=0)
    return check_finite(maps.reshape(-1, *maps.shape[-2:]).float()), masks, shape


def _empty_is_nan(values: Tensor, masks: Tensor) -> Tensor:
    return torch.where(masks.flatten(1).any(1), values, float("nan"))


@with_pass_options
def pointing_game(explanation: Explanation | Tensor, regions: Tensor, *, tolerance: float = 15.0) -> Score:
    """Pointing game: 1 where the map's maximum lies within ``tolerance`` pixels of the
    region, else 0 (higher is better).

    Zhang et al., "Top-down Neural Attention by Excitation Backprop", ECCV 2016, with the
    paper's 15-pixel tolerance. Where several pixels share the maximum, any of them
    counts. (Quantus's PointingGame has no tolerance; ``tolerance=0`` gives its results.)

    >>> maps = torch.zeros(1, 40, 40); maps[0, 0, 0] = 1.0
    >>> box = torch.tensor([[10, 10, 20, 20]])
    >>> pointing_game(maps, box).values.item(), pointing_game(maps, box, tolerance=0).values.item()
    (1.0, 0.0)
    """
    maps, masks, shape = _maps_and_masks(explanation, regions)
    tolerance = checked_number("tolerance", tolerance, positive=False)
    peaks = maps.flatten(1) == maps.flatten(1).amax(1, keepdim=True)
    if tolerance > 0:
        radius = int(tolerance)
        offsets = torch.arange(-radius, radius + 1, device=maps.device, dtype=torch.float32)
        disc = ((offsets[:, None] ** 2 + offsets[None, :] ** 2) <= tolerance**2).float()[None, None]
        near = torch.nn.functional.conv2d(masks[:, None].float(), disc, padding=radius)[:, 0] > 0.5
    else:
        near = masks
    hit = (peaks & near.flatten(1)).any(1).float()
    return Score("pointing-game", _empty_is_nan(hit, masks).reshape(shape), higher_is_better=True)


@with_pass_options
def relevance_mass(explanation: Explanation | Tensor, regions: Tensor) -> Score:
    """Relevance mass accuracy: the share of the map's positive relevance inside the region
    (higher is better).

    Arras, Osman & Samek, "CLEVR-XAI", Information Fusion 2022: R_within / R_total over
    the positive relevance (negative relevance is evidence against the class, not mass
    that could fall inside the object). Quantus sums signed values; for maps in [0, 1],
    as CAMs give, the two agree.

    >>> maps = torch.tensor([[[3.0, 1.0], [0.0, -1.0]]])
    >>> relevance_mass(maps, torch.tensor([[[True, False], [False, False]]])).values.item()
    0.75
    """
    maps, masks, shape = _maps_and_masks(explanation, regions)
    positive = maps.clamp_min(0).flatten(1)
    total = positive.sum(1)
    share = torch.where(total > 0, (positive * masks.flatten(1)).sum(1) / total.clamp_min(1e-30), 0.0)
    return Score("relevance-mass", _empty_is_nan(share, masks).reshape(shape), higher_is_better=True)


@with_pass_options
def relevance_rank(explanation: Explanation | Tensor, regions: Tensor) -> Score:
    """Relevance rank accuracy: with K the region's size in pixels, the share of the K
    highest-ranked pixels that lie in the region (higher is better).

    Arras, Osman & Samek, "CLEVR-XAI", Information Fusion 2022. Ties are broken in
    raster order.

    >>> maps = torch.tensor([[[3.0, 1.0], [2.0, 0.0]]])
    >>> relevance_rank(maps, torch.tensor([[[True, True], [False, False]]])).values.item()
    0.5
    """
    maps, masks, shape = _maps_and_masks(explanation, regions)
    flat_masks = masks.flatten(1)
    order = maps.flatten(1).argsort(dim=1, descending=True, stable=True)
    size = flat_masks.sum(1)
    in_top = torch.arange(order.shape[1], device=maps.device)[None] < size[:, None]
    hits = (flat_masks.gather(1, order) & in_top).sum(1)
    share = hits.float() / size.clamp_min(1)
    return Score("relevance-rank", _empty_is_nan(share, masks).reshape(shape), higher_is_better=True)


@with_pass_options
def energy_pointing_game(explanation: Explanation | Tensor, regions: Tensor) -> Score:
    """Energy-based pointing game: the share of the map's energy inside the region, the map
    min-max scaled to [0, 1] first (higher is better).

    Wang et al., "Score-CAM: Score-Weighted Visual Explanations for Convolutional Neural
    Networks", CVPR Workshops 2020. A constant map has no energy and scores 0.

    >>> maps = torch.tensor([[[1.0, 0.5], [0.5, 0.0]]])
    >>> energy_pointing_game(maps, torch.tensor([[0, 0, 1, 1]])).values.item()
    0.5
    """
    maps, masks, shape = _maps_and_masks(explanation, regions)
    flat = maps.flatten(1)
    low, high = flat.amin(1, keepdim=True), flat.amax(1, keepdim=True)
    scaled = torch.where(high > low, (flat - low) / (high - low).clamp_min(1e-30), 0.0)
    total = scaled.sum(1)
    share = torch.where(total > 0, (scaled * masks.flatten(1)).sum(1) / total.clamp_min(1e-30), 0.0)
    return Score("energy-pointing-game", _empty_is_nan(share, masks).reshape(shape), higher_is_better=True)


@with_pass_options
def top_k_intersection(
    explanation: Explanation | Tensor, regions: Tensor, *, k: int = 1000, concept_influence: bool = False
) -> Score:
    """Top-k intersection: the share of the map's ``k`` highest-ranked pixels that lie in the
    region (higher is better).

    Theiner, Mueller-Budack & Ewerth, "Interpretable Semantic Photo Geolocation", WACV 2022
    (arXiv 2021), as Quantus's TopKIntersection: k = 1000 pixels by default (2 % of a 224 x
    224 image; at most the whole map), ties broken in raster order. With
    ``concept_influence`` the share is divided by the region's share of the image, so that
    1 means "as often as a random pixel would be". An empty region scores NaN.

    >>> maps = torch.tensor([[[3.0, 1.0], [2.0, 0.0]]])
    >>> top_k_intersection(maps, torch.tensor([[[True, True], [False, False]]]), k=2).values.item()
    0.5
    """
    maps, masks, shape = _maps_and_masks(explanation, regions)
    flat_masks = masks.flatten(1)
    top = min(positive_int("k", k), flat_masks.shape[1])
    order = maps.flatten(1).argsort(dim=1, descending=True, stable=True)[:, :top]
    share = flat_masks.gather(1, order).float().mean(1)
    if concept_influence:
        share = share * flat_masks.shape[1] / flat_masks.sum(1).clamp_min(1)
    return Score("top-k-intersection", _empty_is_nan(share, masks).reshape(shape), higher_is_better=True)


def average_ranks(values: Tensor) -> Tensor:
    """Each value's rank within its row of ``values`` (M, P), 1 for the smallest, tied
    values sharing the mean of their ranks (as ``scipy.stats.rankdata``), float64.

    >>> average_ranks(torch.tensor([[0.5, 0.1, 0.5, 0.9]])).tolist()
    [[2.5, 1.0, 2.5, 4.0]]
    """
    ordered = values.sort(dim=1).values.contiguous()
    below = torch.searchsorted(ordered, values.contiguous(), right=False)
    up_to = torch.searchsorted(ordered, values.contiguous(), right=True)
    return (below + up_to + 1).double() / 2


@with_pass_options
def auc(explanation: Explanation | Tensor, regions: Tensor) -> Score:
    """AUC: the area under the ROC curve of the map's values as a detector of the region's
    pixels, the chance that a pixel of the region outranks a pixel outside it (ties
    count half; higher is better, 0.5 is chance).

    Fawcett, "An Introduction to ROC Analysis", Pattern Recognition Letters 2006, as
    Quantus's AUC applies it to a map and a segmentation mask (scikit-learn's
    ``roc_curve`` and ``auc``): computed here in closed form from the pixels' ranks,
    (sum of the region's ranks - K (K + 1) / 2) / (K (P - K)), K the region's pixels of P.
    NaN for an empty region, or one that covers the image.

    >>> maps = torch.tensor([[[3.0, 1.0], [2.0, 0.0]]])
    >>> auc(maps, torch.tensor([[[True, False], [True, False]]])).values.item()
    1.0
    """
    maps, masks, shape = _maps_and_masks(explanation, regions)
    flat_masks = masks.flatten(1)
    inside = flat_masks.sum(1).double()
    outside = flat_masks.shape[1] - inside
    rank_sum = (average_ranks(maps.flatten(1)) * flat_masks).sum(1)
    area = (rank_sum - inside * (inside + 1) / 2) / (inside * outside).clamp_min(1)
    area = torch.where((inside > 0) & (outside > 0), area, float("nan"))
    return Score("auc", area.float().reshape(shape), higher_is_better=True)


@with_pass_options
def attribution_localisation(
    explanation: Explanation | Tensor, regions: Tensor, *, weighted: bool = False, magnitude: bool = False
) -> Score:
    """Attribution localisation: the share of the map's positive relevance inside the
    region, the inside-total relevance ratio (higher is better).

    Kohlbrenner et al., "Towards Best Practice in Explaining Neural Network Decisions with
    LRP", IJCNN 2020: mu = R_in / R_tot over the positive relevance (what
    :func:`relevance_mass` computes too). With ``weighted``, mu_w = mu * S_tot / S_in, S the
    sizes of the image and of the region: relevance spread evenly scores 1, and a small
    region counts for more. With ``magnitude`` the share is of ``|a|``, Quantus's default
    (``abs=True``); ``extra["share"]`` is the region's share of the image, S_in / S_tot.
    An empty region scores NaN.

    Quantus's AttributionLocalisation takes ``|a|`` by default and, with ``weighted=True``,
    multiplies mu by the region's share of the image instead of dividing by it (sized from
    ``x_batch[2:]``, the images after the second, not one image).

    >>> maps = torch.tensor([[[3.0, 1.0], [0.0, -1.0]]])
    >>> box = torch.tensor([[[True, False], [False, False]]])
    >>> attribution_localisation(maps, box).values.item()
    0.75
    >>> attribution_localisation(maps, box, weighted=True).values.item()   # 0.75 / (1 / 4)
    3.0
    """
    maps, masks, shape = _maps_and_masks(explanation, regions)
    relevance = (maps.abs() if magnitude else maps.clamp_min(0)).flatten(1)
    flat_masks = masks.flatten(1)
    total = relevance.sum(1)
    share = torch.where(total > 0, (relevance * flat_masks).sum(1) / total.clamp_min(1e-30), 0.0)
    size = flat_masks.float().mean(1)
    if weighted:
        share = share / size.clamp_min(1e-30)
    return Score(
        "attribution-localisation",
        _empty_is_nan(share, masks).reshape(shape),
        higher_is_better=True,
        extra={"share": size.reshape(shape)},
    )
