"""``explain run --metrics``: each method's maps of a batch scored as they are made."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..evaluation import score


class MetricScorer:
    """Scores one method's explanation of a batch with the run's ``metrics``; a metric that
    fails is told to ``report(where, error)`` once and left out."""

    def __init__(self, metrics: list[str], options: dict, report: Callable[[str, str], None]):
        self.metrics, self.options, self.report = metrics, options, report
        self.reported: set[str] = set()  # metric failures are reported once each

    def __call__(self, cam, images: Tensor, result) -> dict[tuple[int, int], dict]:
        """{(image, target rank): {column: value}} (empty without --metrics)."""
        if not self.metrics:
            return {}
        found = score(cam, images, result, self.metrics, options=self.options, method=cam.name)
        for failure in found.failures:
            message = f"{cam.name} {failure['metric']}: {failure['error']}"
            if message not in self.reported:
                self.reported.add(message)
                self.report("--metrics", message)
        values: dict[tuple[int, int], dict] = {}
        for row in found.rows:
            values.setdefault((row["image"], row["rank"]), {})[row["metric"]] = round(row["value"], 6)
        return values
