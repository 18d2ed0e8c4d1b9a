"""Robustness: does the map stay put when the input barely changes?"""

from __future__ import annotations

import torch
from torch import Tensor

from ..base import Explainer
from ..checks import checked_number, positive_int
from ..explanation import Explanation
from ..passes import Passes, with_pass_options
from .base import Score, chunks, draws, explanation_batch, pairs_of

__all__ = ["sensitivity"]


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
    radius = checked_number("radius", radius, positive=False)
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    m = len(pairs.targets)
    distances = torch.empty(m, n_samples, device=pairs.images.device)
    rows = torch.arange(m, device=pairs.images.device).repeat_interleave(n_samples)
    with Passes(None, m * n_samples) as explained:
        for part in chunks(m * n_samples, explanation_batch(batch_size, pairs.images.device)):
            r = rows[part]
            samples = [i % n_samples for i in range(part.start, part.stop)]
            noise = (draws(seed, samples, pairs.images.shape[1:], pairs.images.device) * 2 - 1) * radius
            again = explainer(pairs.images[r] + noise, pairs.targets[r]).maps
            difference = (again - pairs.maps[r]).flatten(1).norm(dim=1)
            distances.view(-1)[part] = difference
            explained.advance(len(r))
    if normalise:
        distances = distances / pairs.maps.flatten(1).norm(dim=1, keepdim=True).clamp_min(1e-12)
    return Score(
        metric="sensitivity",
        values=pairs.unflatten(distances.amax(1)),
        higher_is_better=False,
        extra={"average": pairs.unflatten(distances.mean(1))},
    )
