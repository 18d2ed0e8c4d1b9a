"""``explain run``'s manifest: its rows (one output: an image, a method, a target), when an
earlier row is an output this run would make again, output names, and the metric summary."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

MANIFEST = "manifest.jsonl"


def manifest_row(input: str, method: str, target: str, layer: str, settings: str, task: str, **values) -> dict:
    """A manifest row of ``explain run``, the columns not given left empty."""
    row = dict.fromkeys(
        (
            "target_id",
            "target_name",
            "target_probability",
            "predicted_id",
            "predicted_name",
            "predicted_probability",
            "output",
            "maps",
            "error",
            "metrics",
            "region",
            "seconds",
        )
    )
    row.update(input=input, method=method, layer=layer, target=target, settings=settings, task=task)
    row.update(values)
    return row


def is_well_formed(row: dict) -> bool:
    """Whether a manifest row has the types ``explain run`` writes, so that resuming can read
    it; a row edited by hand or by another tool into other types is left out, and its output
    made again.

    >>> is_well_formed({"input": "a.png", "method": "gradcam", "target": "top1", "output": 5})
    False
    """
    text, optional_text = (str,), (str, type(None))
    return (
        isinstance(row.get("input"), text)
        and isinstance(row.get("method"), text)
        and all(isinstance(row.get(key), optional_text) for key in ("target", "output", "maps", "settings", "layer"))
        and isinstance(row.get("metrics"), (dict, type(None)))
    )


def is_complete(
    row: dict | None,
    exists: Callable[[str], bool],
    settings: str | None,
    layer: str | None,
    save_maps: bool,
    metric_columns: list[str],
) -> bool:
    """Whether an earlier run's row is an output this run would make again: done with the same
    settings and layer, its files there (``exists(name)``), its metric values there."""
    return bool(
        row
        and row.get("status") in ("ok", "skipped")
        and row.get("settings") == settings
        and row.get("layer") == layer
        and row.get("output")
        and exists(row["output"])
        and (not save_maps or (row.get("maps") and exists(row["maps"])))
        and all(column in (row.get("metrics") or {}) for column in metric_columns)
    )


def is_detection_row(row: dict, settings: str) -> bool:
    """Whether ``row`` is one box of a detection run with ``settings``: a detector's outputs are
    known by their boxes, found only once the detector has run."""
    return row.get("task") == "detect" and bool(row.get("region")) and row.get("settings") == settings


def safe_name(text: str) -> str:
    """A piece of an output file name: ``text`` with runs of other characters than letters,
    digits and ``.+-`` as one underscore, at most 48 characters.

    >>> safe_name("n01440764 tench, Tinca tinca")
    'n01440764_tench_Tinca_tinca'
    """
    return re.sub(r"[^\w.+-]+", "_", text).strip("_")[:48] or "class"


def metric_table(rows: Iterable[dict]) -> list[dict]:
    """The summary (mean ± std per method and column) of the metric values in manifest rows."""
    from ..evaluation import summary_table

    return summary_table(
        {"method": row["method"], "metric": column, "value": value}
        for row in rows
        if row.get("status") in ("ok", "skipped")
        for column, value in (row.get("metrics") or {}).items()
    )
