"""Metrics by name, for ``explain evaluate`` and other callers that pick them at run time."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from ..base import Explainer
from ..explanation import Explanation
from . import axiomatic, compactness, concentration, faithfulness, localisation, randomisation, robustness
from .arcc import arcc
from .base import Score
from .focus import focus

__all__ = ["METRICS", "Metric", "columns", "compute", "metric", "metric_names"]


@dataclass(frozen=True)
class Metric:
    """A metric as ``explain evaluate`` runs it.

    ``needs`` says what the function takes first: ``"model"`` (model, images, explanation),
    ``"explainer"`` (explainer, images, explanation: it explains again), ``"regions"``
    (explanation, regions) or ``"map"`` (explanation). ``columns`` names the numbers it
    reports: column name -> (the ``Score.extra`` key, or None for ``values``; whether
    higher is better).
    """

    name: str
    function: Callable[..., Score]
    needs: str
    columns: dict[str, tuple[str | None, bool | None]]
    #: Model passes per image and target with the defaults, as the table in docs/guide/metrics.md says.
    cost: str

    @property
    def description(self) -> str:
        return (self.function.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")


def _metric(name, function, needs, cost, higher_is_better, **extra_columns) -> Metric:
    return Metric(name, function, needs, {name: (None, higher_is_better), **extra_columns}, cost)


#: Every metric by name, each a :class:`Metric`, in the order :func:`metric_names` lists them.
METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        _metric("deletion", faithfulness.deletion, "model", "H+1 forwards (225 at 224 px)", False),
        _metric("insertion", faithfulness.insertion, "model", "H+1 forwards", True),
        _metric(
            "average-drop",
            faithfulness.average_drop,
            "model",
            "2 forwards",
            False,
            **{"increase-in-confidence": ("increase", True), "average-gain": ("gain", True)},
        ),
        _metric(
            "road",
            faithfulness.road,
            "model",
            "18 forwards + imputation",
            True,
            **{"road-morf": ("morf", False), "road-lerf": ("lerf", True)},
        ),
        _metric("pixel-flipping", faithfulness.pixel_flipping, "model", "101 forwards", False),
        _metric("region-perturbation", faithfulness.region_perturbation, "model", "101 forwards", True),
        _metric("irof", faithfulness.irof, "model", "one forward per superpixel (~100) + SLIC", True),
        _metric("selectivity", faithfulness.selectivity, "model", "one forward per 16 px patch + 1 (197)", False),
        _metric("infidelity", faithfulness.infidelity, "model", "101 forwards", False),
        _metric("sensitivity-n", faithfulness.sensitivity_n, "model", "201 forwards", True),
        _metric("faithfulness-correlation", faithfulness.faithfulness_correlation, "model", "101 forwards", True),
        _metric("faithfulness-estimate", faithfulness.faithfulness_estimate, "model", "101 forwards", True),
        _metric("monotonicity", faithfulness.monotonicity, "model", "100 forwards", True),
        _metric("monotonicity-correlation", faithfulness.monotonicity_correlation, "model", "501 forwards", True),
        _metric(
            "sic",
            faithfulness.pic,
            "model",
            "15 forwards + 14 interpolations and WebP encodings",
            True,
            aic=("aic", True),
        ),
        _metric("sufficiency", faithfulness.sufficiency, "model", "1 forward", True),
        _metric(
            "arcc",
            arcc,
            "explainer",
            "1 explanation + 8 forwards + imputation",
            True,
            **{
                "arcc-coherency": ("coherency", True),
                "arcc-complexity": ("complexity", False),
                "arcc-road": ("road", True),
            },
        ),
        _metric(
            "completeness",
            axiomatic.completeness,
            "model",
            "2 forwards",
            False,
            **{"completeness-met": ("complete", True)},
        ),
        _metric(
            "non-sensitivity",
            axiomatic.non_sensitivity,
            "model",
            "one forward per run of a row's worth of pixels + 1 (~225 at 224 px)",
            False,
        ),
        _metric("input-invariance", axiomatic.input_invariance, "explainer", "1 explanation + 2 forwards", True),
        _metric(
            "sensitivity",
            robustness.sensitivity,
            "explainer",
            "10 explanations",
            False,
            **{"avg-sensitivity": ("average", False)},
        ),
        _metric("local-lipschitz-estimate", robustness.local_lipschitz_estimate, "explainer", "10 explanations", False),
        _metric("continuity", robustness.continuity, "explainer", "27 explanations (28 shifts at 224 px)", False),
        _metric("relative-input-stability", robustness.relative_input_stability, "explainer", "10 explanations", False),
        _metric(
            "relative-output-stability", robustness.relative_output_stability, "explainer", "10 explanations", False
        ),
        _metric(
            "relative-representation-stability",
            robustness.relative_representation_stability,
            "explainer",
            "10 explanations + 11 forwards",
            False,
        ),
        _metric("consistency", robustness.consistency, "model", "1 forward", True),
        _metric(
            "randomisation",
            randomisation.model_randomisation,
            "explainer",
            "up to 10 explanations",
            False,
            **{"randomisation-ssim": ("ssim", False)},
        ),
        _metric(
            "smooth-randomisation",
            randomisation.smooth_model_randomisation,
            "explainer",
            "up to 10 x 50 + 50 explanations",
            False,
        ),
        _metric(
            "efficient-randomisation", randomisation.efficient_model_randomisation, "explainer", "1 explanation", True
        ),
        _metric("random-logit", randomisation.random_logit, "explainer", "1 explanation", False),
        _metric("pointing-game", localisation.pointing_game, "regions", "none", True),
        _metric("relevance-mass", localisation.relevance_mass, "regions", "none", True),
        _metric("relevance-rank", localisation.relevance_rank, "regions", "none", True),
        _metric("energy-pointing-game", localisation.energy_pointing_game, "regions", "none", True),
        _metric("top-k-intersection", localisation.top_k_intersection, "regions", "none", True),
        _metric("auc", localisation.auc, "regions", "none", True),
        _metric("attribution-localisation", localisation.attribution_localisation, "regions", "none", True),
        _metric("focus", focus, "explainer", "1 explanation (of a mosaic) + 1 forward", True),
        _metric("sparseness", concentration.sparseness, "map", "none", True),
        _metric("complexity", concentration.complexity, "map", "none", False),
        _metric("effective-complexity", concentration.effective_complexity, "map", "none", False),
        _metric("mst-c", compactness.mst_c, "map", "none (0.1-0.5 s of CPU per 224 px map)", True),
    ]
}


def metric_names() -> list[str]:
    """The names :func:`compute` takes.

    >>> metric_names()[:3]
    ['deletion', 'insertion', 'average-drop']
    """
    return list(METRICS)


def metric(name: str) -> Metric:
    """The metric called ``name`` (case and underscores ignored); an unknown name raises
    ``ValueError`` listing the known ones."""
    key = name.strip().lower().replace("_", "-")
    if key not in METRICS:
        close = difflib.get_close_matches(key, list(METRICS), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"unknown metric {name!r}; {hint}known metrics: {', '.join(METRICS)}")
    return METRICS[key]


def compute(
    name: str,
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation,
    *,
    regions: Tensor | None = None,
    **options,
) -> Score:
    """Run the metric called ``name`` on ``explanation`` (the result of ``explainer`` on
    ``images``), with ``options`` for the metric's function.

    >>> import explain, torch, torchvision
    >>> model = torchvision.models.resnet18().eval()
    >>> images = torch.rand(1, 3, 32, 32)
    >>> cam = explain.GradCAM(model)
    >>> compute("sparseness", cam, images, cam(images)).values.shape
    torch.Size([1])
    """
    spec = metric(name)
    if spec.needs == "model":
        return spec.function(explainer.model, images, explanation, **options)
    if spec.needs == "explainer":
        return spec.function(explainer, images, explanation, **options)
    if spec.needs == "regions":
        if regions is None:
            raise ValueError(f"{spec.name} needs the objects' regions: pass regions= (boxes (N, 4) or masks (N, H, W))")
        return spec.function(explanation, regions, **options)
    return spec.function(explanation, **options)


def columns(name: str, score: Score) -> dict[str, tuple[Tensor, bool | None]]:
    """The numbers ``name`` reports, by column name: (per-target values, higher is better)."""
    spec = metric(name)
    return {
        column: (score.values if key is None else score.extra[key], higher)
        for column, (key, higher) in spec.columns.items()
    }
