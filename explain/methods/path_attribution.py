"""Path attributions: the gradient of the explained score integrated along a path from a
reference input to the image.

- :class:`IntegratedGradients`: the straight line from a baseline, through captum;
- :class:`GuidedIG`: an adaptive path that moves the features of smallest gradient first
  (Kapishnikov et al., CVPR 2021);
- :class:`BlurIG`: the path from a blurred image through decreasing Gaussian blur
  (Xu et al., CVPR 2020).

Guided IG and Blur IG follow Google PAIR's ``saliency`` package (the authors' code), which
their tests check them against; every point of their paths is a row of an inner batch of at
most ``internal_batch_size`` rows (by default sized from the memory budget), and the
images of a batch share those passes.
"""

from __future__ import annotations

import math

import captum.attr as captum_attr
import torch
from torch import Tensor, nn

from ..base import register
from ..baselines import gaussian_filter
from ..checks import checked_number, positive_int
from ..passes import advance
from .attribution_base import Batched, ScoredModel, WithBaseline, attribute_in_groups

__all__ = ["QUADRATURES", "BlurIG", "GuidedIG", "IntegratedGradients", "score_gradients"]

#: captum's quadratures for Integrated Gradients.
QUADRATURES = ("gausslegendre", "riemann_trapezoid", "riemann_left", "riemann_right", "riemann_middle")


def score_gradients(scored: ScoredModel, points: Tensor, owners: Tensor, k: int, rows: int) -> Tensor:
    """dS/dx at each of ``points`` (P, C, H, W), S the score of explained target ``k`` of image
    ``owners[p]``, in inner batches of ``rows`` rows; in the dtype of ``points``."""
    gradients = []
    dtype = scored.dtype or points.dtype
    for start in range(0, len(points), rows):
        chunk = points[start : start + rows].detach().to(dtype).requires_grad_(True)
        advance(len(chunk))
        scores = scored.explained_scores(scored.model(chunk), k, owners[start : start + rows])
        (gradient,) = torch.autograd.grad(scores.sum(), chunk)
        gradients.append(gradient.to(points.dtype))
    return torch.cat(gradients)


@register
class IntegratedGradients(WithBaseline):
    """Integrated Gradients: the gradient integrated along a path from a baseline.

    (x - x') * the integral over a in [0, 1] of dS/dx at x' + a (x - x'), baseline x'.

    Sundararajan et al., "Axiomatic Attribution for Deep Networks", ICML 2017, eq. 1. The
    attributions sum to S(x) - S(x') (completeness) up to the error of the ``n_steps``-point
    quadrature (``method``, captum's, Gauss-Legendre by default). The default baseline,
    zeros in the model's input space, is the dataset's mean colour for normalised inputs;
    ``baseline="blur"`` or ``"noise"`` selects the others (:func:`~explain.baselines.make_baselines`). Steps
    run in internal batches of ``internal_batch_size`` rows.
    """

    name = "ig"
    formula = "(x - x') ⊙ ∫ dS/dx along x' → x, {n_steps:code}"
    runs_on = "captum `IntegratedGradients`"
    family = "gradient attribution"
    cost = "1 forward + {n_steps} forward + backward"

    def __init__(self, model: nn.Module, *, n_steps: int = 50, method: str = "gausslegendre", **options):
        super().__init__(model, **options)
        self.n_steps = positive_int("n_steps", n_steps)
        if method not in QUADRATURES:
            raise ValueError(f"unknown method {method!r}; use one of {', '.join(QUADRATURES)}")
        self.method = method

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_steps)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        rows = self.rows(images, len(images) * self.n_steps)
        baselines, target = self.baselines(scored, images), scored.target(k)
        integrated = captum_attr.IntegratedGradients(scored)
        # captum runs at least all the images it is given in each pass: fewer rows than
        # images, the images go in groups of ``rows``.
        groups = [slice(i, i + rows) for i in range(0, len(images), rows)]
        return attribute_in_groups(
            integrated,
            images,
            baselines,
            target,
            groups,
            n_steps=self.n_steps,
            method=self.method,
            internal_batch_size=rows,
        )


def _lower_quantile(values: Tensor, fraction: float) -> Tensor:
    """numpy's ``quantile(values, fraction, method="lower")`` of all of ``values``."""
    flat = values.flatten()
    return flat.kthvalue(math.floor(fraction * (len(flat) - 1)) + 1).values


def guided_ig_step(
    x: Tensor, path: tuple[Tensor, Tensor], gradient: Tensor, alpha: float, max_dist: float, fraction: float
) -> tuple[Tensor, Tensor]:
    """One step of Guided IG's path (Kapishnikov et al. 2021, Algorithm 1, as PAIR's
    ``guided_ig_impl``) for one image: the point ``x`` moved from the baseline towards the
    input (``path``) until its L1 distance to the input is ``1 - alpha`` of the whole, the
    features of smallest ``|gradient|`` first, none more than ``max_dist`` (in alpha) off the
    straight line; returns the new point and the step's attribution, gradient * change."""
    start, end = path
    span = end - start
    low, high = start + span * max(alpha - max_dist, 0.0), start + span * min(alpha + max_dist, 1.0)
    target_l1 = float((end - start).abs().sum()) * (1.0 - alpha)
    attribution = torch.zeros_like(x)
    selectable = gradient.clone()
    while True:
        before = x
        along = torch.where(span != 0, (x - start) / torch.where(span != 0, span, 1.0), min(alpha + max_dist, 1.0))
        x = torch.where(along < max(alpha - max_dist, 0.0), low, x)  # those left behind catch up
        current_l1 = float((x - end).abs().sum())
        if math.isclose(target_l1, current_l1, rel_tol=1e-9, abs_tol=1e-9):
            return x, attribution + (x - before) * gradient
        selectable[x == high] = math.inf  # at the edge of the band: not selected again
        magnitude = selectable.abs()
        chosen = (magnitude <= _lower_quantile(magnitude, fraction)) & (selectable != math.inf)
        if not bool(chosen.any()):  # every feature at the edge of the band: the step is as far as it goes
            return x, attribution + (x - before) * gradient
        reducible = float(((x - high).abs() * chosen).sum())
        gamma = (current_l1 - target_l1) / reducible if reducible > 0 else math.inf
        x = torch.where(chosen, high if gamma > 1.0 else x + (high - x) * gamma, x)
        attribution = attribution + (x - before) * gradient
        if gamma <= 1.0:
            return x, attribution


@register
class GuidedIG(WithBaseline):
    """Guided Integrated Gradients: IG along an adaptive path that moves the features of
    smallest gradient first.

    At each of ``steps`` steps, the ``fraction`` of features with the smallest ``|dS/dx|`` move
    towards the input until the path has covered the step's share of the L1 distance, no
    feature straying more than ``max_dist`` from the straight line; the attribution is the
    sum of gradient times change.

    Kapishnikov et al., "Guided Integrated Gradients: an Adaptive Path Method for Removing
    Noise", CVPR 2021, Algorithm 1; its defaults (200 steps, fraction 0.25, max_dist 0.02)
    and numbers as Google PAIR's ``saliency`` package, computed in float64. The baseline
    defaults to zeros in the model's input space. One gradient pass per step, all images in
    it (inner batches of ``internal_batch_size`` rows).
    """

    name = "guidedig"
    formula = (
        "IG along an adaptive path: the features of smallest |dS/dx| move first ({steps:code}, "
        "{fraction:code}, {max_dist:code})"
    )
    runs_on = "explain (PAIR `saliency`'s numbers)"
    family = "gradient attribution"
    cost = "1 forward + {steps} forward + backward"

    def __init__(
        self, model: nn.Module, *, steps: int = 200, fraction: float = 0.25, max_dist: float = 0.02, **options
    ):
        super().__init__(model, **options)
        self.steps = positive_int("steps", steps)
        self.fraction = checked_number("fraction", fraction, positive=False)
        self.max_dist = checked_number("max_dist", max_dist, positive=False)
        if self.fraction > 1 or self.max_dist > 1:
            raise ValueError(f"fraction and max_dist must lie in [0, 1], got {fraction!r} and {max_dist!r}")

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.steps)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        end, start = images.double(), self.baselines(scored, images).double()
        x, attribution = start.clone(), torch.zeros_like(end)
        moving = [i for i in range(len(images)) if bool((end[i] != start[i]).any())]  # else: zero attribution
        owners = torch.tensor(moving, device=images.device, dtype=torch.long)
        rows = self.rows(images, len(moving))
        for step in range(self.steps if moving else 0):
            gradients = score_gradients(scored, x[moving], owners, k, rows)
            for gradient, i in zip(gradients, moving, strict=True):
                x[i], change = guided_ig_step(
                    x[i], (start[i], end[i]), gradient, (step + 1) / self.steps, self.max_dist, self.fraction
                )
                attribution[i] += change
        return attribution.to(images.dtype)


@register
class BlurIG(Batched):
    """Blur IG: the gradient integrated along a path from a blurred image to the image.

    The path runs through the image under Gaussian blur of decreasing sigma, from
    ``max_sigma`` to 0, in ``steps`` equal steps; the attribution is minus the Riemann sum of
    dS/dx times the blur's derivative in sigma (a finite difference over ``grad_step``).

    Xu et al., "Attribution in Scale and Space", CVPR 2020, eq. 4; the sum, its defaults
    (max_sigma 50, 100 steps, grad_step 0.01) and the blur (zero padding beyond the image,
    kernel radius 4 sigma) as Google PAIR's ``saliency`` package, in float64. Steps run in
    inner batches of ``internal_batch_size`` rows, the images of a batch together.
    """

    name = "blurig"
    formula = "IG along a path of decreasing Gaussian blur ({max_sigma:code}, {steps:code})"
    runs_on = "explain (PAIR `saliency`'s numbers)"
    family = "gradient attribution"
    images_only = "its path blurs the two spatial axes of an image"
    cost = "1 forward + {steps} forward + backward"

    def __init__(
        self, model: nn.Module, *, max_sigma: float = 50.0, steps: int = 100, grad_step: float = 0.01, **options
    ):
        super().__init__(model, **options)
        self.max_sigma = checked_number("max_sigma", max_sigma, positive=True)
        self.steps = positive_int("steps", steps)
        self.grad_step = checked_number("grad_step", grad_step, positive=True)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.steps)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        sigmas = [i * self.max_sigma / self.steps for i in range(self.steps + 1)]
        rows = self.rows(images, len(images) * self.steps)
        pairs = [(i, step) for i in range(len(images)) for step in range(self.steps)]
        pixels = images.double()
        attribution = torch.zeros_like(pixels)
        for start in range(0, len(pairs), rows):
            batch = pairs[start : start + rows]
            points = torch.cat([gaussian_filter(pixels[i : i + 1], sigmas[step]) for i, step in batch])
            owners = torch.tensor([i for i, _ in batch], device=images.device)
            gradients = score_gradients(scored, points, owners, k, rows)
            for (i, step), point, gradient in zip(batch, points, gradients, strict=True):
                derivative = (gaussian_filter(pixels[i : i + 1], sigmas[step] + self.grad_step)[0] - point) / (
                    self.grad_step
                )
                attribution[i] -= (sigmas[step + 1] - sigmas[step]) * derivative * gradient
        return attribution.to(images.dtype)
