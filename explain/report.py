"""What a batch run leaves on disk: overlays and the manifest (index.html, the explorer, is
:mod:`explain.viewer`'s), each written atomically.

Every file is written to a hidden temporary file in its final folder and then renamed over
the target, so a process killed at any moment leaves either the old file or the new one,
never a truncated one. Leftover temporary files end in ``.explain-tmp``;
:func:`remove_temp_files` clears them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = [
    "CONCEPT_FIELDS",
    "MANIFEST_FIELDS",
    "SEGMENTS_FIELD",
    "TASK_FIELDS",
    "TEMP_NAME_BYTES",
    "TEMP_SUFFIX",
    "ManifestRecord",
    "atomic_write",
    "encode_npz",
    "encode_png",
    "json_records",
    "read_manifest",
    "remove_temp_files",
    "write_manifest",
]

TEMP_SUFFIX = ".explain-tmp"


@dataclass
class ManifestRecord:
    """One output of ``explain run`` (an image, a method, a target): a row of the manifest,
    its columns in the manifest's order. Both engines make their rows as these records (see
    :class:`explain.batch.manifest.RecordMaker`); :meth:`row` is the dict that the manifest's
    line (:func:`manifest_line`), the plan and ``index.html`` read."""

    input: str  # the image file, as found from the command line
    method: str  # registered method name
    layer: str | None = None  # target layer(s), comma-separated
    target: str | None = None  # what was explained: "top1".."topK", or a class id
    target_id: int | None = None  # class id explained
    target_name: str | None = None  # its class name
    target_probability: float | None = None  # softmax probability of that class
    predicted_id: int | None = None  # the model's top class
    predicted_name: str | None = None
    predicted_probability: float | None = None
    output: str | None = None  # overlay PNG, relative to the output folder
    maps: str | None = None  # .npz of the maps with --save-maps, relative to the output folder
    status: str | None = None  # ok, skipped (already complete), failed
    error: str | None = None  # why it failed
    settings: str | None = None  # options that change the pixels; resume only reuses a match
    seconds: float | None = None  # the method's time on this output: its image's share of the batch's, per target
    label_id: int | None = None  # with --labels: the image's true class id
    label_name: str | None = None  # its class name
    correct: bool | None = None  # whether the model's top class is the label (true, false; empty without one)
    #: Written after the columns only for the concepts of a concept method (``--method crp``),
    #: one row per concept: the concept (``layer:channel``), its rank among the target's
    #: concepts (1 the most relevant) and its relevance for the target, R(concept | target).
    concept: str | None = None
    concept_rank: int | None = None
    concept_relevance: float | None = None
    #: Written after the columns only for segmentation and detection rows (``explain run --task``):
    #: the task (segment or detect) and the region, what the output explains: ``{kind, pixels, box}``
    #: of the class's region (kind: predicted, mask or box), or ``{box, score, index}`` of the box.
    task: str | None = None
    region: dict | None = None
    #: Written after those only with ``explain run --metrics``: {metric column: value} for the map.
    metrics: dict | None = None
    #: Written last only with ``explain run --segments``, for the methods that score segments:
    #: {segment name: score} of the row's target (see :mod:`explain.batch.segment_sources`).
    segments: dict | None = None

    def row(self) -> dict:
        """The record as a dict, its columns in order."""
        return {name: getattr(self, name) for name in RECORD_FIELDS}

    def with_status(self, status: str, error: str | None = None) -> ManifestRecord:
        return dataclasses.replace(self, status=status, error=error if error is not None else self.error)


#: Every column a record has, in order.
RECORD_FIELDS = tuple(field.name for field in dataclasses.fields(ManifestRecord))
#: Written after the columns only for the rows of a concept method (``--method crp``).
CONCEPT_FIELDS = ("concept", "concept_rank", "concept_relevance")
#: Written after those only for segmentation and detection rows: ``task`` and ``region``.
TASK_FIELDS = ("task", "region")
#: Written after those only with ``explain run --metrics``.
METRICS_FIELD = "metrics"
#: Written last only with ``explain run --segments``.
SEGMENTS_FIELD = "segments"
#: Columns of the manifest, one JSON object per line in this key order: those of
#: :class:`ManifestRecord` that every row has.
MANIFEST_FIELDS = tuple(
    name for name in RECORD_FIELDS if name not in (*CONCEPT_FIELDS, *TASK_FIELDS, METRICS_FIELD, SEGMENTS_FIELD)
)


#: Bytes that the name of :func:`atomic_write`'s temporary file adds to the name it stands for
#: (``.NAME.1234abcd.explain-tmp``): a name fits the file system only where this much more does.
TEMP_NAME_BYTES = len(".") + len(".") + 8 + len(TEMP_SUFFIX)


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
    # os.open with 0o666 honours the umask, unlike tempfile's private 0o600 files.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def encode_png(rgb: np.ndarray) -> bytes:
    """PNG bytes of an (H, W, 3) uint8 array, encoded for speed.

    On heatmap overlays, Huffman-only compression at level 1 is about 5 times faster than
    Pillow's default (level 6) and the files are about as small.
    """
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG", compress_level=1, compress_type=zlib.Z_HUFFMAN_ONLY)
    return buffer.getvalue()


def encode_npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub would let **arrays fill allow_pickle
    return buffer.getvalue()


def remove_temp_files(root: str | os.PathLike[str]) -> int:
    """Delete the temporary files a killed run left under ``root``; returns how many."""
    removed = 0
    for folder, _, files in os.walk(root):
        for name in files:
            if name.startswith(".") and name.endswith(TEMP_SUFFIX):
                Path(folder, name).unlink(missing_ok=True)
                removed += 1
    return removed


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    return value


def write_manifest(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write rows as JSON Lines with the columns of :data:`MANIFEST_FIELDS` (then
    :data:`CONCEPT_FIELDS` for a concept method's rows, :data:`TASK_FIELDS` for
    segmentation and detection rows, and ``metrics`` and ``segments``
    where a row has them), atomically."""
    lines = [manifest_line(row) for row in rows]
    atomic_write(path, ("\n".join(lines) + "\n" if lines else "").encode("utf-8"))


def manifest_line(row: dict) -> str:
    """One row of the manifest as its JSON line (without the newline). A file name that is
    not UTF-8 (held by Python as surrogate escapes) makes its line ASCII, with ``\\udcXX``
    escapes that ``json.loads`` reads back to the same name: lossless, and valid UTF-8."""
    fields = {key: _json_value(row.get(key)) for key in MANIFEST_FIELDS}
    if row.get("concept_rank") is not None:
        fields.update({key: _json_value(row.get(key)) for key in CONCEPT_FIELDS})
    if row.get("task") not in (None, "classify"):
        fields.update({key: _json_value(row.get(key)) for key in TASK_FIELDS})
    if row.get(METRICS_FIELD) is not None:
        fields[METRICS_FIELD] = _json_value(row[METRICS_FIELD])
    if row.get(SEGMENTS_FIELD) is not None:
        fields[SEGMENTS_FIELD] = _json_value(row[SEGMENTS_FIELD])
    return json_line(fields)


def json_line(record: dict) -> str:
    """``record`` as one line of JSON, UTF-8 where it can be and ASCII escapes where a string
    holds surrogate escapes (see :func:`manifest_line`).

    >>> json_line({"input": "café.png"}), json_line({"input": os.fsdecode(b"caf\\xe9.png")})
    ('{"input": "café.png"}', '{"input": "caf\\\\udce9.png"}')
    """
    line = json.dumps(record, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record)
    return line


def json_records(lines: Iterable[str]) -> list[dict]:
    """The JSON objects among ``lines``; lines that do not parse as one are dropped.

    >>> json_records(['{"a": 1}', '{"a": 2', '[3]'])
    [{'a': 1}]
    """
    return list(iter_json_records(lines))


def iter_json_records(lines: Iterable[str]) -> Iterator[dict]:
    """:func:`json_records` as a stream, for files read line by line."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def read_manifest(path: str | os.PathLike) -> list[dict]:
    """Rows of a manifest; a missing file gives none, and unreadable lines are dropped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return json_records(text.splitlines())
