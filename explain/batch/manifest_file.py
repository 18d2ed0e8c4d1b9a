"""``manifest.jsonl`` as both engines write it, by one rule: at a run's start the file is
compacted (rewritten whole, atomically, with the earlier rows the run keeps: its finished
outputs, each once), then each row is appended as it comes, as a whole line in one write (a
killed run leaves at most a partial last line, which readers drop and the next start removes;
a full disk none); the local engine compacts once more when its run completes (its rows in the
order of its plan). No row is ever written twice: the outputs a run makes again have no earlier
row after its start. Driver-side: no torch (the Ray driver plans millions of inputs).

:class:`ManifestFile` writes; :class:`RowCounts` counts what a run recorded (its summary line,
its exit status)."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..errors import out_of_memory_reason
from ..report import TEMP_SUFFIX, manifest_line
from .manifest import MANIFEST, row_key
from .storage import OutputFolder, append_whole, device_errors

#: A folder given by URI gets the manifest's working copy at most this often (and at the end).
PUBLISH_SECONDS = 30


class ManifestFile:
    """A run's ``manifest.jsonl``: on this machine (in the folder itself, or for a folder given
    by URI in a working copy, uploaded now and then and at the end), :meth:`compact`-ed and
    :meth:`append`-ed to, each row through ``marked`` first (``--labels``: its image's label).

    >>> import tempfile; folder = OutputFolder(tempfile.mkdtemp())
    >>> manifest = ManifestFile(folder)
    >>> manifest.compact([{"input": "a.png", "method": "gradcam", "status": "skipped"}])
    1
    >>> manifest.append([{"input": "b.png", "method": "gradcam", "status": "ok"}]); manifest.close()
    >>> [line[:30] for line in open(manifest.path)]
    ['{"input": "a.png", "method": "', '{"input": "b.png", "method": "']
    """

    def __init__(self, folder: OutputFolder, marked: Callable[[dict], dict] = lambda row: row):
        self.folder, self.marked = folder, marked
        if folder.filesystem is None:
            self.path = Path(folder.path(MANIFEST))
        else:
            self.path = Path(tempfile.mkdtemp(prefix="explain-ray-")) / MANIFEST
        self.published = time.monotonic()
        self._out: BinaryIO | None = None  # the file, opened unbuffered for appending, once rows come

    def compact(self, rows: Iterable[dict]) -> int:
        """Rewrite the manifest, atomically, with ``rows`` (a stream), each key (input, method,
        target, concept rank) once: the first of a key is kept (a row an actor kept may be in
        the manifest too). Returns how many rows were written."""
        self.close()  # the appends go on in the new file
        temp = self.path.with_name(f".{MANIFEST}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            written: set[int] = set()
            with device_errors(self.path.parent), open(temp, "w", encoding="utf-8") as file:
                for row in rows:
                    key = hash(row_key(row))
                    if key not in written:
                        written.add(key)
                        file.write(manifest_line(self.marked(row)) + "\n")
            os.replace(temp, self.path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return len(written)

    def append(self, rows: list[dict]) -> None:
        """``rows`` appended to the manifest, whole lines in one write."""
        if not rows:
            return
        data = "".join(manifest_line(self.marked(row)) + "\n" for row in rows).encode("utf-8")
        with device_errors(self.path.parent):
            if self._out is None:
                # Unbuffered, so that a failed append is cut off whole (storage.append_whole).
                self._out = open(self.path, "ab", buffering=0)  # noqa: SIM115 (closed by close())
            append_whole(self._out, data)
        if self.folder.filesystem is not None and time.monotonic() - self.published > PUBLISH_SECONDS:
            self.publish()

    def close(self) -> None:
        """Close the file the rows were appended to (the next :meth:`append` opens it again)."""
        if self._out is not None:
            self._out.close()
            self._out = None

    def publish(self) -> None:
        """A folder given by URI: upload the working copy of the manifest."""
        if self.folder.filesystem is not None:
            self.folder.upload(MANIFEST, self.path)
            self.published = time.monotonic()


@dataclass
class RowCounts:
    """What a run recorded: its rows by status, each method's time in this run (the rows it
    made, not those skipped) and the outputs that failed for memory running out.

    >>> counts = RowCounts()
    >>> counts.count({"method": "gradcam", "status": "ok", "seconds": 0.5})
    >>> counts.count({"method": "gradcam", "status": "failed", "error": "out of memory: ..."})
    >>> counts.stats, counts.seconds, counts.out_of_memory
    ({'ok': 1, 'skipped': 0, 'failed': 1}, {'gradcam': 0.5}, 1)
    """

    stats: dict[str, int] = field(default_factory=lambda: {"ok": 0, "skipped": 0, "failed": 0})
    seconds: dict[str, float] = field(default_factory=dict)
    out_of_memory: int = 0

    def count(self, row: dict) -> None:
        """Count one recorded row."""
        self.stats[row["status"]] += 1
        if row["status"] == "failed":
            self.out_of_memory += out_of_memory_reason(row.get("error") or "")
        if row["status"] != "skipped" and row.get("seconds") is not None:
            self.seconds[row["method"]] = self.seconds.get(row["method"], 0.0) + row["seconds"]
