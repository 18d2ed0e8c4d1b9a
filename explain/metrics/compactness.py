"""Structural compactness: are the map's salient pixels few regions, close together? MST-C,
the spread of the salient pixels (their convex hull) and their cohesion (the length of the
minimum spanning tree that joins them); the map alone, no model pass."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree
from scipy.spatial import ConvexHull, QhullError
from torch import Tensor

from ..checks import positive_int
from ..explanation import Explanation
from ..passes import Passes, with_pass_options
from .base import Score, check_finite

__all__ = ["mst_c"]


def _neighbour_graph(points: np.ndarray, k: int, grow: bool):
    """The symmetric k-nearest-neighbour graph of ``points`` (an edge where either point
    is among the other's k nearest, weighted by their distance); with ``grow``, k rises
    until the graph is connected. Returns the graph and its number of components."""
    # Here, not at the top: scikit-learn takes seconds to import, and every process that
    # imports explain (a CLI run, a Ray actor) would pay for it without scoring MST-C.
    from sklearn.neighbors import kneighbors_graph

    k = min(k, len(points) - 1)
    while True:
        directed = kneighbors_graph(points, n_neighbors=k, mode="distance", include_self=False)
        graph = directed.maximum(directed.T).tocsr()
        components = connected_components(graph, directed=False, return_labels=False)
        if components == 1 or not grow or k >= len(points) - 1:
            return graph, components
        k += 1


def _hull_side(points: np.ndarray, diagonal: float) -> float:
    """The square root of the area of the points' convex hull; the image's diagonal where
    the points span no area (fewer than three, or on one line)."""
    if len(points) < 3 or np.linalg.matrix_rank(points - points[0]) < 2:
        return diagonal
    try:
        area = float(ConvexHull(points).volume)  # in 2-D, the volume is the area
    except QhullError:
        return diagonal
    return math.sqrt(area) if math.isfinite(area) and area > 1e-12 else diagonal


def _compactness(magnitudes: np.ndarray, threshold: float, k: int, grow: bool) -> tuple[float, float, float, int]:
    """MST-C of one map's magnitudes (H, W), unscaled: (score, spread, cohesion, points)."""
    height, width = magnitudes.shape
    if magnitudes.max() == 0:
        return 0.0, 0.0, 0.0, 0
    cutoff = np.percentile(magnitudes, threshold)
    points = np.argwhere(magnitudes >= cutoff).astype(np.float64)
    if len(points) < 2:
        return math.nan, math.nan, math.nan, len(points)
    spread = 1.0 / _hull_side(points, math.hypot(height, width))
    graph, _ = _neighbour_graph(points, k, grow)
    length = float(minimum_spanning_tree(graph).sum())
    if not math.isfinite(length) or length <= 0:
        return math.nan, spread, math.nan, len(points)
    cohesion = len(points) / length
    return spread * cohesion, spread, cohesion, len(points)


@with_pass_options
def mst_c(
    explanation: Explanation | Tensor,
    *,
    threshold: float = 80.0,
    k: int = 20,
    grow_k: bool = False,
    scale: bool = True,
) -> Score:
    """MST-C: how compact the map's salient pixels are, their spread times their cohesion
    (higher is better: few, tight regions).

    Mesgari, Ma, Samek, Lapuschkin & Weber, "Structural Compactness as a Complementary
    Criterion for Explanation Quality", arXiv 2603.29491 (2026), as Quantus's MSTC
    defines it. The salient pixels V are those whose ``|a|`` reaches the map's ``threshold``
    percentile (numpy's linear interpolation: the top 20 % by default, ties included).
    Spread q_s = 1 / sqrt(A_hull), A_hull the area of their convex hull in pixels (the
    image's diagonal stands in for sqrt(A_hull) where the points span no area); cohesion
    q_c = ``|V|`` / L_T, L_T the length of the minimum spanning tree of the symmetric
    ``k``-nearest-neighbour graph of the points (a spanning forest where that graph falls
    apart; ``grow_k`` raises k until it is connected). MST-C = q_s q_c, times the image's
    diagonal and 100 with ``scale`` (Quantus's default). ``extra`` holds ``"spread"``,
    ``"cohesion"`` (unscaled) and ``"points"`` (``|V|``).

    An all-zero map scores 0; a map with fewer than two salient pixels NaN. The work is
    done per map on the CPU (scikit-learn's neighbour search, SciPy's hull and spanning
    tree): 0.1 to 0.5 s per 224 x 224 map.

    >>> maps = torch.zeros(1, 8, 8); maps[0, 2:4, 2:4] = 1.0   # 4 points above the 95th percentile
    >>> round(mst_c(maps, threshold=95, scale=False).values.item(), 4)   # q_s = 1, q_c = 4 / 3
    1.3333
    """
    maps = explanation.maps if isinstance(explanation, Explanation) else torch.as_tensor(explanation)
    if maps.dim() not in (3, 4):
        raise ValueError(f"maps must be (N, H, W) or (N, k, H, W), got {tuple(maps.shape)}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 100:
        raise ValueError(f"threshold must be a percentile in [0, 100), got {threshold!r}")
    k = positive_int("k", k)
    shape, (height, width) = tuple(maps.shape[:-2]), maps.shape[-2:]
    flat = check_finite(maps.reshape(-1, height, width)).detach().abs().double().cpu().numpy()
    found = np.empty((len(flat), 4))
    with Passes(None, len(flat)) as passes:
        for i, magnitudes in enumerate(flat):
            found[i] = _compactness(magnitudes, float(threshold), k, grow_k)
            passes.advance(1)
    values = torch.from_numpy(found).float().to(maps.device)
    score = values[:, 0] * (math.hypot(height, width) * 100 if scale else 1.0)
    return Score(
        "mst-c",
        score.reshape(shape),
        higher_is_better=True,
        extra={
            "spread": values[:, 1].reshape(shape),
            "cohesion": values[:, 2].reshape(shape),
            "points": values[:, 3].reshape(shape),
        },
    )
