"""How far the map moves when the image moves a little: max- and average-sensitivity and
the local Lipschitz estimate, over noisy copies of the image."""

from __future__ import annotations

import torch
from torch import Tensor

from ...base import Explainer
from ...checks import checked_number, positive_int
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, pairs_of
from .neighbourhood import ball_noise, explained_neighbours

__all__ = ["local_lipschitz_estimate", "sensitivity"]


@with_pass_options
def sensitivity(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    radius: float = 0.2,
    n_samples: int = 10,
    normalise: bool = True,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Score:
    """Max-sensitivity (``values``) and average-sensitivity (``extra["average"]``): how far
    the map moves when the image moves a little (lower is better).

    Yeh et al., "On the (In)fidelity and Sensitivity of Explanations", NeurIPS 2019:
    SENS_MAX = max ||Phi(x + d) - Phi(x)|| and SENS_AVG = E ||Phi(x + d) - Phi(x)||, over
    ``n_samples`` draws of d uniform in [-radius, radius] per input value (the L-inf ball of
    the paper's Monte-Carlo estimate), Phi the map (``Explanation.maps``) of the same
    target, re-explained by ``explainer`` for every noisy copy, the norm Frobenius. With
    ``normalise`` each distance is divided by ||Phi(x)||, as Quantus does, so that methods
    whose maps differ in scale compare (the paper does not divide).

    ``explanation`` is the explainer's result for ``images`` (computed when not given).
    Noise is drawn from ``seed`` (None: the caller's random stream); draw ``s`` is the same
    for every image, so an image's score does not depend on its batch or position.
    """
    n_samples = positive_int("n_samples", n_samples)
    perturb = ball_noise(radius, "uniform", seed)
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    distances = torch.empty(len(pairs.targets), n_samples, device=pairs.images.device)

    def visit(part: slice, r: Tensor, neighbours: Tensor, again: Explanation) -> None:
        distances.view(-1)[part] = (again.maps - pairs.maps[r]).flatten(1).norm(dim=1)

    explained_neighbours(explainer, pairs, n_samples, perturb, batch_size, visit)
    if normalise:
        distances = distances / pairs.maps.flatten(1).norm(dim=1, keepdim=True).clamp_min(1e-12)
    return Score(
        metric="sensitivity",
        values=pairs.unflatten(distances.amax(1)),
        higher_is_better=False,
        extra={"average": pairs.unflatten(distances.mean(1))},
    )


@with_pass_options
def local_lipschitz_estimate(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    radius: float = 0.1,
    noise: str = "uniform",
    n_samples: int = 10,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Score:
    """Local Lipschitz estimate: the largest change of the map per change of the image in
    the image's neighbourhood (lower is better: the explanation is stable).

    Alvarez-Melis & Jaakkola, "On the Robustness of Interpretability Methods", ICML
    Workshop on Human Interpretability in Machine Learning 2018, and "Towards Robust
    Interpretability with Self-Explaining Neural Networks", NeurIPS 2018: the local
    Lipschitz constant of the explanation,
    L(x) = max over x' in B_radius(x) of ||Phi(x) - Phi(x')||_2 / ||x - x'||_2,
    Phi the map (``Explanation.maps``) of the same target, re-explained by ``explainer``
    at x', ||x - x'|| over every input value. The papers maximise over the ball; as
    Quantus (LocalLipschitzEstimate), this estimates the maximum by the largest ratio over
    ``n_samples`` random neighbours, a lower bound that grows with ``n_samples``.

    ``noise="uniform"`` draws x' uniform in the L-inf ball of ``radius`` around x (per
    input value, in the units of the model's input); ``"normal"`` adds Gaussian noise of
    standard deviation ``radius`` (Quantus's default, with 0.1 and 200 samples). The map
    is compared as the explainer scales it (Quantus divides each by the batch's largest
    value first: give it ``normalise=False``). Draw ``s`` depends only on ``seed`` and
    ``s``, so an image's score does not depend on its batch. ``extra["average"]`` holds
    the mean ratio over the draws.
    """
    radius = checked_number("radius", radius, positive=True)
    perturb = ball_noise(radius, noise, seed)
    n_samples = positive_int("n_samples", n_samples)
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    ratios = torch.empty(len(pairs.targets), n_samples, device=pairs.images.device)

    def visit(part: slice, r: Tensor, neighbours: Tensor, again: Explanation) -> None:
        moved = (neighbours - pairs.images[r]).flatten(1).float().norm(dim=1)
        ratios.view(-1)[part] = (again.maps - pairs.maps[r]).flatten(1).norm(dim=1) / moved

    explained_neighbours(explainer, pairs, n_samples, perturb, batch_size, visit)
    return Score(
        metric="local-lipschitz-estimate",
        values=pairs.unflatten(ratios.amax(1)),
        higher_is_better=False,
        extra={"average": pairs.unflatten(ratios.mean(1))},
    )
