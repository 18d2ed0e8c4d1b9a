"""``explain run --labels FILE``: each image's true class, from a CSV of ``path,label`` lines,
recorded in its manifest rows with whether the model's top class is right (``label_id``,
``label_name``, ``correct``), so that the explorer can show the mistakes.

A label is a class id or a class name of the model (exactly, or ignoring case). A path is
matched to an input as the command line named it, as an absolute path, or relative to the
CSV's folder or to the folder argument the image was found in; lines naming no input of the
run are ignored (one labels file can serve a whole data set).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import Option, UsageError, worded
from ..text_files import csv_records
from .inputs import Source


def _class_ids(class_names: list[str]) -> dict[str, int]:
    ids: dict[str, int] = {}
    for class_id, name in enumerate(class_names):
        ids.setdefault(name, class_id)
        ids.setdefault(name.casefold(), class_id)
    return ids


def read_labels(path: Path, class_names: list[str]) -> dict[str, int]:
    """{path as written, and as an absolute path from the CSV's folder: class id} from the CSV
    at ``path``, read as CSV records (a quoted path may hold commas and any character) in
    bounded memory (:func:`~explain.text_files.csv_records`); a header line (``path,label``) is
    skipped. A line that is not ``path,label``, whose label is no class of the model, or that
    gives an image another label than an earlier line is a :class:`UsageError` naming the
    line; a line that repeats an earlier one is noted on stderr."""
    ids, labels = _class_ids(class_names), {}
    folder = os.path.dirname(os.path.abspath(path))
    where: tuple[str | Option, ...] = (Option("labels"), f" {path}")
    first_line: dict[str, tuple[int, int]] = {}  # absolute path -> (line, class id)
    repeated: list[tuple[int, int]] = []
    try:
        for number, cells in csv_records(path, str(path), "give a CSV file of path,label lines"):
            if not cells or not "".join(cells).strip():
                continue
            if number == 1 and [c.strip().lower() for c in cells] == ["path", "label"]:
                continue
            if len(cells) != 2 or not cells[0].strip():
                raise UsageError(*where, f" line {number}: expected `path,label`, found {','.join(cells)!r}")
            image, label = cells[0].strip(), cells[1].strip()
            class_id = _class_id(label, ids, len(class_names))
            if class_id is None:
                from ..targets import did_you_mean  # torch is loaded by now: the model named the classes

                example = class_names[0] if class_names else "0"
                hint = did_you_mean(label, class_names) or f" (such as {example!r})"
                raise UsageError(
                    *where,
                    f" line {number}: {label!r} is neither a class id (0..{len(class_names) - 1}) "
                    f"nor a class name of the model{hint}",
                )
            absolute = os.path.normpath(os.path.join(folder, image))
            if absolute in first_line:
                earlier, earlier_id = first_line[absolute]
                if earlier_id != class_id:
                    raise UsageError(
                        *where,
                        f" line {number}: {image!r} is labelled {label!r} here and "
                        f"{class_names[earlier_id]!r} on line {earlier}; keep one label per image",
                    )
                repeated.append((number, earlier))
                continue
            first_line[absolute] = (number, class_id)
            labels[os.path.normpath(image)] = class_id
            labels[absolute] = class_id
    except OSError as error:
        raise UsageError(*where, f": cannot read it: {error.strerror or error}") from None
    except ValueError as error:  # a line too long, a NUL byte, a malformed record
        raise UsageError(Option("labels"), f" {error}") from None  # csv_records names the file
    if repeated:
        number, earlier = repeated[0]
        more = f" ({len(repeated)} repeated lines in all)" if len(repeated) > 1 else ""
        print(f"explain: note: {worded(where)} line {number} repeats line {earlier}{more}", file=sys.stderr)
    return labels


def _class_id(label: str, ids: dict[str, int], count: int) -> int | None:
    if label.isdigit():
        return int(label) if int(label) < count else None
    return ids.get(label, ids.get(label.casefold()))


def labels_of(sources: Iterable[Source], labels: dict[str, int]) -> dict[str, int]:
    """{input: class id} for the ``sources`` that ``labels`` (:func:`read_labels`) names."""
    found = {}
    for source in sources:
        for key in (source.input, source.path, os.path.relpath(source.path, source.base) if source.base else None):
            if key is not None and os.path.normpath(key) in labels:
                found[source.input] = labels[os.path.normpath(key)]
                break
    return found


def mark(row: dict, truth: dict[str, int], class_names: list[str]) -> dict:
    """``row`` with its image's label and whether the prediction is right (None where the image
    has no label or no prediction)."""
    class_id = truth.get(row.get("input", ""))
    if class_id is None:
        return dict(row, label_id=None, label_name=None, correct=None)
    predicted = row.get("predicted_id")
    return dict(
        row,
        label_id=class_id,
        label_name=class_names[class_id],
        correct=None if predicted is None else predicted == class_id,
    )


def row_marker(
    labels: Path | None, task: str, sources: Iterable[Source], class_names: list[str]
) -> Callable[[dict], dict]:
    """What a run does to each row it records: with ``--labels`` (the CSV at ``labels``),
    :func:`mark` it with its image's label; without, nothing."""
    if labels is None:
        return lambda row: row
    if task != "classify":
        raise UsageError(Option("labels"), f" applies to classifiers; this is a {task} run")
    truth = labels_of(sources, read_labels(labels, class_names))
    return lambda row: mark(row, truth, class_names)
