"""ROAD: the class probability with a share of the pixels removed and filled in from their
neighbours, most relevant first and least relevant first."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...checks import checked_number
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, draws, pairs_of, perturbation_curve, probability_and_hit, ranks

__all__ = ["road"]


def _road_fractions(percentages) -> Tensor:
    """ROAD's percentages as a tensor, each strictly between 0 and 100."""
    fractions = torch.as_tensor([float(p) for p in percentages])
    if fractions.numel() == 0 or not ((fractions > 0) & (fractions < 100)).all():
        raise ValueError(f"percentages must lie strictly between 0 and 100, got {list(percentages)}")
    return fractions


def _road_imputer(order: int, noise: float, seed: int | None):
    """The fill for one ROAD curve (``order`` 0 for MoRF, 1 for LeRF): noisy linear
    imputation, the noise at each step drawn from ``seed`` alone."""
    from ..imputation import noisy_linear_impute

    def fill(batch: Tensor, removed: Tensor, rows: Tensor, steps: Tensor) -> Tensor:
        out = noisy_linear_impute(batch, removed, noise=0.0)
        if noise > 0:
            indices = [2 * step + order for step in steps.tolist()]
            out = out + torch.where(
                removed[:, None], noise * draws(seed, indices, batch.shape[1:], batch.device, normal=True), 0.0
            )
        return out

    return fill


@with_pass_options
def road(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    percentages: tuple[float, ...] = (10, 20, 30, 40, 50, 60, 70, 80, 90),
    noise: float = 0.01,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Score:
    """ROAD: RemOve And Debias. The explained class's probability once a percentage of the
    pixels is removed, most relevant first (MoRF, lower is better) and least relevant first
    (LeRF, higher is better), the removed pixels imputed so that their shape does not leak.

    Rong et al., "A Consistent and Efficient Evaluation Strategy for Attribution Methods",
    ICML 2022. Removed pixels (all channels) are filled by noisy linear imputation
    (``explain.metrics.imputation.noisy_linear_impute``: each the weighted mean of its
    eight neighbours, plus Gaussian noise of std ``noise``), at the paper's 10 % ... 90 %.

    ``values`` is the gap between the curves' means, LeRF minus MoRF (higher is better: the
    map ranks pixels the model needs first and pixels it ignores last). ``curves`` holds
    ``"morf"`` and ``"lerf"`` (the probability) and ``"morf_accuracy"`` and
    ``"lerf_accuracy"`` (1 where the target is still the top class: the paper's
    accuracy, averaged over images); ``extra`` holds each curve's mean. The noise at each
    percentage depends only on ``seed``, so an image's result does not depend on its batch.
    """
    pairs = pairs_of(model, images, explanation, targets)
    noise = checked_number("noise", noise, positive=False)
    fractions = _road_fractions(percentages)
    height, width = pairs.images.shape[-2:]
    counts = (fractions / 100 * height * width).long()
    curves = {}
    for order, name in enumerate(("morf", "lerf")):
        keys = ranks(pairs.maps, descending=(name == "morf"))
        read = perturbation_curve(
            model,
            pairs.images,
            pairs.targets,
            keys,
            counts,
            _road_imputer(order, noise, seed),
            batch_size=batch_size,
            score=probability_and_hit,
        )
        curves[name], curves[f"{name}_accuracy"] = read.unbind(-1)
    extra = {name: pairs.unflatten(curve.mean(1)) for name, curve in curves.items()}
    gap = curves["lerf"].mean(1) - curves["morf"].mean(1)
    return Score(
        metric="road",
        values=pairs.unflatten(gap),
        higher_is_better=True,
        curves={name: pairs.unflatten(curve) for name, curve in curves.items()},
        steps=fractions,
        extra=extra,
    )
