"""How alike two maps are (Spearman's rank correlation, SSIM), and how complex one map is
(the entropy of its histogram): what the randomisation tests measure."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["histogram_entropy", "rank_maps", "spearman", "ssim"]


def rank_maps(maps: Tensor) -> np.ndarray:
    """Each map's pixels ranked (:func:`scipy.stats.rankdata`, ties given their mean rank),
    centred: (M, H*W) float64. Ranking is most of Spearman's cost, so a map compared many
    times (the original, in the cascade) is ranked once."""
    from scipy.stats import rankdata

    ranks = rankdata(maps.flatten(1).double().cpu().numpy(), axis=1)
    return ranks - ranks.mean(axis=1, keepdims=True)


def spearman(a: Tensor | np.ndarray, b: Tensor) -> Tensor:
    """Spearman's rank correlation of each pair of maps (M, H, W): the Pearson correlation
    of their ranks, ties given their mean rank (as :func:`scipy.stats.spearmanr`); 0 where
    either map is constant (it has no ranking to correlate). ``a`` may be given already
    ranked by :func:`rank_maps`.

    >>> spearman(torch.tensor([[[1.0, 2.0, 3.0]]]), torch.tensor([[[1.0, 5.0, 9.0]]])).item()
    1.0
    """
    x = a if isinstance(a, np.ndarray) else rank_maps(a)
    y = rank_maps(b)
    norms = np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))
    correlation = np.divide((x * y).sum(axis=1), norms, out=np.zeros(len(x)), where=norms > 0)
    return torch.tensor(correlation, dtype=torch.float32, device=b.device)


def ssim(a: Tensor, b: Tensor) -> Tensor:
    """Structural similarity of each pair of 2-D maps (M, H, W) (Wang et al., IEEE TIP 2004,
    scikit-image's 7 x 7 window, or the largest odd window that fits a smaller map), the
    data range taken from both maps together.

    >>> x = torch.rand(1, 16, 16)
    >>> round(ssim(x, x).item(), 6)
    1.0
    """
    from skimage.metrics import structural_similarity

    window = min(7, 2 * ((min(a.shape[-2:]) - 1) // 2) + 1)
    if window < 3:
        raise ValueError(f"SSIM needs maps of at least 3 x 3 pixels, got {tuple(a.shape[-2:])}")
    out = []
    for x, y in zip(a.double().cpu().numpy(), b.double().cpu().numpy(), strict=True):
        low, high = min(x.min(), y.min()), max(x.max(), y.max())
        span = high - low
        out.append(1.0 if span == 0 else float(structural_similarity(x, y, data_range=span, win_size=window)))
    return torch.tensor(out, dtype=torch.float32, device=a.device)


def _histogram_bins(values: Tensor, bins: int) -> Tensor:
    """The bin of each value of each row of ``values`` (M, P), float32, among ``bins``
    equal bins from the row's minimum to its maximum, the last bin closed: the bins of
    :func:`numpy.histogram` (its float32 arithmetic and edge corrections, so that values on
    an edge fall in the same bin), a constant row's range widened by 0.5 on each side."""
    low, high = values.amin(1, keepdim=True), values.amax(1, keepdim=True)
    constant = low == high
    low, high = torch.where(constant, low - 0.5, low), torch.where(constant, high + 0.5, high)
    span = high - low
    edges = torch.arange(bins + 1, dtype=values.dtype, device=values.device) * (span / bins) + low
    edges[:, -1:] = high
    index = ((values - low) / span * bins).long()
    index = index - (index == bins).long()
    index = index - (values < edges.gather(1, index)).long()
    return index + ((values >= edges.gather(1, index + 1)) & (index != bins - 1)).long()


def histogram_entropy(maps: Tensor, bins: int = 100) -> Tensor:
    """The Shannon entropy (natural log) of each map's histogram of ``bins`` equal bins
    over its range, (M,): a map spread over many values is complex, one of a few values
    simple (0 for a constant map). As Quantus's ``discrete_entropy``
    (``scipy.stats.entropy(np.histogram(map, bins))``), in torch on the maps' device.

    >>> histogram_entropy(torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]), bins=10).tolist()
    [0.6931471805599453, 0.0]
    """
    values = maps.flatten(1).float()
    index = _histogram_bins(values, bins)
    counts = torch.zeros(len(values), bins, dtype=torch.float64, device=maps.device)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=torch.float64))
    share = counts / counts.sum(1, keepdim=True)
    return 0.0 - torch.where(share > 0, share * share.log(), 0.0).sum(1)  # 0.0 -: no -0.0
