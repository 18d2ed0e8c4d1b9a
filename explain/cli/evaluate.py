"""``explain evaluate``: the options that need no model checked here (:mod:`~explain.cli.checks`),
then handed to the batch layer (:mod:`explain.batch.evaluating`)."""

from __future__ import annotations

from ..batch.inputs import collect_inputs
from ..batch.options import EvaluateOptions
from ..batch.storage import out_folder
from .checks import check_evaluate_options


def evaluate_command(args) -> int:
    options = EvaluateOptions.from_values(args)
    check_evaluate_options(options)  # the mistakes that show without torch: answered at once
    out_dir = out_folder(options.out)
    sources = collect_inputs(options.inputs, out_dir)  # and those in the inputs, before torch loads
    from ..batch.commands import run_evaluation

    return run_evaluation(options, sources)
