"""The files ``explain evaluate`` keeps under ``--out``: ``scores.csv`` and ``curves.jsonl``
grow by appends (one write per batch, so a killed run loses at most its last batch, and a
line cut short by the kill is dropped on reading), and are rewritten atomically with the
latest row of each key when a run starts and ends.

An image whose file name is not UTF-8 keeps its name's own bytes in the CSV files (as
``ls > list.txt`` would write them; Python reads them back with ``errors="surrogateescape"``)
and ``\\udcXX`` escapes in curves.jsonl, so that a rerun finds its scores."""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path

from ..report import atomic_write, json_line, json_records

__all__ = [
    "CURVES",
    "FAILURES",
    "FAILURE_FIELDS",
    "SCORES",
    "SCORE_FIELDS",
    "SUMMARY_FIELDS",
    "append_lines",
    "csv_lines",
    "jsonl_lines",
    "latest",
    "read_csv",
    "read_jsonl",
    "rewrite",
]

SCORES, CURVES, FAILURES = "scores.csv", "curves.jsonl", "failures.csv"
#: Columns of scores.csv: one row per image, method, target and metric column.
SCORE_FIELDS = ("image", "method", "target", "target_id", "target_name", "metric", "value", "layer", "settings")
#: Columns of failures.csv: what could not be scored in the last run, and why.
FAILURE_FIELDS = ("image", "method", "metric", "error")
SUMMARY_FIELDS = ("method", "metric", "higher_is_better", "n", "mean", "std", "best")


def _complete_text(path: Path) -> str:
    """The file's text up to its last newline: what follows is a line a killed run left unfinished."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as file:
            text = file.read()
    except FileNotFoundError:
        return ""
    return text[: text.rfind("\n") + 1]


def read_csv(path: str | os.PathLike) -> list[dict]:
    """Rows of a CSV file with a header, as dicts; a missing file gives none, and rows with
    another number of cells than the header (a line cut short) are dropped."""
    reader = csv.reader(io.StringIO(_complete_text(Path(path)), newline=""))
    rows: list[list[str]] = []
    with suppress(csv.Error):  # a quoted cell cut short: keep the rows before it
        rows.extend(reader)
    if not rows:
        return []
    header = rows[0]
    return [dict(zip(header, row, strict=True)) for row in rows[1:] if len(row) == len(header)]


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Objects of a JSON Lines file; lines that do not parse are dropped."""
    return json_records(_complete_text(Path(path)).split("\n")[:-1])


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.9g}"
    return "" if value is None else str(value)


def csv_lines(rows: Iterable[Mapping], fields: Sequence[str], header: bool = False) -> str:
    """``rows`` as CSV text with ``fields`` as columns (floats to 9 significant digits)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(fields)
    for row in rows:
        writer.writerow([_cell(row.get(field)) for field in fields])
    return buffer.getvalue()


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def jsonl_lines(records: Iterable[Mapping]) -> str:
    """``records`` as JSON Lines; NaN and infinities become null."""
    return "".join(json_line({k: _json_value(v) for k, v in record.items()}) + "\n" for record in records)


def append_lines(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` (whole lines) in one write and flush it to the disk."""
    if not text:
        return
    with open(path, "a", encoding="utf-8", errors="surrogateescape", newline="") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def latest(rows: Iterable[Mapping], key: Sequence[str]) -> list[dict]:
    """The last row of each ``key`` (a tuple of fields), in the order keys first appear.

    >>> latest([{"k": 1, "v": "old"}, {"k": 2, "v": "b"}, {"k": 1, "v": "new"}], ["k"])
    [{'k': 1, 'v': 'new'}, {'k': 2, 'v': 'b'}]
    """
    out: dict[tuple, dict] = {}
    for row in rows:
        out[tuple(row.get(field) for field in key)] = dict(row)
    return list(out.values())


def rewrite(path: str | os.PathLike, text: str) -> None:
    """Replace the file's content atomically."""
    atomic_write(path, text.encode("utf-8", "surrogateescape"))
