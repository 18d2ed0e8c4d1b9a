"""Where a run's outputs go: a local (or shared, mounted) folder, or a folder on any filesystem
that pyarrow reaches by URI (``s3://bucket/run``, ``gs://...``, ``hdfs://...``, ``file:///...``),
with the filesystem's package installed where pyarrow needs one.

Files are written whole: through a temporary file and a rename on a local folder, by a single
put on an object store (which never shows a partial object).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from ..report import atomic_write
from ..errors import UsageError


def is_uri(location) -> bool:
    """Whether ``--out`` names a folder by URI (``scheme://...``) rather than a local path."""
    return "://" in str(location)


class OutputFolder:
    """A run's output folder; names are posix paths relative to it."""

    def __init__(self, location):
        self.location = str(location)
        self.filesystem = None
        if is_uri(location):
            try:
                from pyarrow import fs
            except ImportError:
                raise UsageError(f"--out {location}: folders given by URI need pyarrow (pip install pyarrow, which "
                                 "the `ray` extra brings)") from None
            try:
                self.filesystem, self.root = fs.FileSystem.from_uri(self.location)
            except Exception as error:  # unknown scheme, missing credentials, a package pyarrow lacks
                raise UsageError(f"--out {location}: {error}") from None
        else:
            self.root = os.path.abspath(location)

    def path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}" if self.filesystem else os.path.join(self.root, name)

    def write(self, name: str, data: bytes) -> None:
        if self.filesystem is None:
            path = Path(self.root, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
            return
        path = self.path(name)
        self.filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with self.filesystem.open_output_stream(path) as stream:
            stream.write(data)

    def upload(self, name: str, local_file: Path) -> None:
        """Copy a local file to ``name``, streamed (for a manifest too large to hold)."""
        import shutil

        if self.filesystem is None:
            shutil.copyfile(local_file, self.path(name))
            return
        with open(local_file, "rb") as source, self.filesystem.open_output_stream(self.path(name)) as target:
            shutil.copyfileobj(source, target, length=1 << 20)

    def is_file(self, name: str) -> bool:
        if self.filesystem is None:
            return os.path.isfile(self.path(name))
        from pyarrow import fs

        return self.filesystem.get_file_info(self.path(name)).type == fs.FileType.File

    def lines(self, name: str) -> Iterator[str]:
        """The lines of a text file, read as a stream; none where it does not exist."""
        if not self.is_file(name):
            return
        if self.filesystem is None:
            stream = open(self.path(name), encoding="utf-8", errors="replace")
        else:
            import io

            stream = io.TextIOWrapper(self.filesystem.open_input_stream(self.path(name)), encoding="utf-8",
                                      errors="replace")
        with stream:
            yield from stream

    def remove_folder(self, name: str) -> None:
        if self.filesystem is None:
            import shutil

            shutil.rmtree(self.path(name), ignore_errors=True)
        else:
            try:
                self.filesystem.delete_dir(self.path(name))
            except OSError:
                pass

    def __str__(self) -> str:
        return self.location
