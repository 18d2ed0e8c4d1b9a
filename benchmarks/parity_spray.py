"""explain.analysis's SpRAy against CoRelAy's SpRAy pipeline, on the same normalised maps.

    pip install --target /tmp/corelay --no-deps corelay metrohash h5py
    PYTHONPATH=/tmp/corelay .venv/bin/python benchmarks/parity_spray.py

CoRelAy's ``corelay.pipeline.spectral.SpectralClustering`` steps with their defaults (``SciPyPDist``
Euclidean distances, ``SparseKNN(n_neighbors=10, symmetric=True)``, ``SymmetricNormalLaplacian``,
``EigenDecomposition(n_eigval=32)``) and ``KMeans(n_clusters=k)`` with k the number
explain's eigengap chose, on the same features (maps sum-pooled and normalised by
:func:`explain.analysis.clustering.pooled_features`, CoRelAy's ``preprocessing`` being the
user's). Compared, on three planted strategies of synthetic maps and on LRP's maps of the
shortcut benchmark's triangles (half of them marked):

- the affinity: explain's ``knn_affinity`` against CoRelAy's ``SparseKNN`` of the distance
  matrix (the same edges: the largest absolute difference);
- the 32 smallest eigenvalues of the normalised Laplacian (CoRelAy: one minus the largest
  of D^-1/2 A D^-1/2; explain: scipy's ``eigsh`` on the Laplacian): the largest difference;
- the clusters: the adjusted Rand index between the two partitions (1.0: the same), and
  each one's against the truth.

explain never imports corelay.
"""

from __future__ import annotations

import numpy as np
import torch
from corelay.pipeline.spectral import SpectralEmbedding
from corelay.processor.affinity import SparseKNN
from corelay.processor.clustering import KMeans
from corelay.processor.distance import SciPyPDist
from sklearn.metrics import adjusted_rand_score

import explain
from explain.analysis import knn_affinity, laplacian_eigenvalues, spray
from explain.analysis.clustering import pooled_features
from explain.data import SHORTCUT_CLASS, load_shortcut_model, shortcut_dataset


def planted(count: int = 60, size: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    generator = torch.Generator().manual_seed(seed)
    truth = np.arange(count) % 3
    places = torch.tensor([(6.0, 6.0), (6.0, size - 6.0), (size - 6.0, size / 2)])
    centres = places[truth] + 3 * (torch.rand(count, 2, generator=generator) - 0.5)
    grid = torch.arange(size, dtype=torch.float32)
    dy = (grid[None, :, None] - centres[:, 0, None, None]) ** 2
    dx = (grid[None, None, :] - centres[:, 1, None, None]) ** 2
    maps = torch.exp(-(dy + dx) / 18) + 0.1 * torch.rand(count, size, size, generator=generator)
    return pooled_features(maps, 16), truth


def shortcut() -> tuple[np.ndarray, np.ndarray]:
    data = shortcut_dataset(192, seed=5, mark_rate=0.5)
    keep = data.labels == SHORTCUT_CLASS
    maps = explain.explainer("lrp", load_shortcut_model())(data.inputs[keep], targets=SHORTCUT_CLASS).maps
    return pooled_features(maps, 32), data.marked[keep].numpy()


def compare(name: str, features: np.ndarray, truth: np.ndarray) -> None:
    ours = spray(features, embedding="spectral")
    k = ours.n_clusters
    theirs_affinity = SparseKNN(n_neighbors=10, symmetric=True)(SciPyPDist(metric="euclidean")(features))
    affinity_gap = abs(knn_affinity(features, 10) - theirs_affinity).max()
    # the pipeline's output is its embedding's (eigenvalues, eigenvectors); its clustering
    # step (select_eigenvector: x[1], then KMeans) applied as it does
    eigenvalues, eigenvectors = SpectralEmbedding()(features)
    kmeans = KMeans(n_clusters=k, kwargs={"random_state": 0, "n_init": 10})
    labels = kmeans(eigenvectors)  # CoRelAy's default: all 32 eigenvectors
    order = np.argsort(eigenvalues)
    first_k = kmeans(eigenvectors[:, order[:k]])  # the k smallest only, as explain
    ours_values = laplacian_eigenvalues(knn_affinity(features, 10), 32)
    eigen_gap = np.abs(np.sort(eigenvalues)[: k + 1] - ours_values[: k + 1]).max()
    print(f"{name}: {len(features)} items, {k} clusters (eigengap); affinity max |diff| {affinity_gap:.2g}; "
          f"the {k + 1} smallest eigenvalues max |diff| {eigen_gap:.2g}; ARI against the truth: explain "
          f"{adjusted_rand_score(ours.clusters, truth):.3f}, CoRelAy on its 32 eigenvectors "
          f"{adjusted_rand_score(labels, truth):.3f}, on the {k} smallest "
          f"{adjusted_rand_score(first_k, truth):.3f}; explain vs CoRelAy on the {k} smallest "
          f"{adjusted_rand_score(ours.clusters, first_k):.3f}")


if __name__ == "__main__":
    compare("planted (3 strategies)", *planted())
    compare("shortcut triangles (LRP)", *shortcut())
