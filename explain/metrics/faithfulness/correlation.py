"""Does the map's relevance of a part of the image go with the score's drop when that part
alone is removed? Faithfulness correlation (random subsets of pixels) and faithfulness
estimate (the map's ranked groups of pixels), both Pearson correlations per image."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...checks import positive_int
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, pairs_of, pearson
from .perturbing import (
    baselines_for,
    group_drops,
    group_sums,
    random_subsets,
    ranked_groups,
    removal_effects,
    step_pixels,
)

__all__ = ["faithfulness_correlation", "faithfulness_estimate"]


@with_pass_options
def faithfulness_correlation(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    subset: int | float = 224,
    n_runs: int = 100,
    baseline: str | float | Tensor = "zeros",
    batch_size: int | None = None,
    score: str = "logit",
    seed: int | None = 0,
) -> Score:
    """Faithfulness correlation: the Pearson correlation, over random subsets of pixels,
    between the map's sum over a subset and the score's drop when the subset is set to the
    baseline (higher is better).

    Bhatt, Weller & Moura, "Evaluating and Aggregating Feature-based Model Explanations",
    IJCAI 2020: mu_F = corr_S (sum_{i in S} g(f, x)_i, f(x) - f(x_[x_S = x_bar_S])) over
    random subsets S of a fixed size. Each of ``n_runs`` subsets holds ``subset`` pixels (a
    number, or a fraction of the image; default 224, Quantus's default count) drawn
    uniformly, all channels set to the ``baseline`` (zeros in the model's input space); f is
    the class's logit (``score``). A constant map correlates 0.

    The subsets depend only on ``seed``: every image gets the same ones, whatever its
    batch. (Quantus draws single channel values, not pixels, from numpy's global stream.)
    """
    pairs = pairs_of(model, images, explanation, targets)
    n_runs = positive_int("n_runs", n_runs)
    height, width = pairs.images.shape[-2:]
    count = min(step_pixels(subset, height, width), height * width)
    counts = torch.full((n_runs,), count)
    masks = random_subsets(seed, list(range(n_runs)), counts, height, width, pairs.images.device)
    sums, drops = removal_effects(
        model, pairs, masks, baselines_for(pairs, baseline), batch_size=batch_size, score=score
    )
    return Score(metric="faithfulness-correlation", values=pairs.unflatten(pearson(sums, drops)), higher_is_better=True)


@with_pass_options
def faithfulness_estimate(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    step: int | float = 0.01,
    baseline: str | float | Tensor = "zeros",
    batch_size: int | None = None,
    score: str = "probability",
) -> Score:
    """Faithfulness estimate: the Pearson correlation between the map's relevance of each
    group of pixels and the drop in the class's probability when that group alone is
    removed (higher is better).

    Alvarez-Melis & Jaakkola, "Towards Robust Interpretability with Self-Explaining Neural
    Networks", NeurIPS 2018: features are removed one at a time and the
    correlation between their relevance and the probability drops they cause estimates
    faithfulness. Here a feature is a group of ``step`` pixels (a number, or a fraction of
    the image: 1 %, 100 groups) of consecutive rank in the map's order, all channels set to
    the ``baseline`` (zeros in the model's input space); its relevance is the map's sum over
    it. ``score="logit"`` reads the logit (Quantus's default) instead of the probability.
    """
    pairs = pairs_of(model, images, explanation, targets)
    groups, count = ranked_groups(pairs.maps, step)
    intact, scores = group_drops(
        model, pairs, groups, count, baselines_for(pairs, baseline), batch_size=batch_size, score=score
    )
    drops = intact[:, None] - scores[..., 0]
    relevance = group_sums(pairs.maps, groups, count)
    return Score(
        metric="faithfulness-estimate", values=pairs.unflatten(pearson(relevance, drops)), higher_is_better=True
    )
