"""Total-order Sobol indices of a function of d inputs in [0, 1], as CRAFT estimates its
concepts' importance (Fel et al., "CRAFT: Concept Recursive Activation FacTorization for
Explainability", CVPR 2023, sec. 3.2, following their "Look at the Variance! Efficient
Black-box Explanations with Sobol-based Sensitivity Analysis", NeurIPS 2021).

The designs are a quasi-Monte-Carlo sequence (scipy's Sobol sequence, :class:`scipy.stats.qmc.Sobol`,
scrambled by a seed) of 2d dimensions split into two matrices A and B (n x d each), and for each
input i the matrix C_i: A with its column i taken from B (Saltelli's scheme). With f the
function's outputs on those rows, the total-order index of input i is Jansen's estimator

    S_Ti = mean_j (f(A)_j - f(C_i)_j)^2 / (2 Var[f(A), f(B)])

the share of the output's variance that input i takes part in, alone or with others (the
indices of a function with interactions sum to more than 1).

>>> masks = sobol_designs(2, 64, seed=0)                 # (64 * (2 + 2), 2)
>>> outputs = 3 * masks[:, 0] + masks[:, 1]              # Var: 9/12 and 1/12
>>> [round(v, 2) for v in jansen_total_indices(outputs, 2).tolist()]
[0.91, 0.1]
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import qmc
from torch import Tensor

from ..checks import positive_int

__all__ = ["jansen_total_indices", "sobol_designs"]


def sobol_designs(dimensions: int, designs: int, *, seed: int = 0) -> Tensor:
    """(designs * (dimensions + 2), dimensions) float32 masks in [0, 1]: the rows A, then B,
    then C_1 .. C_d (A with column i from B), ``designs`` rows each.

    ``designs`` is rounded up to a power of two (the balance of a Sobol sequence).
    Deterministic given ``seed`` (the scrambling's)."""
    dimensions = positive_int("dimensions", dimensions)
    designs = positive_int("designs", designs)
    power = max(int(np.ceil(np.log2(designs))), 1)
    sampler = qmc.Sobol(2 * dimensions, scramble=True, seed=np.random.default_rng(seed))
    samples = torch.from_numpy(sampler.random_base2(power)).float()
    a, b = samples[:, :dimensions], samples[:, dimensions:]
    c = a[None].repeat(dimensions, 1, 1)
    for i in range(dimensions):
        c[i, :, i] = b[:, i]
    return torch.cat([a, b, c.reshape(-1, dimensions)])


def jansen_total_indices(outputs: Tensor, dimensions: int) -> Tensor:
    """(dimensions,) the total-order Sobol indices from the function's ``outputs`` on the rows
    of :func:`sobol_designs` (in its order); zeros where the outputs do not vary.

    Jansen's estimator, S_Ti = mean((f(A) - f(C_i))²) / (2 Var f): the variance of f(A) and
    f(B) pooled, as Saltelli et al. (2010) do (xplique's ``JansenEstimator`` takes f(A)'s
    alone: the same limit, per-image values a little apart on few designs)."""
    outputs = torch.as_tensor(outputs).double().flatten()
    if len(outputs) % (dimensions + 2):
        raise ValueError(
            f"got {len(outputs)} outputs for {dimensions} dimensions: pass the outputs on all the rows of "
            f"sobol_designs({dimensions}, designs), a multiple of {dimensions + 2}"
        )
    n = len(outputs) // (dimensions + 2)
    f_a, f_b = outputs[:n], outputs[n : 2 * n]
    f_c = outputs[2 * n :].view(dimensions, n)
    variance = torch.cat([f_a, f_b]).var()
    # the outputs' spread against their size (both in the outputs' units)
    if not torch.isfinite(variance) or float(variance.sqrt()) <= 1e-6 * max(float(outputs.abs().max()), 1e-30):
        return torch.zeros(dimensions)
    return (((f_a[None] - f_c) ** 2).mean(dim=1) / (2 * variance)).float()
