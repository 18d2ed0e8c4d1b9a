"""TCAV's result as files (what ``explain concepts tcav`` writes), all or nothing:
``tcav.csv`` (one row per concept x layer x class), ``tcav.json`` (the whole result, each
random set's score included) and its page, ``index.html``
(``explain.viewer.tcav_page``). The folder is written beside its place and renamed into place
at the end (:func:`~explain.analysis.files.replace_folder`)."""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..viewer.tcav_page import tcav_page
from .files import json_number, replace_folder

if TYPE_CHECKING:  # (the concepts import the methods: not needed to write files)
    from ..concepts import TCAVResult, TCAVScore

__all__ = ["TCAV_FIELDS", "write_tcav"]

#: The columns of ``tcav.csv``.
TCAV_FIELDS = (
    "concept", "layer", "class", "class_id", "score_mean", "score_std", "null_mean", "p_value",
    "corrected_p", "significant", "direction", "cav_accuracy",
)  # fmt: skip
#: What an earlier ``write_tcav`` left in its folder: the one kind of folder it replaces.
WRITTEN = frozenset({"tcav.json", "tcav.csv", "index.html"})


def write_tcav(result: TCAVResult, out: str | os.PathLike, sources: Mapping | None = None) -> pathlib.Path:
    """Write ``result`` (:class:`~explain.concepts.TCAV`'s) to the folder ``out``, replacing an
    earlier one whole (and refusing a folder of other files:
    :func:`~explain.analysis.files.check_replaceable`); returns ``out``.

    ``tcav.csv`` has the columns :data:`~explain.analysis.tcav_files.TCAV_FIELDS`, one row per concept x layer x class.
    ``tcav.json`` is an object::

        {"method": "tcav",
         "alpha": 0.05, "alternative": "two-sided",      # the t-test (scipy's ttest_ind)
         "correction": "bonferroni", "tests": 2,         # p-values times concepts x layers
         "layers": [...], "concepts": [...],
         "classes": [{"id": 2, "name": "triangle"}],
         "random_sets": ["random 0", ...],               # or "draw i" (drawn from one pool)
         "settings": {...},                              # the TCAV's options
         "sources": {...},                               # what the caller gives (the CLI:
                                                         #  folders, image counts, the draws)
         "scores": [{"concept": ..., "layer": ..., "class": ..., "class_id": ...,
                     "score_mean", "score_std", "null_mean", "null_std",
                     "p_value", "corrected_p", "significant", "direction" ("+"/"-"/"0"),
                     "cav_accuracy", "null_accuracy",
                     "scores": [one per random set], "null_scores": [...],
                     "accuracies": [...], "null_accuracies": [...]}, ...]}

    Numbers are rounded to 6 decimals; where one is not finite it is null."""

    def fill(temp: pathlib.Path) -> None:
        summary = {
            "method": "tcav",
            "alpha": result.alpha,
            "alternative": result.settings.get("alternative", "two-sided"),
            "correction": "bonferroni",
            "tests": result.tests,
            "layers": list(dict.fromkeys(s.layer for s in result)),
            "concepts": list(dict.fromkeys(s.concept for s in result)),
            "classes": [{"id": t, "name": n} for t, n in dict.fromkeys((s.target, s.class_name) for s in result)],
            "random_sets": list(result.random_sets),
            "settings": result.settings,
            "sources": dict(sources or {}),
            "scores": [_entry(score) for score in result],
        }
        (temp / "tcav.json").write_text(json.dumps(summary, indent=1, allow_nan=False), encoding="utf-8")
        (temp / "tcav.csv").write_text(_csv(result), encoding="utf-8", newline="")
        (temp / "index.html").write_text(tcav_page(summary), encoding="utf-8")

    return replace_folder(out, fill, "tcav.json", WRITTEN, "TCAV's scores")


def _numbers(values) -> list:
    return [json_number(float(v)) for v in values]


def _entry(score: TCAVScore) -> dict:
    row = {key: json_number(value) if isinstance(value, float) else value for key, value in score.row().items()}
    null_std = float(score.null_scores.std()) if len(score.null_scores) > 1 else 0.0
    return {
        **row,
        "null_std": json_number(null_std),
        "null_accuracy": json_number(float(score.null_accuracies.mean())),
        "scores": _numbers(score.scores),
        "null_scores": _numbers(score.null_scores),
        "accuracies": _numbers(score.accuracies),
        "null_accuracies": _numbers(score.null_accuracies),
    }


def _csv(result: TCAVResult) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, TCAV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for score in result:
        writer.writerow({key: json_number(v) if isinstance(v, float) else v for key, v in score.row().items()})
    return buffer.getvalue()
