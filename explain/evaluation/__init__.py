"""Evaluating explanation methods: the Python API behind ``explain evaluate``.

:func:`evaluate` explains a batch with each method once and scores every explanation with
the metrics of :mod:`explain.metrics`; :func:`summary_table` and :func:`format_summary`
give mean ± std per method and metric with the best marked; :func:`plot_curves`,
:func:`plot_summary` and :func:`plot_randomisation` draw them; :func:`read_regions` reads
the objects' boxes or masks for the localisation metrics.

>>> import explain, torch, torchvision
>>> from explain.evaluation import evaluate, format_summary, summary_table
>>> model = torchvision.models.resnet18(num_classes=4).eval()
>>> methods = {"gradcam": explain.GradCAM(model), "eigencam": explain.EigenCAM(model)}
>>> found = evaluate(methods, torch.rand(2, 3, 32, 32), ["deletion"], options={"deletion": {"step": 0.25}})
>>> [(row["method"], row["metric"]) for row in found.rows if row["image"] == 0]
[('gradcam', 'deletion'), ('eigencam', 'deletion')]
>>> table = summary_table(found.rows)      # one dict per method and metric column
>>> print(format_summary(table).splitlines()[0])
method    deletion ↓
"""

from .plots import mean_curves, plot_curves, plot_randomisation, plot_summary
from .regions import read_regions
from .scoring import Evaluation, evaluate, explain_each, score
from .summary import directions, format_summary, summary_table

__all__ = [
    "Evaluation",
    "directions",
    "evaluate",
    "explain_each",
    "format_summary",
    "mean_curves",
    "plot_curves",
    "plot_randomisation",
    "plot_summary",
    "read_regions",
    "score",
    "summary_table",
]
