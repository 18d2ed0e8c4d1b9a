"""The strategies as files (what ``explain strategies`` writes), all or nothing:
``strategies.csv`` (one row per item: input, method, target, class, cluster, x, y,
distance), ``strategies.json`` (per class: the eigenvalues, the number of clusters and each
cluster's size, prototype, nearest members, mean probability and share of mistakes) and
``prototypes/CLASS__cN.png`` (each cluster's mean map, for maps).

The folder is written beside its place under a temporary name and renamed into place at
the end, the earlier one removed after: an error or Ctrl-C on the way leaves the earlier
folder (or none), never half of the new one."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import pathlib
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image

from ..report import TEMP_SUFFIX, encode_png
from .clustering import Strategies

__all__ = ["CSV_FIELDS", "check_replaceable", "json_number", "replace_folder", "write_strategies"]

#: The columns of ``strategies.csv``.
CSV_FIELDS = ("input", "method", "target", "class", "cluster", "x", "y", "distance")
#: The side of a prototype PNG, in pixels (the pooled map enlarged, nearest neighbour).
PROTOTYPE_SIDE = 128
#: Concepts listed per cluster in ``strategies.json`` for concept relevances.
TOP_CONCEPTS = 5


def write_strategies(found: dict[str, Strategies], out: str | os.PathLike, cmap: str = "jet") -> Path:
    """Write ``found`` (:func:`~explain.analysis.strategies`'s result) to the folder ``out``,
    replacing an earlier one whole; returns ``out``."""

    def fill(temp: Path) -> None:
        (temp / "prototypes").mkdir()
        summary = {name: _write_class(temp, name, result, cmap) for name, result in found.items()}
        (temp / "strategies.json").write_text(json.dumps(summary, indent=1, allow_nan=False), encoding="utf-8")
        (temp / "strategies.csv").write_text(_csv(found), encoding="utf-8", newline="")

    return replace_folder(out, fill)


def replace_folder(
    out: str | os.PathLike,
    fill: Callable[[pathlib.Path], None],
    marker: str = "strategies.json",
    written: frozenset[str] | None = None,
    what: str = "the strategies",
) -> pathlib.Path:
    """Make the folder ``out`` whole or not at all: ``fill`` writes it under a temporary name
    beside its place (an empty folder it is given), which is then renamed into place, the
    earlier ``out`` removed after; an error or Ctrl-C in ``fill`` (or a failed rename: the
    earlier folder is put back) leaves the earlier folder (or none). An ``out`` that holds
    other files and no ``marker`` (what ``fill`` writes) is refused
    (:func:`check_replaceable`). Returns ``out``."""
    out = Path(out).absolute()
    check_replaceable(out, marker, WRITTEN if written is None else written, what)
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
    old = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.old{TEMP_SUFFIX}")
    try:
        temp.mkdir()
        fill(temp)
        if out.exists():
            os.replace(out, old)
        try:
            os.replace(temp, out)
        except BaseException:
            if old.exists() and not out.exists():  # the earlier folder put back
                os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return out


#: What an earlier ``write_strategies`` left in its folder: the one kind of folder it replaces.
WRITTEN = frozenset({"strategies.csv", "strategies.json", "prototypes"})


def check_replaceable(
    out: Path, marker: str = "strategies.json", written: frozenset[str] = WRITTEN, what: str = "the strategies"
) -> None:
    """Refuse an ``out`` that :func:`~explain.analysis.write_strategies` did not write (a folder holding other
    files and no ``strategies.json``): replacing it whole would delete them (a run's outputs,
    a parent folder). A missing or empty folder, or an earlier one of strategies, will do.
    Another writer names its own ``marker`` file, the names it ``written``, and ``what`` it
    writes (:func:`~explain.analysis.write_craft`: ``craft.json``, CRAFT's concepts).

    >>> import tempfile; folder = Path(tempfile.mkdtemp()); (folder / "manifest.jsonl").touch()
    >>> try:
    ...     check_replaceable(folder)
    ... except ValueError as error:
    ...     print(str(error).partition(" holds ")[2])
    other files than the strategies (manifest.jsonl): give a new folder, or one an earlier run of it wrote
    """
    if not out.exists():
        return
    names = set(os.listdir(out)) if out.is_dir() else {out.name}
    if out.is_dir() and (not names or marker in names):
        return
    others = sorted(names - written)
    listed = f" ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''})" if others else ""
    raise ValueError(
        f"{out} holds other files than {what}{listed}: give a new folder, or one an earlier run of it wrote"
    )


def _file_name(text: str) -> str:
    return re.sub(r"[^\w.+-]+", "_", text).strip("_")[:48] or "class"


def json_number(number) -> float | None:
    """A number as the JSON files hold it: rounded to 6 decimals, None where not finite."""
    return None if number is None or not math.isfinite(number) else round(float(number), 6)


def _key_fields(key) -> dict:
    if isinstance(key, dict):
        return {"input": key.get("input"), "method": key.get("method"), "target": key.get("target")}
    return {"input": key, "method": None, "target": None}


def _csv(found: dict[str, Strategies]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for name, result in found.items():
        for i, key in enumerate(result.keys or range(len(result))):
            x, y = result.coordinates[i]
            row = {**_key_fields(key), "class": name, "cluster": int(result.clusters[i])}
            distance = json_number(result.distances[i])
            writer.writerow({**row, "x": json_number(x), "y": json_number(y), "distance": distance})
    return buffer.getvalue()


def _write_class(folder: Path, name: str, result: Strategies, cmap: str) -> dict:
    """The class's entry of strategies.json; its prototypes written under ``folder``."""
    keys = result.keys or list(range(len(result)))
    clusters = []
    for number, cluster in enumerate(result.summaries):
        entry: dict = {
            "cluster": number,
            "size": cluster.size,
            "nearest": [_key_fields(keys[i])["input"] for i in cluster.nearest],
            "mean_probability": json_number(cluster.mean_probability),
            "mistake_share": json_number(cluster.mistake_share),
        }
        if result.features == "maps":
            path = Path("prototypes", f"{_file_name(name)}__c{number}.png")
            (folder / path).write_bytes(encode_png(_picture(cluster.prototype, cmap)))
            entry["prototype"] = path.as_posix()
        else:
            top = np.argsort(-cluster.prototype, kind="stable")[:TOP_CONCEPTS]
            names = result.concept_names or [str(i) for i in range(len(cluster.prototype))]
            entry["concepts"] = {names[i]: json_number(cluster.prototype[i]) for i in top}
        clusters.append(entry)
    return {
        "features": result.features,
        "embedding": result.embedding,
        "items": len(result),
        "n_clusters": result.n_clusters,
        "eigenvalues": [json_number(v) for v in result.eigenvalues[:16]],
        "clusters": clusters,
    }


def _picture(prototype: np.ndarray, cmap: str) -> np.ndarray:
    """(PROTOTYPE_SIDE, PROTOTYPE_SIDE, 3) uint8: the mean map coloured (signed maps on
    [-1, 1] around the colormap's middle), enlarged nearest-neighbour."""
    low = float(prototype.min())
    scaled = (prototype + 1) / 2 if low < 0 else prototype
    rgb = (matplotlib.colormaps[cmap](np.clip(scaled, 0, 1))[..., :3] * 255).astype(np.uint8)
    return np.asarray(Image.fromarray(rgb).resize((PROTOTYPE_SIDE, PROTOTYPE_SIDE), Image.Resampling.NEAREST))
