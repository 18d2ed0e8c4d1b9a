"""What the commands share: exit codes, usage errors, option types, and the guards of an output folder
(one run at a time, Pillow's pixel limit)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import Image

from ..errors import UsageError
from ..options import LOCALISATION_METRICS


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_OUT_OF_MEMORY, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


MANIFEST = "manifest.jsonl"


#: Metrics that need --regions, and those that take --step.
LOCALISATION = LOCALISATION_METRICS


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _safe(text: str) -> str:
    return re.sub(r"[^\w.+-]+", "_", text).strip("_")[:48] or "class"


@contextmanager
def _sole_run(out_dir: Path, command: str = "run") -> Iterator[None]:
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
def _pixel_limit(max_pixels: int | None) -> Iterator[None]:
    """Pillow's decompression-bomb limit for the run (0: none), restored afterwards."""
    previous = Image.MAX_IMAGE_PIXELS
    if max_pixels is not None:
        Image.MAX_IMAGE_PIXELS = max_pixels or None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def manifest_row(input: str, method: str, target: str, layer: str, settings: str, task: str, **values) -> dict:
    """A manifest row of ``explain run`` (one output: an image, a method, a target), the
    columns not given left empty."""
    row = dict.fromkeys(("target_id", "target_name", "target_probability", "predicted_id", "predicted_name",
                         "predicted_probability", "output", "maps", "error", "metrics", "region"))
    row.update(input=input, method=method, layer=layer, target=target, settings=settings, task=task)
    row.update(values)
    return row


def is_complete(row: dict | None, exists: Callable[[str], bool], settings: str | None, layer: str | None,
                save_maps: bool, metric_columns: list[str]) -> bool:
    """Whether an earlier run's row is an output this run would make again: done with the same
    settings and layer, its files there (``exists(name)``), its metric values there."""
    return bool(
        row and row.get("status") in ("ok", "skipped")
        and row.get("settings") == settings and row.get("layer") == layer
        and row.get("output") and exists(row["output"])
        and (not save_maps or (row.get("maps") and exists(row["maps"])))
        and all(column in (row.get("metrics") or {}) for column in metric_columns)
    )


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
