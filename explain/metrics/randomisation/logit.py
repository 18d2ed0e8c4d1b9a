"""The random logit test: does the map change when another class is explained?"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ...base import Explainer
from ...explanation import Explanation
from ...hooks import preserved_state
from ...passes import Passes, with_pass_options
from ..base import Score, explanation_batch, pairs_of
from .cascade import explain_again
from .similarity import spearman, ssim

__all__ = ["random_logit"]


@with_pass_options
def random_logit(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    seed: int = 42,
    batch_size: int | None = None,
) -> Score:
    """Random logit test: the SSIM between the map of the explained class and the map of
    a random other class (lower is better).

    Sixt, Granz & Landgraf, "When Explanations Lie: Why Many Modified BP Attributions
    Fail", ICML 2020. The other class is drawn uniformly from the classes other than the
    target with numpy's ``RandomState(seed)``, as Quantus draws it. The SSIM is of the 2-D
    maps, as in the paper; Quantus's RandomLogit computes it over the flattened maps (a
    1-D signal), which is why its numbers differ. ``extra["spearman"]`` holds the rank
    correlation too.
    """
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    logits = (
        explanation.logits if isinstance(explanation, Explanation) and isinstance(explanation.logits, Tensor) else None
    )
    if logits is None:
        with preserved_state(explainer.model), torch.inference_mode():
            logits = explainer.model(images[:1])
    classes = logits.shape[-1]
    if classes < 2:
        raise ValueError("the random logit test needs a model with at least two classes")
    k = pairs.per_image
    offsets = torch.as_tensor(
        np.random.RandomState(seed).randint(0, classes - 1, len(pairs.targets) // k), device=pairs.targets.device
    ).repeat_interleave(k)
    others = offsets + (offsets >= pairs.targets).long()
    with Passes(None, len(pairs.images)):
        again = explain_again(explainer, pairs.images, others, explanation_batch(batch_size, pairs.images.device))
    return Score(
        metric="random-logit",
        values=pairs.unflatten(ssim(pairs.maps, again)),
        higher_is_better=False,
        extra={"spearman": pairs.unflatten(spearman(pairs.maps, again)), "class": pairs.unflatten(others.float())},
    )
