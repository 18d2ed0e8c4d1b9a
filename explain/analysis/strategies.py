"""The strategies of each class (SpRAy, :mod:`explain.analysis.clustering`) from maps,
explanations or a finished ``explain run`` folder: :func:`strategies`."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from ..explanation import Explanation
from .clustering import MIN_ITEMS, Strategies, spray
from .items import ClassItems, items_from_explanations, items_from_maps, items_from_run

__all__ = ["strategies"]


def strategies(
    source,
    *,
    classes: Sequence[str | int] | None = None,
    method: str | None = None,
    features: str = "auto",
    grid: int = 32,
    n_clusters: int | str = "auto",
    max_clusters: int = 8,
    n_neighbors: int = 10,
    embedding: str = "auto",
    seed: int = 0,
) -> dict[str, Strategies]:
    """The strategies a model uses for each class: Spectral Relevance Analysis (SpRAy;
    Lapuschkin et al., "Unmasking Clever Hans predictors and assessing what machines really
    learn", Nature Communications 10, 1096, 2019) of its explanations, one
    :class:`~explain.analysis.Strategies` per class, by class name.

    ``source``: maps (N, H, W) of one class's images (a tensor, an array, or a list of maps
    of any sizes; the key is ``"all"``), :class:`~explain.Explanation`\\ s (grouped by the
    class each map explains; CRP's :class:`~explain.ConceptExplanation`\\ s by default on
    the relevance of every channel of the concept layer: which concepts were used, not only
    where), or the folder of a finished ``explain run --save-maps`` (its manifest and
    ``.npz`` maps, of either engine; ``method`` picks one of its methods, and
    ``--method crp`` runs are clustered on their top concepts' relevances).

    Each map is sum-pooled to ``grid`` x ``grid`` (maps of different sizes each to the same
    grid; a map smaller than the grid makes the grid its size for all) and divided by its largest absolute value; the
    items are clustered by spectral clustering on a ``n_neighbors`` nearest-neighbour graph,
    ``n_clusters`` chosen by the eigengap (``"auto"``, at most ``max_clusters``) or given;
    ``embedding`` places them in 2-D: ``tsne``, ``umap`` (where the package is installed),
    ``spectral`` (the spectral embedding's first axes, free) or ``auto`` (t-SNE up to
    5,000 items of a class, spectral beyond).
    Deterministic given ``seed``. Without ``classes``, the classes with fewer than
    :data:`~explain.analysis.clustering.MIN_ITEMS` items are left out with a warning (unless
    all are: then the error says so); a class named in ``classes`` must have that many.

    >>> maps = torch.rand(20, 8, 8, generator=torch.Generator().manual_seed(0)) / 10
    >>> maps[:12, :2, :2] += 1; maps[12:, 6:, 6:] += 1   # two planted strategies
    >>> found = strategies(maps, embedding="spectral")["all"]
    >>> found.n_clusters, found.clusters.tolist()
    (2, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    """
    groups = _items(source, classes, method, features, grid)
    if classes is None:  # every class: those too small for SpRAy left out, with a warning
        groups = _large_enough(groups)
    found = {}
    for name, group in groups.items():
        try:
            result = spray(
                group.features,
                n_clusters=n_clusters,
                max_clusters=max_clusters,
                n_neighbors=n_neighbors,
                seed=seed,
                embedding=embedding,
                probabilities=group.probabilities,
                mistakes=group.mistakes,
                prototypes=_prototypes(group),
            )
        except ValueError as error:
            raise ValueError(f"class {name}: {error}") from None
        result.features, result.keys, result.concept_names = group.kind, group.keys, group.concept_names
        found[name] = result
    return found


def _large_enough(groups: dict[str, ClassItems]) -> dict[str, ClassItems]:
    small = {name: len(group.keys) for name, group in groups.items() if len(group.keys) < MIN_ITEMS}
    if small and len(small) < len(groups):
        listed = ", ".join(f"{name} ({count})" for name, count in small.items())
        warnings.warn(
            f"left out the classes with fewer than {MIN_ITEMS} items, too few to cluster: {listed}", stacklevel=3
        )
        return {name: group for name, group in groups.items() if name not in small}
    return groups


def _items(source, classes, method, features, grid) -> dict[str, ClassItems]:
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid must be a positive int (the side of the pooled maps), got {grid!r}")
    if isinstance(source, (str, os.PathLike)):
        return items_from_run(source, classes, method, features, grid)
    if isinstance(source, Explanation) or (
        isinstance(source, Sequence) and source and all(isinstance(e, Explanation) for e in source)
    ):
        groups = items_from_explanations(source, grid, features)
    else:
        if features == "concepts":
            raise ValueError("maps carry no concept relevances: pass CRP's explanations or a `--method crp` run")
        groups = items_from_maps(source if isinstance(source, (torch.Tensor, np.ndarray)) else list(source), grid)
    if classes is not None:
        wanted = {str(c) for c in classes}
        missing = wanted - set(groups)
        if missing:
            raise ValueError(
                f"the classes {', '.join(sorted(missing))} are not among the explanations' classes "
                f"({', '.join(sorted(groups))})"
            )
        groups = {name: group for name, group in groups.items() if name in wanted}
    return groups


def _prototypes(group: ClassItems) -> np.ndarray:
    """What a cluster's prototype averages: the pooled maps on their grid, or the vectors."""
    if group.kind == "maps" and group.grid is not None:
        return group.features.reshape(len(group.features), *group.grid)
    return group.features
