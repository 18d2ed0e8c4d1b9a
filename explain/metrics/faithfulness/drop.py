"""Average Drop, Increase in Confidence and Average Gain: the class probability of the image
masked by its own map, against the image's."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, batch_size_for, batched_scores, chunks, pairs_of
from .perturbing import baselines_for

__all__ = ["MASKS", "average_drop", "masks_of"]

#: How a map becomes the mask the image is multiplied by.
MASKS = ("clip", "minmax")


def masks_of(maps: Tensor, mask: str) -> Tensor:
    """The maps (M, H, W) as masks in [0, 1]: ``"clip"`` clips them to [0, 1]; ``"minmax"``
    scales the map's magnitude by its own minimum and maximum (xplique's ``_perturb_with_mask``, whose
    1e-8 in the denominator this keeps).

    >>> masks_of(torch.tensor([[[-2.0, 0.5], [1.5, 0.0]]]), "clip").tolist()
    [[[0.0, 0.5], [1.0, 0.0]]]
    """
    if mask == "clip":
        return maps.clamp(0, 1)
    if mask == "minmax":
        magnitude = maps.abs().flatten(1)
        low, high = magnitude.amin(1, keepdim=True), magnitude.amax(1, keepdim=True)
        return ((magnitude - low) / (high - low + 1e-8)).view_as(maps)
    raise ValueError(f"unknown mask {mask!r}; use one of {', '.join(MASKS)}")


@with_pass_options
def average_drop(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    baseline: str | float | Tensor = "zeros",
    mask: str = "clip",
    batch_size: int | None = None,
) -> Score:
    """Average Drop (lower is better), with Increase in Confidence and Average Gain.

    The image is masked by its map, ``x' = b + E * (x - b)`` with ``E`` the map in [0, 1]
    (``mask="clip"``: the map as it is, a signed map's positive part, values above 1
    clipped; ``"minmax"``: the map's magnitude scaled to [0, 1] by its own minimum and maximum, as
    xplique masks) and ``b`` the ``baseline`` (zeros in the model's input space, so
    ``x' = E * x`` as in the papers). With ``Y`` and ``O`` the explained class's softmax
    probability for ``x`` and ``x'``, per image:

    - Average Drop = 100 * max(0, Y - O) / Y, and
    - Increase in Confidence = 100 * [Y < O] (Chattopadhay et al., "Grad-CAM++", WACV 2018);
    - Average Gain = 100 * max(0, O - Y) / (1 - Y) (Zhang et al., "Opti-CAM", 2023).

    ``values`` holds the drop; ``extra`` holds ``"increase"``, ``"gain"``, the two
    probabilities and ``"change"`` = O - Y. Their means over images are the papers'
    figures (in percent).

    The anchors: xplique 1.5's AverageDropMetric, AverageIncreaseMetric and
    AverageGainMetric compute the same three as fractions (divide by 100), with 1e-8 added
    to Y and to 1 - Y, on the mask ``"minmax"`` (for a CAM in [0, 1] that reaches 0 and 1,
    the same as ``"clip"``), and on the model's raw output unless given
    ``activation="softmax"``. pytorch-grad-cam's IncreaseInConfidence is [O > Y] (0 or 1);
    its DropInConfidence is max(0, Y - O), not divided by Y (``max(0, -change)``), both on
    what its target returns (the logit for ``ClassifierOutputTarget``, the probability
    for ``ClassifierOutputSoftmaxTarget``), the input multiplied by the CAM as here.

    >>> import math
    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2, 2, bias=False))
    >>> with torch.no_grad():
    ...     _ = model[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    >>> image = torch.full((1, 1, 1, 2), math.log(3.0))   # p(class 0) = 3 / 4
    >>> result = average_drop(model, image, torch.tensor([[[0.0, 1.0]]]), torch.tensor([0]))
    >>> round(result.values.item(), 4), result.extra["increase"].item()   # O = 1/2: a third lost
    (33.3333, 0.0)
    """
    pairs = pairs_of(model, images, explanation, targets)
    weights = masks_of(pairs.maps, mask)[:, None]
    base = baselines_for(pairs, baseline)
    masked = base + weights * (pairs.images - base)
    m = len(pairs.targets)
    both = torch.cat([pairs.images, masked])
    labels = torch.cat([pairs.targets, pairs.targets])
    batches = ((both[s], labels[s]) for s in chunks(2 * m, batch_size_for(batch_size, model, both, 2 * m)))
    scores = batched_scores(model, batches, "probability", 2 * m)
    y, o = scores[:m], scores[m:]
    drop = 100 * (y - o).clamp_min(0) / y.clamp_min(1e-12)
    increase = 100 * (y < o).float()
    gain = 100 * (o - y).clamp_min(0) / (1 - y).clamp_min(1e-12)
    return Score(
        metric="average-drop",
        values=pairs.unflatten(drop),
        higher_is_better=False,
        extra={
            "increase": pairs.unflatten(increase),
            "gain": pairs.unflatten(gain),
            "probability": pairs.unflatten(y),
            "masked_probability": pairs.unflatten(o),
            "change": pairs.unflatten(o - y),
        },
    )
