"""Explanations read across a dataset: the strategies of a class (SpRAy, :func:`strategies`),
the files of the concepts a class uses (CRAFT's, :func:`write_craft`) and of the concepts a
user names (TCAV's, :func:`write_tcav`).

It reads what the methods and ``explain run`` leave (maps, :class:`~explain.Explanation`\\ s,
a run folder) and never runs a model itself."""

from .clustering import Strategies, StrategyCluster, eigengap_clusters, knn_affinity, laplacian_eigenvalues, spray
from .concept_files import write_craft
from .files import write_strategies
from .strategies import strategies
from .tcav_files import write_tcav

__all__ = [
    "Strategies",
    "StrategyCluster",
    "eigengap_clusters",
    "knn_affinity",
    "laplacian_eigenvalues",
    "spray",
    "strategies",
    "write_craft",
    "write_strategies",
    "write_tcav",
]
