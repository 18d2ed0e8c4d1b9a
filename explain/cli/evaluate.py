"""``explain evaluate``: the options handed to the batch layer (:mod:`explain.batch.evaluating`)."""

from __future__ import annotations

from ..batch.options import EvaluateOptions


def evaluate_command(args) -> int:
    from ..batch.evaluating import run_evaluation

    return run_evaluation(EvaluateOptions.from_values(args))
