"""Scoring a batch: each method explains the images once, then every metric runs on that
explanation through :func:`explain.metrics.compute`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from ..base import Explainer
from ..explanation import Explanation
from ..methods import BaseCAM, explain_together
from ..metrics.registry import columns, compute, metric

__all__ = ["Evaluation", "evaluate", "explain_each", "score"]


@dataclass
class Evaluation:
    """What :func:`evaluate` (or :func:`score`) found for a batch of N images.

    ``rows``: one dict per image, method, target and metric column: ``image`` (its index in
    the batch), ``method``, ``rank`` (the target's position among the image's targets: 0,
    or 0..k-1 with ``topk``), ``target_id``, ``metric`` (the column, as
    :func:`explain.metrics.registry.columns` names it: ``road-morf``), ``value`` (a float,
    NaN where the metric has none).

    ``curves``: one dict per image, method, target and curve: ``image``, ``method``,
    ``rank``, ``target_id``, ``metric`` (the metric's name), ``curve`` (the name in
    ``Score.curves``), ``steps`` and ``values`` (1-D arrays), ``step_labels``.

    ``failures``: one dict per method and metric that raised: ``method``, ``metric``
    (``None`` when the explainer itself failed, so every metric of that method is lost),
    ``error``. A failure applies to every image of the batch.
    """

    rows: list[dict] = field(default_factory=list)
    curves: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)

    def mean_curves(self) -> dict:
        """Each method's mean curve per metric and curve: :func:`~explain.evaluation.mean_curves`."""
        from .plots import mean_curves

        return mean_curves(self.curves)

    def extend(self, other: Evaluation) -> Evaluation:
        self.rows += other.rows
        self.curves += other.curves
        self.failures += other.failures
        return self


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def explain_each(
    explainers: Sequence[Explainer], images: Tensor, targets=None, *, topk: int | None = None
) -> list[Explanation | Exception]:
    """Each explainer's result for ``images``, or the exception it raised. CAMs share one
    pass (:func:`explain.explain_together`); where that fails, each runs alone, so that the
    error lands on the method that causes it."""
    shared = [e for e in explainers if isinstance(e, BaseCAM)]
    outcome: dict[int, Explanation | Exception] = {}
    with suppress(Exception):
        outcome.update(zip(map(id, shared), explain_together(shared, images, targets, topk=topk), strict=True))
    for explainer in explainers:
        if id(explainer) not in outcome:
            try:
                outcome[id(explainer)] = explainer(images, targets, topk=topk)
            except Exception as error:
                outcome[id(explainer)] = error
    return [outcome[id(e)] for e in explainers]


def score(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation,
    metrics: Sequence[str],
    *,
    regions: Tensor | None = None,
    options: Mapping[str, Mapping] | None = None,
    method: str | None = None,
) -> Evaluation:
    """Run ``metrics`` (names) on ``explanation``, ``explainer``'s result for ``images``.

    ``regions`` go to the localisation metrics (boxes (N, 4) or masks (N, H, W)),
    ``options[name]`` to the metric called ``name`` as keywords. A metric that raises is
    recorded in ``failures`` and the others still run.
    """
    method = method or explanation.method
    options = {metric(name).name: dict(given) for name, given in (options or {}).items()}
    result = Evaluation()
    n = len(images)
    ids = explanation.targets.reshape(n, -1).cpu().tolist()
    for name in dict.fromkeys(metric(name).name for name in metrics):
        try:
            found = compute(name, explainer, images, explanation, regions=regions, **options.get(name, {}))
            reported = columns(name, found)
        except Exception as error:
            result.failures.append({"method": method, "metric": name, "error": _reason(error)})
            continue
        for column, (values, _) in reported.items():
            array = values.detach().float().reshape(n, -1).cpu().numpy()
            result.rows += [
                {
                    "image": i,
                    "method": method,
                    "rank": r,
                    "target_id": ids[i][r],
                    "metric": column,
                    "value": float(array[i, r]),
                }
                for i in range(n)
                for r in range(array.shape[1])
            ]
        steps = None if found.steps is None else found.steps.detach().float().cpu().numpy()
        for curve, values in found.curves.items():
            flat = values.detach().float().cpu().numpy()
            points = flat.reshape(n, -1, flat.shape[-1])
            result.curves += [
                {
                    "image": i,
                    "method": method,
                    "rank": r,
                    "target_id": ids[i][r],
                    "metric": name,
                    "curve": curve,
                    "steps": steps if steps is not None else np.arange(points.shape[-1], dtype=np.float32),
                    "values": points[i, r],
                    "step_labels": found.step_labels,
                }
                for i in range(n)
                for r in range(points.shape[1])
            ]
    return result


def evaluate(
    explainers: Mapping[str, Explainer] | Sequence[Explainer],
    images: Tensor,
    metrics: Sequence[str] | Mapping[str, Sequence[str]],
    *,
    targets=None,
    topk: int | None = None,
    regions: Tensor | None = None,
    options: Mapping[str, Mapping] | None = None,
) -> Evaluation:
    """Explain ``images`` once with each explainer and score every explanation with ``metrics``.

    ``explainers`` maps method names to explainers (a list is named by each one's
    ``name``); ``metrics`` is a list of metric names for every method, or a mapping from
    method name to its own list. ``targets`` and ``topk`` are the explainers' (class ids
    are needed by every metric that reads the model), ``regions`` and ``options`` as in
    :func:`score`. An unknown metric name raises ``ValueError`` before anything runs; an
    explainer or a metric that raises is recorded in ``failures`` and the rest runs.

    >>> import explain, torch, torchvision
    >>> model = torchvision.models.resnet18(num_classes=3).eval()
    >>> found = evaluate({"gradcam": explain.GradCAM(model)}, torch.rand(2, 3, 32, 32), ["sparseness"])
    >>> [(row["image"], row["method"], row["metric"]) for row in found.rows]
    [(0, 'gradcam', 'sparseness'), (1, 'gradcam', 'sparseness')]
    """
    if not isinstance(explainers, Mapping):
        explainers = {e.name: e for e in explainers}
    wanted = dict(metrics) if isinstance(metrics, Mapping) else {name: list(metrics) for name in explainers}
    for method, names in wanted.items():
        if method not in explainers:
            raise ValueError(f"metrics are given for {method!r}, which is not among the explainers {list(explainers)}")
        if isinstance(names, str):
            raise TypeError(f"metrics for {method!r} must be a list of names, not the string {names!r}")
        for name in names:
            metric(name)  # an unknown name raises here, listing the known ones
    methods = [method for method, names in wanted.items() if names]
    results = explain_each([explainers[m] for m in methods], images, targets, topk=topk)
    evaluation = Evaluation()
    for method, result in zip(methods, results, strict=True):
        if isinstance(result, Exception):
            evaluation.failures.append({"method": method, "metric": None, "error": _reason(result)})
        else:
            evaluation.extend(
                score(
                    explainers[method], images, result, wanted[method], regions=regions, options=options, method=method
                )
            )
    return evaluation
