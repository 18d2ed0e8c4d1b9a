"""The summary of an evaluation: mean ± std per method and metric column, the best marked,
as a list of dicts and as text, Markdown or HTML."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..metrics.registry import METRICS

__all__ = ["directions", "format_summary", "summary_table"]


def directions() -> dict[str, bool | None]:
    """Each metric column's direction: True where higher is better, False where lower is,
    None for a column that only describes the map.

    >>> directions()["deletion"], directions()["road-lerf"]
    (False, True)
    """
    return {column: higher for spec in METRICS.values() for column, (_, higher) in spec.columns.items()}


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def summary_table(rows: Iterable[Mapping], higher_is_better: Mapping[str, bool | None] | None = None) -> list[dict]:
    """Mean and standard deviation (ddof 1; 0 for a single value) of the values of each
    method and metric column, NaNs and empty values left out, the best mean per column
    marked.

    ``rows`` are dicts with ``method``, ``metric`` (a column name) and ``value`` (a number
    or its text, as read from ``scores.csv``). Directions come from the metrics' registry
    (:func:`directions`), or ``higher_is_better`` for other columns; a column without one,
    or with fewer than two methods, marks no best. One dict per method and column, in the
    order they first appear: ``method``, ``metric``, ``mean``, ``std``, ``n`` (values
    counted), ``higher_is_better``, ``best``.

    >>> rows = [{"method": "a", "metric": "deletion", "value": v} for v in (0.1, 0.3)]
    >>> rows += [{"method": "b", "metric": "deletion", "value": "0.4"},
    ...          {"method": "b", "metric": "deletion", "value": "nan"}]
    >>> [(r["method"], round(r["mean"], 3), round(r["std"], 3), r["n"], r["best"]) for r in summary_table(rows)]
    [('a', 0.2, 0.141, 2, True), ('b', 0.4, 0.0, 1, False)]
    """
    known = directions()
    known.update(higher_is_better or {})
    values: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        values.setdefault((str(row["method"]), str(row["metric"])), []).append(_number(row.get("value")))
    table: list[dict[str, Any]] = []
    for (method, column), found in values.items():
        finite = np.asarray([v for v in found if math.isfinite(v)], dtype=np.float64)
        n = len(finite)
        table.append(
            {
                "method": method,
                "metric": column,
                "n": n,
                "mean": float(finite.mean()) if n else math.nan,
                "std": float(finite.std(ddof=1)) if n > 1 else (0.0 if n else math.nan),
                "higher_is_better": known.get(column),
                "best": False,
            }
        )
    for column in dict.fromkeys(entry["metric"] for entry in table):
        entries = [e for e in table if e["metric"] == column and math.isfinite(e["mean"])]
        higher = known.get(column)
        if higher is None or len(entries) < 2:
            continue
        best = (max if higher else min)(e["mean"] for e in entries)
        for entry in entries:
            entry["best"] = entry["mean"] == best
    return table


def _arrow(higher: bool | None) -> str:
    arrows: dict[bool | None, str] = {True: " ↑", False: " ↓"}
    return arrows.get(higher, "")


def format_summary(table: list[dict], style: str = "text") -> str:
    """``table`` (from :func:`summary_table`) as a grid of methods (rows) by metric columns,
    each cell ``mean ± std``, the column's direction as an arrow in its header, the best
    marked: ``*`` in ``"text"``, bold in ``"markdown"`` and ``"html"``.

    >>> print(format_summary(summary_table([{"method": "gradcam", "metric": "deletion", "value": 0.25}])))
    method   deletion ↓
    gradcam  0.25 ± 0
    """
    if style not in ("text", "markdown", "html"):
        raise ValueError(f"unknown style {style!r}; use text, markdown or html")
    methods = list(dict.fromkeys(e["method"] for e in table))
    metrics = list(dict.fromkeys(e["metric"] for e in table))
    cells = {(e["method"], e["metric"]): e for e in table}
    higher = {e["metric"]: e["higher_is_better"] for e in table}

    def cell(method: str, column: str) -> str:
        entry = cells.get((method, column))
        if entry is None or not entry["n"]:
            return "-"
        text = f"{entry['mean']:.3g} ± {entry['std']:.2g}"
        if not entry["best"]:
            return html.escape(text) if style == "html" else text
        return {"text": text + " *", "markdown": f"**{text}**", "html": f"<strong>{html.escape(text)}</strong>"}[style]

    header = ["method"] + [column + _arrow(higher[column]) for column in metrics]
    body = [[method] + [cell(method, column) for column in metrics] for method in methods]
    if style == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    if style == "html":
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        rows = "".join(
            f'<tr><th scope="row">{html.escape(row[0])}</th>' + "".join(f"<td>{c}</td>" for c in row[1:]) + "</tr>"
            for row in body
        )
        return f'<table class="metrics"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)).rstrip() for line in [header, *body]
    )
