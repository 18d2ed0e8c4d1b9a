"""Where a run's outputs go: a local (or shared, mounted) folder, or a folder on any filesystem
that pyarrow reaches by URI (``s3://bucket/run``, ``gs://...``, ``hdfs://...``, ``file:///...``),
with the filesystem's package installed where pyarrow needs one.

Files are written whole: through a temporary file and a rename on a local folder, by a single
put on an object store (which never shows a partial object).

A write that the folder's device refuses (full, read-only, no permission, an I/O error, over
quota) raises :class:`OutputDeviceError`: every later write would fail the same way, so the
run stops there rather than fail its outputs one by one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from ..errors import Option, UsageError
from ..report import atomic_write

OUT = Option("out")
#: The errors of the output folder's device: a run stops on them.
DEVICE_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO, getattr(errno, "EDQUOT", errno.ENOSPC)})


class OutputDeviceError(Exception):
    """A write to the output folder failed on the device, not on the file: ``cannot write to
    FOLDER: no space left on device``."""

    @classmethod
    def of(cls, location, error: OSError) -> OutputDeviceError:
        return cls(f"cannot write to {location}: {_reason(error)}")


@contextmanager
def device_errors(location) -> Iterator[None]:
    """Raise the device's errors (:data:`DEVICE_ERRNOS`) in writes to ``location`` as
    :class:`OutputDeviceError`."""
    try:
        yield
    except OSError as error:
        if error.errno in DEVICE_ERRNOS:
            raise OutputDeviceError.of(location, error) from error
        raise


def append_whole(file: BinaryIO, data: bytes) -> None:
    """Append ``data`` to ``file`` (opened unbuffered: ``open(path, "ab", buffering=0)``) whole
    or not at all: a write that fails part way (a full disk) is cut off again, so that the file
    never ends in a torn line."""
    start = file.seek(0, os.SEEK_END)
    try:
        view = memoryview(data)
        while view:
            view = view[file.write(view) :]
    except OSError:
        file.truncate(start)
        raise


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
                raise UsageError(
                    OUT,
                    f" {location}: folders given by URI need pyarrow (pip install pyarrow, which "
                    "the `ray` extra brings)",
                ) from None
            try:
                self.filesystem, self.root = fs.FileSystem.from_uri(self.location)
            except Exception as error:  # unknown scheme, missing credentials, a package pyarrow lacks
                raise UsageError(OUT, f" {location}: {error}") from None
        else:
            self.root = os.path.abspath(location)

    def create(self) -> None:
        """Make the folder (and its parents) where it is missing; a usage error where it cannot
        be made or written to (under a file, on a read-only mount, an unknown bucket)."""
        try:
            if self.filesystem is not None:
                self.filesystem.create_dir(self.root, recursive=True)
                return
            os.makedirs(self.root, exist_ok=True)
        except OSError as error:
            raise UsageError(
                OUT, f" {self.location}: cannot create the folder: {_reason(error)}; pass a folder you can write to"
            ) from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            reason = "read-only file system" if _read_only(self.root) else "permission denied"
            raise UsageError(OUT, f" {self.location}: cannot write there: {reason}; pass a folder you can write to")

    def name_max(self, default: int) -> int:
        """The longest name (bytes) the folder's file system takes (``NAME_MAX``); ``default``
        for a folder given by URI or where the system does not say."""
        if self.filesystem is None:
            with suppress(OSError, ValueError, AttributeError):
                return min(default, os.pathconf(self.root, "PC_NAME_MAX"))
        return default

    def path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}" if self.filesystem else os.path.join(self.root, name)

    def shown(self, name: str) -> str:
        """Where ``name`` is, as the user named the folder (a URI keeps its query last)."""
        if self.filesystem is None:
            return os.path.join(self.location, name)
        location, query, options = self.location.partition("?")
        return f"{location.rstrip('/')}/{name}{query}{options}"

    def write(self, name: str, data: bytes) -> None:
        if self.filesystem is None:
            path = Path(self.root, name)
            with device_errors(self.location):
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, data)
            return
        key = self.path(name)
        self.filesystem.create_dir(key.rsplit("/", 1)[0], recursive=True)
        with self.filesystem.open_output_stream(key) as stream:
            stream.write(data)

    def upload(self, name: str, local_file: Path) -> None:
        """Copy a local file to ``name``, streamed (for a manifest too large to hold)."""
        import shutil

        if self.filesystem is None:
            with device_errors(self.location):
                shutil.copyfile(local_file, self.path(name))
            return
        with open(local_file, "rb") as source, self.filesystem.open_output_stream(self.path(name)) as target:
            shutil.copyfileobj(source, target, length=1 << 20)

    def read_text(self, name: str) -> str | None:
        """A small text file's content; None where it does not exist."""
        text = "".join(self.lines(name))
        return text if text or self.is_file(name) else None

    def remove(self, name: str) -> None:
        """Delete a file; nothing where it is gone already."""
        try:
            if self.filesystem is None:
                os.unlink(self.path(name))
            else:
                self.filesystem.delete_file(self.path(name))
        except FileNotFoundError:
            pass

    def names(self, prefix: str, under: str = "") -> list[str]:
        """The names of the files and folders directly in the folder (or in its subfolder
        ``under``) that start with ``prefix``; none where ``under`` does not exist."""
        if self.filesystem is None:
            path = self.path(under) if under else self.root
            return sorted(name for name in os.listdir(path) if name.startswith(prefix)) if os.path.isdir(path) else []
        from pyarrow import fs

        found = self.filesystem.get_file_info(
            fs.FileSelector(self.path(under) if under else self.root, allow_not_found=True)
        )
        return sorted(info.base_name for info in found if info.base_name.startswith(prefix))

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
            stream = open(self.path(name), encoding="utf-8", errors="replace")  # noqa: SIM115 -- closed by the with below
        else:
            import io

            stream = io.TextIOWrapper(
                self.filesystem.open_input_stream(self.path(name)), encoding="utf-8", errors="replace"
            )
        with stream:
            yield from stream

    def remove_folder(self, name: str) -> None:
        if self.filesystem is None:
            import shutil

            shutil.rmtree(self.path(name), ignore_errors=True)
        else:
            with suppress(OSError):
                self.filesystem.delete_dir(self.path(name))

    def __str__(self) -> str:
        return self.location


def _reason(error: OSError) -> str:
    """An OSError's reason as messages say it: ``not a directory``."""
    if not error.errno:  # pyarrow's own: "Bucket 'b' not found. ..."
        return str(error)
    reason = os.strerror(error.errno)
    return reason[:1].lower() + reason[1:]


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def out_folder(out) -> Path:
    """``--out`` as a folder on this machine: one that exists as a file is refused (every
    command that writes a folder of outputs checks it, before torch loads)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(OUT, f" {path} is a file; pass a folder")
    return path
