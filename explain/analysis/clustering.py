"""Spectral Relevance Analysis (SpRAy): the strategies a model uses for one class, found by
clustering the explanations of that class's images.

Lapuschkin, Wäldchen, Binder, Montavon, Samek and Müller, "Unmasking Clever Hans predictors
and assessing what machines really learn", Nature Communications 10, 1096 (2019). The steps,
as the paper's and CoRelAy's SpRAy pipeline (``corelay.pipeline.spectral``):

1. each map resized to a small grid by sum (area) pooling and normalised
   (:func:`~explain.analysis.clustering.pooled_features`), or a vector per item (CRP's concept relevances) normalised;
2. a symmetric k-nearest-neighbour affinity on the Euclidean distances (scikit-learn's
   ``kneighbors_graph``, binary edges, ``(A + Aᵀ) / 2``: CoRelAy's ``SparseKNN``);
3. the smallest eigenvalues of the graph's symmetric normalised Laplacian (scipy's sparse
   ``eigsh``): the number of clusters is where the gap between consecutive eigenvalues is
   largest (the eigengap, :func:`~explain.analysis.eigengap_clusters`);
4. the spectral embedding (scikit-learn's ``spectral_embedding``) and k-means in it
   (scikit-learn's ``KMeans``);
5. a 2-D embedding for the picture: t-SNE (scikit-learn) of the spectral embedding, or UMAP
   where the ``umap`` package is installed and asked for.

Where this differs from CoRelAy's defaults: CoRelAy computes the full distance matrix
(``SciPyPDist``, N² memory) where the neighbours come from scikit-learn's tree search; it
embeds 32 eigenvectors and clusters them with a number of clusters the user gives, where the
number here is the eigengap's (or the user's) and k-means runs on that many eigenvectors.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from scipy.sparse import csgraph, csr_matrix
from scipy.sparse.linalg import eigsh
from sklearn.cluster import KMeans
from sklearn.manifold import TSNE, spectral_embedding
from sklearn.neighbors import kneighbors_graph

__all__ = [
    "EMBEDDINGS",
    "MIN_ITEMS",
    "TSNE_LIMIT",
    "Strategies",
    "StrategyCluster",
    "eigengap_clusters",
    "knn_affinity",
    "laplacian_eigenvalues",
    "pooled_features",
    "spray",
]

#: With ``embedding="auto"``, the most items t-SNE places; beyond, the spectral embedding's
#: first two axes (t-SNE of 10,000 items took 77 s on a shared 2-core machine, more than
#: the clustering; ask for ``"tsne"`` to have it anyway).
TSNE_LIMIT = 5000
#: The 2-D embeddings of the picture (:func:`embed_2d`).
EMBEDDINGS = ("auto", "tsne", "umap", "spectral")
#: The fewest items SpRAy clusters: a neighbourhood graph and a spectrum need a few more than
#: the neighbours of one item.
MIN_ITEMS = 5


@dataclass
class StrategyCluster:
    """One strategy of the class: a cluster of similar explanations.

    Attributes
    ----------
    size:
        How many items it holds.
    prototype:
        The mean of its members' normalised features: a map on the grid (grid, grid) for
        maps, a vector for concept relevances.
    nearest:
        Positions (into the result's items) of the members nearest the cluster's centre in
        the spectral embedding, nearest first.
    mean_probability:
        The members' mean probability of the class, where probabilities were given.
    mistake_share:
        The share of members the model got wrong, where that was given (``explain run
        --labels``); None otherwise.
    """

    size: int
    prototype: np.ndarray
    nearest: list[int]
    mean_probability: float | None = None
    mistake_share: float | None = None


@dataclass
class Strategies:
    """SpRAy's result for one class (see :func:`spray`).

    Attributes
    ----------
    clusters:
        (N,) each item's cluster, 0 .. k-1, numbered by size (0 the largest).
    coordinates:
        (N, 2) each item's place in the 2-D embedding (``embedding``).
    distances:
        (N,) each item's distance to its cluster's centre in the spectral embedding.
    eigenvalues:
        The smallest eigenvalues of the normalised Laplacian, ascending; the eigengap
        between the k-th and the (k+1)-th chose the number of clusters (when ``auto``).
    summaries:
        One :class:`StrategyCluster` per cluster, in cluster order.
    features:
        What was clustered: ``"maps"`` or ``"concepts"``.
    embedding:
        The 2-D embedding's method: ``"tsne"``, ``"umap"`` or ``"spectral"``.
    keys:
        What each item is (indices, or the run's rows as dicts), in item order.
    concept_names:
        For ``features="concepts"``: the name of each entry of the vectors.
    """

    clusters: np.ndarray
    coordinates: np.ndarray
    distances: np.ndarray
    eigenvalues: np.ndarray
    summaries: list[StrategyCluster]
    features: str = "maps"
    embedding: str = "tsne"
    keys: list = field(default_factory=list)
    concept_names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.clusters)

    @property
    def n_clusters(self) -> int:
        """The number of clusters."""
        return len(self.summaries)

    def purity(self, truth: Sequence[bool] | np.ndarray) -> tuple[float, float]:
        """Against a known split of the items (``truth``: True for, say, the images that
        carry a planted mark): (purity, recall). Purity: the share of items in the majority
        of their cluster (1.0 when no cluster mixes the two kinds); recall: the share of the
        True items that lie in clusters whose majority is True."""
        truth = np.asarray(truth, dtype=bool)
        if truth.shape != self.clusters.shape or not truth.any():
            raise ValueError("truth must hold one bool per item, some of them True")
        trues = np.bincount(self.clusters[truth], minlength=self.n_clusters)
        sizes = np.bincount(self.clusters, minlength=self.n_clusters)
        purity = np.maximum(trues, sizes - trues).sum() / len(truth)
        recall = trues[trues * 2 > sizes].sum() / truth.sum()
        return float(purity), float(recall)


def pooled_features(maps: torch.Tensor | np.ndarray | Sequence, grid: int = 32) -> np.ndarray:
    """(N, grid * grid) float64: each map (H, W) sum-pooled to ``grid`` x ``grid`` (area
    pooling, which is sum pooling up to a constant; maps of different sizes each pooled to
    the same grid, the side of the smallest map where that is smaller: no map is enlarged) and divided by its
    largest absolute value (an all-zero map stays zero), so that the clusters are about
    where the relevance lies, not how much of it there is."""
    if isinstance(maps, (torch.Tensor, np.ndarray)):
        items = [torch.as_tensor(np.asarray(maps) if isinstance(maps, np.ndarray) else maps)]
        if items[0].dim() != 3:
            raise ValueError(f"maps must be (N, H, W), got shape {tuple(items[0].shape)}")
    else:
        items = [torch.as_tensor(np.asarray(item))[None] for item in maps]
        if any(item.dim() != 3 for item in items):
            raise ValueError("each map must be (H, W)")
    side = min(grid, *(min(item.shape[-2:]) for item in items))
    pooled = torch.cat([F.interpolate(item.float()[:, None], size=(side, side), mode="area")[:, 0] for item in items])
    flat = pooled.flatten(1).double()
    scale = flat.abs().amax(dim=1, keepdim=True)
    return (flat / torch.where(scale > 0, scale, 1.0)).numpy()


def knn_affinity(features: np.ndarray, n_neighbors: int = 10) -> csr_matrix:
    """The symmetric k-nearest-neighbour affinity of ``features`` (N, D): 1 between an item
    and each of its ``n_neighbors`` nearest (Euclidean), then ``(A + Aᵀ) / 2`` (CoRelAy's
    ``SparseKNN``): 1 where both are among each other's neighbours, 0.5 where one is. On
    few items the neighbours are at most a quarter of them (at least 2), so that a strategy
    of a quarter of the items can stand apart (CoRelAy keeps 10, up to all items but one)."""
    neighbours = max(1, min(n_neighbors, max(2, len(features) // 4), len(features) - 1))
    graph = kneighbors_graph(features, neighbours, mode="connectivity", include_self=False)
    return ((graph + graph.T) / 2).tocsr()


#: Below this, an eigenvalue of the normalised Laplacian (whose values lie in [0, 2]) is one
#: of its zeros, which :func:`laplacian_eigenvalues` counts from the graph's components.
ZERO_EIGENVALUE = 1e-9


def laplacian_eigenvalues(affinity: csr_matrix, count: int, seed: int = 0) -> np.ndarray:
    """The ``count`` smallest eigenvalues of the symmetric normalised Laplacian of
    ``affinity``, ascending (scipy's ``eigsh`` in shift-invert mode, as scikit-learn's
    spectral embedding finds its eigenvectors; dense ``eigh`` for small graphs). The
    eigenvalue 0 has one copy per connected component of the graph, counted exactly
    (scipy's ``connected_components``): Lanczos iterations can miss copies of a repeated
    eigenvalue, and these are the ones the eigengap reads."""
    laplacian = csgraph.laplacian(affinity.astype(np.float64), normed=True)
    n = laplacian.shape[0]
    count = min(count, n)
    if n <= 200 or count >= n - 1:
        return np.clip(np.linalg.eigvalsh(laplacian.toarray())[:count], 0, None)
    components = min(int(csgraph.connected_components(affinity, directed=False, return_labels=False)), count)
    asked = min(count + components, n - 1)  # room for the non-zero values after the zeros it may miss
    start = np.random.default_rng(seed).uniform(-1, 1, n)
    values = np.clip(-eigsh(-laplacian, k=asked, sigma=1.0, which="LM", v0=start, return_eigenvectors=False), 0, None)
    nonzero = np.sort(values[values > ZERO_EIGENVALUE])  # the zeros, found or missed, counted exactly
    return np.concatenate([np.zeros(components), nonzero])[:count]


def eigengap_clusters(eigenvalues: np.ndarray, max_clusters: int) -> int:
    """The number of clusters by the eigengap heuristic: the k (1 .. ``max_clusters``) after
    which the gap between consecutive smallest eigenvalues, λ_{k+1} - λ_k, is largest (for
    k blocks without edges between them, the first k eigenvalues are 0 and the gap follows)."""
    values = np.sort(np.asarray(eigenvalues, dtype=np.float64))
    limit = min(max_clusters, len(values) - 1)
    if limit < 1:
        return 1
    gaps = np.diff(values[: limit + 1])
    return int(np.argmax(gaps)) + 1


def spray(
    features: np.ndarray,
    *,
    n_clusters: int | str = "auto",
    max_clusters: int = 8,
    n_neighbors: int = 10,
    seed: int = 0,
    embedding: str = "auto",
    probabilities: Sequence[float] | np.ndarray | None = None,
    mistakes: Sequence[bool | None] | np.ndarray | None = None,
    n_nearest: int = 5,
    prototypes: np.ndarray | None = None,
) -> Strategies:
    """SpRAy (Lapuschkin et al., Nature Communications 2019) on normalised ``features`` (N, D):
    the module's steps 2 to 5 (:func:`~explain.analysis.clustering.pooled_features` makes them of maps; see
    :func:`explain.analysis.strategies` for maps, explanations and run folders).

    ``n_clusters``: ``"auto"`` (the eigengap among 1 .. ``max_clusters``) or a number.
    ``probabilities`` and ``mistakes`` (one per item, a mistake None where unknown) give each
    cluster its mean probability and share of mistakes. ``prototypes`` (N, ...) are what a
    cluster's prototype averages (by default the features). Deterministic given ``seed``.
    """
    features = np.asarray(features, dtype=np.float64)
    count = len(features)
    if count < MIN_ITEMS:
        raise ValueError(
            f"SpRAy needs at least {MIN_ITEMS} items of a class to cluster, got {count}: explain more images "
            "of the class"
        )
    clusters_wanted = _check_clusters(n_clusters, max_clusters, count)
    affinity = knn_affinity(features, n_neighbors)
    eigenvalues = laplacian_eigenvalues(affinity, min(count - 1, max(16, 2 * (max_clusters + 1))), seed)
    k = eigengap_clusters(eigenvalues, max_clusters) if clusters_wanted is None else clusters_wanted
    spectral = _spectral(affinity, max(k, 2), seed)
    labels, distances = _kmeans(spectral, k, seed)
    coordinates, method = embed_2d(spectral if k > 1 else features, embedding, seed)
    summaries = _summaries(
        labels, distances, prototypes if prototypes is not None else features, probabilities, mistakes, n_nearest
    )
    return Strategies(labels, coordinates, distances, eigenvalues, summaries, embedding=method)


def _check_clusters(n_clusters: int | str, max_clusters: int, count: int) -> int | None:
    if n_clusters == "auto":
        if isinstance(max_clusters, bool) or not isinstance(max_clusters, int) or max_clusters < 1:
            raise ValueError(f"max_clusters must be a positive int, got {max_clusters!r}")
        return None
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, int) or not 1 <= n_clusters < count:
        raise ValueError(
            f"n_clusters must be 'auto' or an int from 1 to the items less one ({count - 1}), got {n_clusters!r}"
        )
    return n_clusters


def _spectral(affinity: csr_matrix, components: int, seed: int) -> np.ndarray:
    """(N, components) scikit-learn's spectral embedding of the affinity (its first
    eigenvector kept, as the paper's k-means on the k smallest eigenvectors)."""
    with warnings.catch_warnings():  # a graph of disconnected blocks is the clearest case
        warnings.filterwarnings("ignore", message="Graph is not fully connected")
        return spectral_embedding(
            affinity, n_components=components, random_state=seed, drop_first=False, norm_laplacian=True
        )


def _kmeans(spectral: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels numbered by cluster size (0 the largest; ties by first member) and each item's
    distance to its centre."""
    fitted = KMeans(n_clusters=k, n_init=10, random_state=seed).fit(spectral[:, : max(k, 1)])
    raw = fitted.labels_
    sizes = np.bincount(raw, minlength=k)
    first = np.array([np.flatnonzero(raw == c)[0] if sizes[c] else len(raw) for c in range(k)])
    order = np.lexsort((first, -sizes))
    renumber = np.empty(k, dtype=np.int64)
    renumber[order] = np.arange(k)
    distances = np.linalg.norm(spectral[:, : max(k, 1)] - fitted.cluster_centers_[raw], axis=1)
    return renumber[raw], distances


def embed_2d(features: np.ndarray, method: str, seed: int) -> tuple[np.ndarray, str]:
    """(N, 2) coordinates for the picture and the method used: ``"auto"`` (t-SNE up to
    :data:`TSNE_LIMIT` items, else spectral), ``"tsne"`` (scikit-learn's
    t-SNE, PCA start, perplexity at most 30 and below a third of the items, 500 steps: half
    scikit-learn's default, enough for a picture and half the cost), ``"umap"``
    (where the ``umap`` package is installed; t-SNE otherwise) or ``"spectral"`` (the
    features' first two columns: the spectral embedding's, free)."""
    if method not in EMBEDDINGS:
        raise ValueError(f"embedding must be one of {', '.join(EMBEDDINGS)}, got {method!r}")
    if method == "auto":
        method = "tsne" if len(features) <= TSNE_LIMIT else "spectral"
    if method == "spectral" or len(features) < 4:
        padded = np.zeros((len(features), 2))
        padded[:, : min(2, features.shape[1])] = features[:, :2]
        return padded, "spectral"
    if method == "umap":
        try:
            import umap  # type: ignore[import-not-found]  # optional
        except ImportError:
            method = "tsne"
        else:
            neighbours = min(15, len(features) - 1)
            reducer = umap.UMAP(n_components=2, n_neighbors=neighbours, random_state=seed)
            return np.asarray(reducer.fit_transform(features), dtype=np.float64), "umap"
    perplexity = float(min(30.0, max(1.0, (len(features) - 1) / 3)))
    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", max_iter=500, random_state=seed)
    return np.asarray(tsne.fit_transform(features), dtype=np.float64), "tsne"


def _summaries(labels, distances, prototypes, probabilities, mistakes, n_nearest) -> list[StrategyCluster]:
    prototypes = np.asarray(prototypes)
    probability = None if probabilities is None else np.asarray(probabilities, dtype=np.float64)
    summaries = []
    for cluster in range(int(labels.max()) + 1):
        members = np.flatnonzero(labels == cluster)
        nearest = members[np.argsort(distances[members], kind="stable")][:n_nearest]
        mean = None
        if probability is not None and np.isfinite(probability[members]).any():
            mean = float(np.nanmean(probability[members]))
        share = None
        if mistakes is not None:
            known = [bool(mistakes[i]) for i in members if mistakes[i] is not None]
            share = float(np.mean(known)) if known else None
        prototype = prototypes[members].mean(axis=0)
        summaries.append(StrategyCluster(len(members), prototype, nearest.tolist(), mean, share))
    return summaries
