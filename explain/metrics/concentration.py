"""Complexity: how concentrated is the map? Measures of the map alone; no model pass."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import checked_number
from ..explanation import Explanation
from ..passes import with_pass_options
from .base import Score, check_finite

__all__ = ["complexity", "effective_complexity", "sparseness"]


def _magnitudes(explanation: Explanation | Tensor) -> tuple[Tensor, tuple[int, ...]]:
    maps = explanation.maps if isinstance(explanation, Explanation) else torch.as_tensor(explanation)
    if maps.dim() not in (3, 4):
        raise ValueError(f"maps must be (N, H, W) or (N, k, H, W), got {tuple(maps.shape)}")
    return check_finite(maps.reshape(-1, maps.shape[-2] * maps.shape[-1]).abs().double()), tuple(maps.shape[:-2])


@with_pass_options
def sparseness(explanation: Explanation | Tensor) -> Score:
    """Sparseness: the Gini index of the map's magnitudes, 0 for a flat map and near 1 when
    one pixel holds everything (higher is sparser).

    Chalasani et al., "Concise Explanations of Neural Networks using Adversarial
    Training", ICML 2020: with ``|a|`` sorted ascending, a_(1) <= ... <= a_(d),
    G = sum_k (2k - d - 1) a_(k) / (d sum_k a_(k)). An all-zero map scores 0. (Quantus
    adds 1e-7 to every value first; the difference is below 1e-6 for maps in [0, 1].)

    >>> sparseness(torch.tensor([[[0.0, 0.0], [0.0, 1.0]]])).values.item()
    0.75
    >>> sparseness(torch.ones(1, 2, 2)).values.item()
    0.0
    """
    magnitudes, shape = _magnitudes(explanation)
    d = magnitudes.shape[1]
    ordered = magnitudes.sort(dim=1).values
    k = torch.arange(1, d + 1, device=ordered.device, dtype=ordered.dtype)
    total = ordered.sum(1)
    gini = torch.where(total > 0, ((2 * k - d - 1) * ordered).sum(1) / (d * total.clamp_min(1e-300)), 0.0)
    return Score("sparseness", gini.float().reshape(shape), higher_is_better=True)


@with_pass_options
def complexity(explanation: Explanation | Tensor) -> Score:
    """Complexity: the entropy (natural log) of the map's magnitudes taken as a
    distribution over pixels; lower means fewer pixels carry the explanation.

    Bhatt, Weller & Moura, "Evaluating and Aggregating Feature-based Model Explanations",
    IJCAI 2020: ``P(i) = |a_i| / sum_j |a_j|``, complexity = -sum_i P(i) ln P(i). An all-zero
    map scores 0.

    >>> round(complexity(torch.ones(1, 2, 2)).values.item(), 4)   # ln 4
    1.3863
    """
    magnitudes, shape = _magnitudes(explanation)
    total = magnitudes.sum(1, keepdim=True)
    p = magnitudes / total.clamp_min(1e-300)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(1)
    return Score("complexity", entropy.float().reshape(shape), higher_is_better=False)


@with_pass_options
def effective_complexity(explanation: Explanation | Tensor, *, eps: float = 1e-5) -> Score:
    """Effective complexity: the number of pixels whose relevance matters, ``|a_i|`` above
    ``eps`` times the map's largest magnitude (lower is better: fewer pixels explain).

    Nguyen & Rodriguez Martinez, "On Quantitative Aspects of Model Interpretability", arXiv
    2007.07584 (2020). ``extra["share"]`` is the count over the number of pixels. An
    all-zero map scores 0. (Quantus's EffectiveComplexity scales every map by the largest
    magnitude of the whole batch, not its own, so that a map's count depends on the
    others: the same where every map has the same largest magnitude, as CAMs scaled to
    [0, 1] have.)

    >>> effective_complexity(torch.tensor([[[1.0, 0.5], [1e-7, 0.0]]])).values.item()
    2.0
    """
    eps = checked_number("eps", eps, positive=False)
    magnitudes, shape = _magnitudes(explanation)
    largest = magnitudes.amax(1, keepdim=True)
    count = ((magnitudes > eps * largest) & (largest > 0)).sum(1).float()
    return Score(
        "effective-complexity",
        count.reshape(shape),
        higher_is_better=False,
        extra={"share": (count / magnitudes.shape[1]).reshape(shape)},
    )
