"""Explanations read across a dataset: the strategies of a class (SpRAy, :func:`strategies`).

It reads what the methods and ``explain run`` leave (maps, :class:`~explain.Explanation`\\ s,
a run folder) and never runs a model itself."""

from .clustering import Strategies, StrategyCluster, eigengap_clusters, knn_affinity, laplacian_eigenvalues, spray
from .files import write_strategies
from .strategies import strategies

__all__ = [
    "Strategies",
    "StrategyCluster",
    "eigengap_clusters",
    "knn_affinity",
    "laplacian_eigenvalues",
    "spray",
    "strategies",
    "write_strategies",
]
