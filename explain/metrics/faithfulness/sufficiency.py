"""Sufficiency: do the images whose maps look alike get the same class? Across the images
of one call, the maps compared by their standardised distance."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...checks import checked_number
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, neighbour_agreement, pairs_of, top_classes

__all__ = ["standardised_distances", "sufficiency"]


def standardised_distances(rows: Tensor) -> Tensor:
    """The standardised Euclidean distance between every two rows of ``rows`` (M, D), each
    column divided by its variance over the rows (SciPy's ``seuclidean`` with its default
    variances), in float64. A column that does not vary adds nothing (SciPy would divide
    0 by 0); with one row, every distance is 0.

    >>> standardised_distances(torch.tensor([[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]]))[0].tolist()
    [0.0, 1.0, 2.0]
    """
    rows = rows.double()
    if len(rows) < 2:
        return rows.new_zeros(len(rows), len(rows))
    variance = rows.var(0)
    scale = torch.where(variance > 0, variance.clamp_min(1e-300).rsqrt(), 0.0)
    return torch.cdist(rows * scale, rows * scale)


@with_pass_options
def sufficiency(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    threshold: float = 0.6,
    batch_size: int | None = None,
) -> Score:
    """Sufficiency: of the other images whose maps are close to this one's, the share the
    model puts in the same class as this image (higher is better: the explanation is
    sufficient for the decision).

    Dasgupta, Frost & Moshkovitz, "Framework for Evaluating Faithfulness of Local
    Explanations", ICML 2022, as Quantus's Sufficiency measures "the explanation applies
    to another image": the maps' magnitudes ``|a|`` are compared by their standardised
    Euclidean distance (each pixel divided by its variance over the maps of the call),
    the distances divided by their largest, and another image's map applies when its
    distance is at most ``threshold``. The class is the model's top class (one forward
    pass per image). ``extra["neighbours"]`` counts the close maps; an image with none
    scores NaN (Quantus: 0).

    The images of the call are the population: an image's value depends on the others
    (in ``explain evaluate``, those of its batch). The other targets of the same image
    (``topk``) are not its neighbours. A pixel that no map varies adds nothing to a
    distance (SciPy's ``seuclidean``, which Quantus uses, makes every distance NaN).
    """
    pairs = pairs_of(model, images, explanation, targets)
    threshold = checked_number("threshold", threshold, positive=False)
    distances = standardised_distances(pairs.maps.flatten(1).abs())
    largest = distances.max() if distances.numel() else distances.new_zeros(())
    if largest > 0:
        distances = distances / largest
    classes = top_classes(model, pairs.images[:: pairs.per_image], batch_size=batch_size)
    share, count = neighbour_agreement(distances <= threshold, pairs, classes)
    return Score(
        metric="sufficiency",
        values=pairs.unflatten(share),
        higher_is_better=True,
        extra={"neighbours": pairs.unflatten(count.float())},
    )
