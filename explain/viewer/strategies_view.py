"""The strategies (``explain strategies``, SpRAy) in a run's explorer: the data file
``index-data/strategies.js`` that the run's ``index.html`` includes, and its inclusion.

``explain strategies RUN_DIR`` writes its folder (``strategies.csv``, ``strategies.json``,
``prototypes/``, by :func:`explain.analysis.write_strategies`), then :func:`write_run_strategies`
joins them for the page: per class its clusters (size, prototype, nearest images, mean
probability, share of mistakes), and per item (an image's map of one method and target) its
class, cluster, 2-D place and the ``seconds`` of its manifest row. The file is a script
(``explorerStrategies = JSON.parse("...")``; a page from file:// may not ``fetch`` a JSON file),
kept in the page's data folder; index.html is rewritten to include it, and every later write of
the page (a rerun of ``explain run``: :func:`explain.batch.page.write_page`) includes it again.

The page joins the clusters to its rows by the key (input, method, target): the ``cluster``
column, its filter, sort and colours, and the strategies view (explorer.js and strategies.js).
It says the strategies are stale where the run changed since: a clustered map redone (its
``seconds`` differ), an image added or gone."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path, PurePosixPath

from ..report import read_manifest
from . import DATA_FOLDER, link, readable

__all__ = ["STRATEGIES_SCRIPT", "include_script", "read_strategies_script", "strategies_data", "write_run_strategies"]

#: The strategies' data file under a run folder, which its index.html includes.
STRATEGIES_SCRIPT = f"{DATA_FOLDER}/strategies.js"
_PREFIX, _SUFFIX = "explorerStrategies = JSON.parse(", ");"


def _relative(path: Path, base: Path) -> str:
    """The link from the folder ``base`` to ``path``."""
    return link(PurePosixPath(*Path(os.path.relpath(path.absolute(), base.absolute())).parts).as_posix())


def _classes(summary: dict, folder: str) -> list[dict]:
    """strategies.json's classes, each cluster's prototype linked from the run folder (through
    ``folder``, the link to the strategies' folder), the nearest images by their page names."""
    classes = []
    for name, entry in summary.items():
        clusters = []
        for cluster in entry.get("clusters", []):
            prototype = cluster.get("prototype")
            clusters.append(
                {
                    "cluster": int(cluster["cluster"]),
                    "size": int(cluster["size"]),
                    "prototype": f"{folder}/{link(prototype)}" if prototype else None,
                    "concepts": cluster.get("concepts"),
                    "nearest": [readable(str(source)) for source in cluster.get("nearest", [])],
                    "mean_probability": cluster.get("mean_probability"),
                    "mistake_share": cluster.get("mistake_share"),
                }
            )
        classes.append(
            {
                "name": readable(str(name)),
                "features": entry.get("features"),
                "embedding": entry.get("embedding"),
                "items": entry.get("items"),
                "clusters": clusters,
            }
        )
    return classes


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def strategies_data(run_dir: str | os.PathLike, out: str | os.PathLike) -> dict:
    """What the run's page shows of the strategies in the folder ``out`` (written by
    :func:`~explain.analysis.write_strategies` for the run folder ``run_dir``): ``classes`` (in
    strategies.json's order) and ``items`` column by column (``input``, ``method``,
    ``target``, ``class``: an index of ``classes``, ``cluster``, ``x``, ``y``, ``seconds``: the
    manifest row's, which tells a redone map)."""
    run_dir, out = Path(run_dir), Path(out)
    summary = json.loads((out / "strategies.json").read_text(encoding="utf-8"))
    classes = _classes(summary, _relative(out, run_dir))
    index = {entry["name"]: k for k, entry in enumerate(classes)}
    seconds = {
        (str(row.get("input")), str(row.get("method")), str(row.get("target"))): row.get("seconds")
        for row in read_manifest(run_dir / "manifest.jsonl")
    }
    columns: dict[str, list] = {name: [] for name in ("input", "method", "target", "class", "cluster", "x", "y")}
    columns["seconds"] = []
    with open(out / "strategies.csv", encoding="utf-8", newline="") as table:
        for row in csv.DictReader(table):
            columns["input"].append(readable(row["input"]))
            columns["method"].append(readable(row["method"]))
            columns["target"].append(readable(row["target"]))
            columns["class"].append(index[readable(row["class"])])
            columns["cluster"].append(int(row["cluster"]))
            columns["x"].append(_number(row["x"]))
            columns["y"].append(_number(row["y"]))
            columns["seconds"].append(seconds.get((row["input"], row["method"], row["target"])))
    return {"folder": _relative(out, run_dir), "classes": classes, "items": columns}


def _script(data: dict) -> bytes:
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return f"{_PREFIX}{json.dumps(text, ensure_ascii=False)}{_SUFFIX}\n".encode()


def read_strategies_script(data: bytes) -> dict:
    """The data a strategies.js holds (the inverse of what :func:`write_run_strategies` writes)."""
    text = data.decode("utf-8").strip()
    if not (text.startswith(_PREFIX) and text.endswith(_SUFFIX)):
        raise ValueError("not a strategies data file of the explorer")
    return json.loads(json.loads(text[len(_PREFIX) : -len(_SUFFIX)]))


def include_script(document: str, name: str) -> str:
    """The page ``document`` with a script element for ``name`` after its data files' (where it
    has none yet)."""
    element = f'<script src="{link(name)}"></script>'
    if element in document:
        return document
    anchor = "<script>explorerSetup.times"
    if anchor not in document:
        raise ValueError("not an explorer page written by explain (it has no data files' place)")
    return document.replace(anchor, f"{element}\n{anchor}", 1)


def write_run_strategies(run_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the strategies of folder ``out`` into the run folder's page: its data file (whole:
    written beside, then renamed) and index.html rewritten to include it, where there is one
    (a run still writing its page includes the file at its next write). Returns the data file."""
    run_dir = Path(run_dir)
    target = run_dir / STRATEGIES_SCRIPT
    target.parent.mkdir(exist_ok=True)
    temp = target.with_name(f".{target.name}.tmp")
    temp.write_bytes(_script(strategies_data(run_dir, out)))
    os.replace(temp, target)
    index = run_dir / "index.html"
    if index.is_file():
        document = index.read_text(encoding="utf-8")
        if re.search(r"^var explorerSetup = ", document, re.MULTILINE):
            updated = include_script(document, STRATEGIES_SCRIPT)
            if updated != document:
                temp = index.with_name(".index.html.tmp")
                temp.write_text(updated, encoding="utf-8")
                os.replace(temp, index)
    return target
