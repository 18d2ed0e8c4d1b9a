"""What guards a batch job: one job per output folder, Pillow's pixel limit, and Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import Image

from ..errors import UsageError


@contextmanager
def sole_run(out_dir: Path, command: str = "run") -> Iterator[None]:
    """Hold a lock on ``out_dir`` for the run: a second run there would delete this one's
    temporary files and both would rewrite the manifest. The kernel drops the lock when the
    process ends, even by SIGKILL, so it never goes stale. Where there is no flock (Windows),
    runs are not locked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(
                f"another `explain {command}` is writing to {out_dir}; wait for it to finish or pass another --out"
            ) from None
        yield
    finally:
        os.close(fd)


@contextmanager
def pixel_limit(max_pixels: int | None) -> Iterator[None]:
    """Pillow's decompression-bomb limit for the run (0: none), restored afterwards."""
    previous = Image.MAX_IMAGE_PIXELS
    set_pixel_limit(max_pixels)
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def set_pixel_limit(max_pixels: int | None) -> None:
    """Pillow's decompression-bomb limit in this process (0: none; None: leave Pillow's)."""
    if max_pixels is not None:
        Image.MAX_IMAGE_PIXELS = max_pixels or None


class StopFlag:
    """First Ctrl-C: finish the current batch, then stop. Second Ctrl-C: stop now."""

    def __init__(self):
        self.set = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.set = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nexplain: stopping after the current batch (Ctrl-C again to stop now)", file=sys.stderr)

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
