"""The Ray driver's plan of a run under --out (:class:`PlanFiles`, which Ray Data reads; the
manifest is :class:`~explain.batch.manifest_file.ManifestFile`, as on the local engine).
Driver-side: no torch."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

from .inputs import PLAN_PREFIX
from .storage import OutputFolder, device_errors

#: Images per plan file: Ray Data reads the plan file by file, a decode task per file.
PLAN_CHUNK = 1_000
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
