"""The Ray driver's files under --out: the plan of a run (:class:`PlanFiles`, which Ray Data
reads) and the manifest it appends to (:class:`DriverManifest`). Driver-side: no torch."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import out_of_memory_reason
from ..report import TEMP_SUFFIX, manifest_line
from .inputs import PLAN_PREFIX
from .manifest import MANIFEST, row_key
from .outcome import report_failure
from .storage import OutputFolder, append_whole, device_errors

#: Images per plan file: Ray Data reads the plan file by file, a decode task per file.
PLAN_CHUNK = 1_000
#: A folder given by URI gets the manifest's working copy at most this often (and at the end).
PUBLISH_SECONDS = 30
#: The end of the name of the folder beside a plan where its actors keep their batches' rows.
ROWS_SUFFIX = "-rows"


class PlanFiles:
    """The images a run explains with the methods still to run on each: parquet files in a
    folder under --out (``PLAN_PREFIX...``), :data:`PLAN_CHUNK` images a file, that Ray Data
    reads, a decode task per file. ``input`` and ``path`` are bytes (``os.fsencode``): a file
    name that is not UTF-8 has no place in a parquet string column."""

    COLUMNS = ("input", "path", "folder", "stem", "methods")
    NAMES = ("input", "path")

    def __init__(self, folder: OutputFolder):
        self.folder = folder
        self.name = f"{PLAN_PREFIX}{uuid.uuid4().hex[:8]}"  # read by the workers
        #: Where the actors keep each batch's rows (beside the plan: Ray Data reads all of its folder).
        self.rows_name = f"{self.name}{ROWS_SUFFIX}"
        self.files: list[str] = []
        self.count = 0
        self._chunk: dict[str, list] = {name: [] for name in self.COLUMNS}

    def add(self, *values: str) -> None:
        """One image: its ``input``, ``path``, ``folder``, ``stem`` and ``methods`` (comma-separated)."""
        for name, value in zip(self.COLUMNS, values, strict=True):
            self._chunk[name].append(os.fsencode(value) if name in self.NAMES else value)
        self.count += 1
        if len(self._chunk["input"]) >= PLAN_CHUNK:
            self.flush()

    def flush(self) -> None:
        """Write the images added since the last file as the next file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._chunk["input"]:
            return
        path = self.folder.path(f"{self.name}/part-{len(self.files):05d}.parquet")
        with device_errors(self.folder.location):
            if not self.files:
                if self.folder.filesystem is None:
                    os.makedirs(self.folder.path(self.name))
                else:
                    self.folder.filesystem.create_dir(self.folder.path(self.name), recursive=True)
            pq.write_table(pa.table(self._chunk), path, filesystem=self.folder.filesystem)
        self.files.append(path)
        for values in self._chunk.values():
            values.clear()

    def entries(self) -> Iterator[tuple[str, str]]:
        """The planned images' inputs and methods, read back file by file."""
        import pyarrow.parquet as pq

        for path in self.files:
            table = pq.read_table(path, columns=["input", "methods"], filesystem=self.folder.filesystem).to_pydict()
            yield from zip(map(os.fsdecode, table["input"]), table["methods"], strict=True)


class DriverManifest:
    """The manifest as the Ray driver writes it: on this machine (in the folder itself, or for a
    folder given by URI in a working copy, uploaded now and then and at the end), rows appended
    as whole lines as they come, with the run's counts, each method's time and the outputs
    failed for memory running out."""

    def __init__(self, folder: OutputFolder, marked):
        self.folder, self.marked = folder, marked  # marked: --labels, each row marked with its label
        if folder.filesystem is None:
            self.path = Path(folder.path(MANIFEST))
        else:
            self.path = Path(tempfile.mkdtemp(prefix="explain-ray-")) / MANIFEST
        self.published = time.monotonic()
        self.stats = {"ok": 0, "skipped": 0, "failed": 0}
        self.out_of_memory = 0  # outputs failed for memory running out
        self.seconds: dict[str, float] = {}  # method -> its time in this run, on the actors

    def start(self, rows: Iterator[dict], keep) -> None:
        """Rewrite the manifest with the earlier ``rows`` that ``keep(row)`` keeps, as skipped,
        each key (input, method, target, concept rank) once (a row kept by an actor may be in the manifest too)."""
        temp = self.path.with_name(f".{MANIFEST}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            written: set[int] = set()
            with device_errors(self.path.parent), open(temp, "w", encoding="utf-8") as file:
                for row in rows:
                    key = hash(row_key(row))
                    if keep(row) and key not in written:
                        written.add(key)
                        file.write(manifest_line(self.marked(dict(row, status="skipped", error=None))) + "\n")
                        self.stats["skipped"] += 1
            os.replace(temp, self.path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise

    def append(self, out, rows: list[dict], report: bool = False) -> None:
        """Rows to the manifest, whole lines in one write (a killed driver leaves at most a
        partial last line, which readers drop and the next run's rewrite removes; a full disk
        none); with ``report``, their failures on stderr too."""
        if not rows:
            return
        rows = [self.marked(row) for row in rows]
        with device_errors(self.path.parent):
            append_whole(out, "".join(manifest_line(row) + "\n" for row in rows).encode("utf-8"))
        if self.folder.filesystem is not None and time.monotonic() - self.published > PUBLISH_SECONDS:
            self.publish()
        reported = set()
        for row in rows:
            self.stats[row["status"]] += 1
            self.out_of_memory += row["status"] == "failed" and out_of_memory_reason(row.get("error") or "")
            if row.get("seconds") is not None:
                self.seconds[row["method"]] = self.seconds.get(row["method"], 0.0) + row["seconds"]
            if report and row["status"] == "failed" and (row["input"], row["error"]) not in reported:
                reported.add((row["input"], row["error"]))
                report_failure(row["input"], row["error"])

    def publish(self) -> None:
        """A folder given by URI: upload the working copy of the manifest."""
        if self.folder.filesystem is not None:
            self.folder.upload(MANIFEST, self.path)
            self.published = time.monotonic()
