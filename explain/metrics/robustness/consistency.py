"""Consistency: do the images whose maps say the same get the same class? Across the
images of one call, each map discretised to a label."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...checks import positive_int
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, neighbour_agreement, pairs_of, top_classes

__all__ = ["consistency", "peak_cell"]


def peak_cell(maps: Tensor, grid: int) -> Tensor:
    """Each map's label: the cell of a ``grid`` x ``grid`` grid with the most relevance (the
    highest mean value; ties to the first in raster order), (M,) int64.

    >>> maps = torch.zeros(2, 4, 4); maps[0, 0, 3] = 1.0; maps[1, 3, 0] = 1.0
    >>> peak_cell(maps, 2).tolist()
    [1, 2]
    """
    cells = F.adaptive_avg_pool2d(maps[:, None].float(), grid).flatten(1)
    return cells.argmax(1)


@with_pass_options
def consistency(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    grid: int = 4,
    discretise: Callable[[Tensor], Tensor] | None = None,
    batch_size: int | None = None,
) -> Score:
    """Consistency: of the other images whose maps say the same as this one's, the share the
    model puts in the same class as this image (higher is better).

    Dasgupta, Frost & Moshkovitz, "Framework for Evaluating Faithfulness of Local
    Explanations", ICML 2022: the probability that two inputs with the same (discretised)
    explanation get the same prediction. A map is discretised to the cell of a ``grid`` x
    ``grid`` grid that holds the most relevance (``peak_cell`` in this module), or by ``discretise``,
    a function of the maps (M, H, W) that returns one label per map (M,). The class is the
    model's top class (one forward pass per image). ``extra["neighbours"]`` counts the
    images with the same label; an image with none scores NaN (Quantus: 0).

    The images of the call are the population: an image's value depends on the others (in
    ``explain evaluate``, those of its batch); the other targets of the same image
    (``topk``) are not its neighbours. Quantus's Consistency discretises by the signs of
    the first five values of the flattened map (``top_n_sign``; on maps of magnitudes,
    whether the top-left five pixels are zero), which says little about an image's map;
    pass ``discretise=`` for it. Quantus declares lower as better; the paper's probability
    (and this value) is better higher.
    """
    pairs = pairs_of(model, images, explanation, targets)
    if discretise is None:
        labels = peak_cell(pairs.maps, positive_int("grid", grid))
    elif callable(discretise):
        labels = torch.as_tensor(discretise(pairs.maps), device=pairs.maps.device)
        if labels.shape != pairs.targets.shape:
            raise ValueError(
                f"discretise must return one label per map, shape {tuple(pairs.targets.shape)}; "
                f"got {tuple(labels.shape)}"
            )
    else:
        raise TypeError(f"discretise must be a function of the maps (M, H, W), got {type(discretise).__name__}")
    classes = top_classes(model, pairs.images[:: pairs.per_image], batch_size=batch_size)
    share, count = neighbour_agreement(labels[:, None] == labels[None, :], pairs, classes)
    return Score(
        metric="consistency",
        values=pairs.unflatten(share),
        higher_is_better=True,
        extra={"neighbours": pairs.unflatten(count.float())},
    )
