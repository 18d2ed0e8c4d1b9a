"""Does the score follow the map's order? Monotonicity (the score never falls as pixels are
added from the least relevant on) and monotonicity correlation (a group of pixels' relevance
against how much noise on it moves the score)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...checks import positive_int
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, draws, pairs_of, perturbation_curve, ranks
from ..randomisation import spearman
from .perturbing import baselines_for, group_drops, group_sums, ranked_groups, step_pixels

__all__ = ["monotonicity", "monotonicity_correlation"]


@with_pass_options
def monotonicity(
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
    """Monotonicity: 1 where the class's probability never falls as the image's pixels are
    put back onto the baseline, least relevant first, else 0 (higher is better).

    Arya et al., "One Explanation Does Not Fit All: A Toolkit and Taxonomy of AI
    Explainability Techniques", arXiv 2019 (AIX360's ``monotonicity_metric``; Luss et al.
    2019): starting from the ``baseline`` (zeros in the model's input space), features are
    added in increasing order of relevance, and adding more positive evidence should never
    lower the probability. A feature here is ``step`` pixels (all channels; a number, or a
    fraction of the image: 1 %, 100 steps). ``curves["monotonicity"]`` holds the probability
    after each step (as AIX360, from the first addition to the whole image); ``extra
    ["non_decreasing"]`` the share of steps that do not lower it. (Quantus orders by the
    map's magnitude by default, ``abs=True``; the paper by its signed value, as here.)
    """
    pairs = pairs_of(model, images, explanation, targets)
    height, width = pairs.images.shape[-2:]
    per_step = step_pixels(step, height, width)
    pixels = height * width
    counts = torch.clamp(torch.arange(1, -(-pixels // per_step) + 1) * per_step, max=pixels)
    keys = ranks(pairs.maps, descending=False)
    start = baselines_for(pairs, baseline)
    curve = perturbation_curve(
        model, start, pairs.targets, keys, counts, pairs.images, batch_size=batch_size, score=score
    )
    rising = curve.diff(dim=1) >= 0
    return Score(
        metric="monotonicity",
        values=pairs.unflatten(rising.all(1).float()),
        higher_is_better=True,
        curves={"monotonicity": pairs.unflatten(curve)},
        steps=counts.float() / pixels,
        extra={"non_decreasing": pairs.unflatten(rising.float().mean(1) if rising.shape[1] else rising.all(1).float())},
    )


@with_pass_options
def monotonicity_correlation(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    step: int | float = 0.02,
    n_samples: int = 10,
    batch_size: int | None = None,
    score: str = "probability",
    seed: int | None = 0,
) -> Score:
    """Monotonicity correlation: the Spearman correlation between the relevance of each group
    of pixels and how far the class's score moves when the group is replaced by noise
    (higher is better).

    Nguyen & Martinez, "On quantitative aspects of model interpretability", arXiv 2020
    (their monotonicity): a feature's attribution magnitude should rank as the effect of
    not knowing it, E[(f(x) - f(x'))^2] over replacements x' of the feature drawn from a
    uniform prior. A feature here is a group of ``step`` pixels (a number, or a fraction of
    the image: 2 %, 50 groups) of consecutive rank by the map's magnitude; its relevance is
    the sum of the magnitudes, and each of ``n_samples`` replacements draws every value of
    the group (all channels) uniformly within the image's range. f is the class's
    probability (``score="logit"`` for the logit). (Quantus fills a group with one uniform value in [0, 1) per image and
    divides the variance by f(x)^2, which leaves the ranking unchanged.)

    The noise depends only on ``seed``: every image gets the same draws, scaled to its range.
    """
    pairs = pairs_of(model, images, explanation, targets)
    n_samples = positive_int("n_samples", n_samples)
    magnitudes = pairs.maps.abs()
    groups, count = ranked_groups(magnitudes, step, descending=False)
    low = pairs.images.amin((1, 2, 3), keepdim=True)
    span = pairs.images.amax((1, 2, 3), keepdim=True) - low

    def noise(rows: Tensor, group: Tensor, sample: Tensor) -> Tensor:
        indices = (group * n_samples + sample).clamp_min(0).tolist()
        uniform = draws(seed, indices, pairs.images.shape[1:], pairs.images.device)
        return low[rows] + span[rows] * uniform

    intact, scores = group_drops(
        model, pairs, groups, count, noise, repeats=n_samples, batch_size=batch_size, score=score
    )
    variance = (scores.double() - intact.double()[:, None, None]).square().mean(2)
    relevance = group_sums(magnitudes, groups, count)
    return Score(
        metric="monotonicity-correlation",
        values=pairs.unflatten(spearman(relevance, variance)),
        higher_is_better=True,
    )
