"""ARCC: one number from three, the harmonic mean of a map's coherency (is it the same map
when explained again on the image masked by it?), its complexity (how much of the image it
covers) and ROAD (does the score follow it when pixels are removed and imputed?), as
pytorch-grad-cam's ``metrics.arcc`` computes them."""

from __future__ import annotations

import torch
from torch import Tensor

from ..base import Explainer
from ..checks import checked_number
from ..explanation import Explanation
from ..passes import Passes, with_pass_options
from .base import Pairs, Score, chunks, draws, explanation_batch, pairs_of, pearson, perturbed_scores
from .faithfulness.perturbing import baselines_for
from .imputation import noisy_linear_impute

__all__ = ["arcc", "coherency", "percentiles"]


def _coherency(explainer: Explainer, pairs: Pairs, baseline, batch_size: int | None) -> Tensor:
    """Pearson's correlation of each map with the map of its image masked by it, (M,)."""
    weights = pairs.maps.clamp(0, 1)[:, None]
    base = baselines_for(pairs, baseline)
    again = torch.empty_like(pairs.maps)
    with Passes(None, len(pairs.targets)) as passes:
        for part in chunks(len(pairs.targets), explanation_batch(batch_size, pairs.images.device)):
            masked = base[part] + weights[part] * (pairs.images[part] - base[part])
            again[part] = explainer(masked, pairs.targets[part]).maps.float()
            passes.advance(part.stop - part.start)
    return pearson(again.flatten(1), pairs.maps.flatten(1))


@with_pass_options
def coherency(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    baseline: str | float | Tensor = "zeros",
    batch_size: int | None = None,
) -> Score:
    """Coherency: how alike the map and the map of the image masked by it are, (rho + 1) / 2
    with rho their Pearson correlation (higher is better; 1 is the same map).

    Poppi, Cornia, Baraldi & Cucchiara, "Revisiting the Evaluation of Class Activation
    Mapping for Explainability: A Novel Metric and Experimental Analysis", CVPR Workshops
    2021, as pytorch-grad-cam's ``Coherency``: the image is masked by its map,
    x' = b + E (x - b) with E the map in [0, 1] (a signed map's positive part; values
    above 1 clipped) and b the ``baseline`` (zeros in the model's input space: x' = E x, as
    pytorch-grad-cam masks it), and explained again by ``explainer`` for the same target
    (``batch_size`` images a call). ``extra["correlation"]`` is rho; a constant map
    correlates 0.
    """
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    rho = _coherency(explainer, pairs, baseline, batch_size)
    return Score(
        metric="coherency",
        values=pairs.unflatten((rho + 1) / 2),
        higher_is_better=True,
        extra={"correlation": pairs.unflatten(rho)},
    )


def percentiles(values: Tensor, levels: Tensor) -> Tensor:
    """Each row's quantiles at ``levels`` (fractions in [0, 1]) with linear interpolation
    between the sorted values, numpy's default ``percentile``, (M, L); for any number of
    rows (``torch.quantile`` refuses inputs of more than 2^24 values).

    >>> values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]], dtype=torch.float64)
    >>> percentiles(values, torch.tensor([0.2, 0.5], dtype=torch.float64)).tolist()
    [[1.8, 3.0]]
    """
    ordered = values.sort(dim=1).values
    position = levels.to(ordered) * (ordered.shape[1] - 1)
    low = position.floor().long()
    high = (low + 1).clamp_max(ordered.shape[1] - 1)
    below, above = ordered[:, low], ordered[:, high]
    return below + (above - below) * (position - low.to(ordered))


def _percentile_road(
    model, pairs: Pairs, percentages: Tensor, *, noise: float, seed: int | None, batch_size, score
) -> tuple[Tensor, Tensor]:
    """The target's score with the pixels at or above each percentile of the map removed
    (MoRF), and with those at or below the mirrored one (LeRF), imputed: (M, P) each."""
    count = len(percentages)
    flat = pairs.maps.flatten(1).float()
    levels = (percentages.double() / 100).to(flat.device)
    # numpy's percentile (linear interpolation), of the map and of 1 - map, as pytorch-grad-cam thresholds.
    morf_cut = percentiles(flat.double(), levels)
    lerf_cut = percentiles((1 - flat).double(), levels)
    height, width = pairs.maps.shape[-2:]

    def perturb(rows: Tensor, columns: Tensor) -> Tensor:
        lerf, level = columns >= count, columns % count
        values = torch.where(lerf[:, None], 1 - flat[rows], flat[rows]).double()
        cut = torch.where(lerf, lerf_cut[rows, level], morf_cut[rows, level])
        removed = (values >= cut[:, None]).view(-1, height, width)
        out = noisy_linear_impute(pairs.images[rows], removed, noise=0.0)
        if noise > 0:
            drawn = draws(seed, columns.tolist(), pairs.images.shape[1:], pairs.images.device, normal=True)
            out = out + torch.where(removed[:, None], noise * drawn, 0.0).to(out.dtype)
        return out

    scores = perturbed_scores(
        model, pairs.images, pairs.targets, 2 * count, perturb, batch_size=batch_size, score=score
    )
    return scores[:, :count], scores[:, count:]


@with_pass_options
def arcc(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    percentages: tuple[float, ...] = (20, 40, 60, 80),
    noise: float = 0.01,
    score: str = "probability",
    baseline: str | float | Tensor = "zeros",
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Score:
    """ARCC: the harmonic mean of coherency, 1 - complexity and ROAD (higher is better).

    The metric of pytorch-grad-cam's ``metrics.arcc.ARCC`` (its docstring cites arXiv
    2605.14641 and calls it a geometric mean; it computes, and this is, the harmonic
    mean), built as Poppi et al.'s ADCC (CVPR Workshops 2021) with ROAD in place of
    Average Drop: ARCC = 3 / (1 / Coh + 1 / (1 - Com) + 1 / ROAD), each term with 1e-8
    added to it, where

    - Coh is :func:`coherency` ((rho + 1) / 2, one explanation of the masked image);
    - Com is the map's mean over pixels (its L1 norm over the number of pixels: 0 for an
      empty map, 1 for a full one), of the map in [0, 1] as coherency masks with it;
    - ROAD is pytorch-grad-cam's ``ROADCombined`` (Rong et al., ICML 2022) at the
      ``percentages``: for each p, the pixels at or above the map's p-th percentile are
      removed (most relevant first, MoRF) and, separately, those at or below its
      (100 - p)-th (LeRF), filled by noisy linear imputation with Gaussian noise of std
      ``noise``; ROAD = mean LeRF score - mean MoRF score (twice pytorch-grad-cam's
      ``ROADCombined``, as ARCC doubles it), clipped to [0, 1]. Thresholds on the map's
      values, so tied pixels go together (explain's :func:`~explain.metrics.road` removes
      exact counts, ties in raster order).

    The score is the target's softmax probability (``score="logit"``: its logit, as
    pytorch-grad-cam's ``ClassifierOutputTarget``; its ROAD then leaves [0, 1] and is
    clipped). The maps are expected in [0, 1], as CAMs give them. ``extra`` holds the three
    parts (``"coherency"``, ``"complexity"``, ``"road"``, each as ARCC uses it);
    ``curves`` the scores ``"morf"`` and ``"lerf"`` at each percentage (``steps``). Noise
    draw ``c`` depends on ``seed`` alone (pytorch-grad-cam draws from torch's global
    stream).

    Cost: one explanation and 2 x len(percentages) forwards (8) per image and target,
    with the imputation.
    """
    percentages_t = torch.as_tensor([float(p) for p in percentages])
    if percentages_t.numel() == 0 or not ((percentages_t > 0) & (percentages_t < 100)).all():
        raise ValueError(f"percentages must lie strictly between 0 and 100, got {list(percentages)}")
    noise = checked_number("noise", noise, positive=False)
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    coherent = (_coherency(explainer, pairs, baseline, batch_size) + 1) / 2
    complexity = pairs.maps.clamp(0, 1).flatten(1).mean(1)
    morf, lerf = _percentile_road(
        explainer.model, pairs, percentages_t, noise=noise, seed=seed, batch_size=None, score=score
    )
    road = (lerf.mean(1) - morf.mean(1)).clamp(0, 1)
    eps = 1e-8
    harmonic = 3 / (1 / (coherent + eps) + 1 / ((1 - complexity) + eps) + 1 / (road + eps))
    return Score(
        metric="arcc",
        values=pairs.unflatten(harmonic),
        higher_is_better=True,
        curves={"morf": pairs.unflatten(morf), "lerf": pairs.unflatten(lerf)},
        steps=percentages_t,
        extra={
            "coherency": pairs.unflatten(coherent),
            "complexity": pairs.unflatten(complexity),
            "road": pairs.unflatten(road),
        },
    )
