"""``explain run``'s manifest: its rows (one output: an image, a method, a target), when an
earlier row is an output this run would make again, output names, and the metric summary."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..report import TEMP_NAME_BYTES, ManifestRecord

MANIFEST = "manifest.jsonl"


@dataclass(frozen=True)
class RecordMaker:
    """Makes a run's manifest records (:class:`~explain.report.ManifestRecord`), the one place
    both engines make them: each method's layers and settings, and the task, come from the
    run's check (a :class:`~explain.batch.preparation.PreparedRun` or its plain
    :class:`~explain.batch.options.CheckedRun`).

    >>> maker = RecordMaker({"gradcam": "features"}, {"gradcam": "model=m"}, "classify")
    >>> maker.failed("a.png", "gradcam", ["top1"], "cannot read it")[0].row()["error"]
    'cannot read it'
    """

    layers: dict[str, str]
    settings: dict[str, str]
    task: str
    #: method -> its concepts per target (--method crp: a row per concept), where it has them
    concepts: dict[str, int] = field(default_factory=dict)

    def record(self, input: str, method: str, target: str, **values) -> ManifestRecord:
        """A record of ``method``'s output for ``target`` of ``input``, the columns not given empty."""
        return ManifestRecord(
            input=input,
            method=method,
            layer=self.layers[method],
            target=target,
            settings=self.settings[method],
            task=self.task,
            **values,
        )

    def failed(self, input: str, method: str, labels: Iterable[str], error: str) -> list[ManifestRecord]:
        """A failed record per output of ``input`` by ``method``: per target (``labels``), and
        per concept of a concept method."""
        ranks = concept_ranks(self.concepts.get(method, 0))
        return [
            self.record(input, method, label, status="failed", error=error, concept_rank=rank)
            for label in labels
            for rank in ranks
        ]


def row_key(row: dict) -> tuple:
    """A manifest row's key, one per output: (input, method, target, concept rank), the rank
    None but for the rows of a concept method (``--method crp``: one row per concept).

    >>> row_key({"input": "a.png", "method": "crp", "target": "top1", "concept_rank": 2})
    ('a.png', 'crp', 'top1', 2)
    """
    return (row.get("input"), row.get("method"), row.get("target"), row.get("concept_rank"))


def concept_count(cam) -> int:
    """How many concepts ``cam`` makes per target (0: a map per target, not per concept)."""
    return int(cam.concepts) if getattr(cam, "per_image_concepts", False) else 0


def concept_ranks(count: int) -> list[int | None]:
    """The concept ranks of a method's rows of one target: 1 to ``count``, or [None] for a
    method of one map per target (``count`` 0)."""
    return list(range(1, count + 1)) if count else [None]


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
        and (row.get("concept_rank") is None or type(row.get("concept_rank")) is int)
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


#: The longest file (or folder) name, in bytes, where the file system says none (an object
#: store, or no ``os.pathconf``): that of most file systems (``NAME_MAX``).
NAME_MAX = 255
#: Hex digits of the hash that ends a shortened name.
NAME_HASH_DIGITS = 10


def fitted_name(stem: str, rest: str = "", limit: int = NAME_MAX) -> str:
    """``stem + rest``, or where that is over ``limit`` bytes (UTF-8), with ``stem`` cut to fit
    and ended by ``~`` and a hash of the whole ``stem``: unique (two stems that differ only past
    the cut keep different names) and stable (a rerun names the same file, and finds it).

    >>> fitted_name("photo", "__gradcam.png")
    'photo__gradcam.png'
    >>> name = fitted_name("x" * 300, "__gradcam.png", limit=64)
    >>> len(name.encode()), name[:50].count("x"), name[-24:]
    (64, 40, '~07791d26ef__gradcam.png')
    """
    if len((stem + rest).encode("utf-8", "surrogateescape")) <= limit:
        return stem + rest
    digest = hashlib.blake2b(stem.encode("utf-8", "surrogateescape"), digest_size=NAME_HASH_DIGITS // 2).hexdigest()
    room = limit - len(rest.encode("utf-8", "surrogateescape")) - 1 - NAME_HASH_DIGITS
    if room < 1:
        raise ValueError(f"no name of {limit} bytes holds {rest!r} and a hash")
    # cut at a character's boundary: a multi-byte character is left out whole
    kept = stem.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")
    return f"{kept}~{digest}{rest}"


def fitted_path(folder: str, stem: str, rest: str, limit: int) -> str:
    """The output name ``folder/stem + rest`` (``folder``: posix, may be empty) with each folder
    name within ``limit`` bytes plus :data:`~explain.report.TEMP_NAME_BYTES` and the file's name
    within ``limit`` (:func:`fitted_name`): ``limit`` is the file system's, less what a
    temporary file's name adds."""
    parts = [fitted_name(part, "", limit + TEMP_NAME_BYTES) for part in folder.split("/") if part]
    return "/".join([*parts, fitted_name(stem, rest, limit)])


def metric_table(rows: Iterable[dict]) -> list[dict]:
    """The summary (mean ± std per method and column) of the metric values in manifest rows."""
    from ..evaluation import summary_table

    return summary_table(
        {"method": row["method"], "metric": column, "value": value}
        for row in rows
        if row.get("status") in ("ok", "skipped")
        for column, value in (row.get("metrics") or {}).items()
    )
