"""What a batch job shows while it runs and when it ends: a progress bar on a terminal, whole
lines now and then where stderr is a log file, and the summary line of ``explain run``."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

#: Seconds between two progress lines when stderr is not a terminal.
PLAIN_EVERY = 30.0


class PlainProgress:
    """Progress as whole lines, ``explain: 120/1000 images (3.10 images/s)``, at most one every
    :data:`PLAIN_EVERY` seconds: what a log file can hold, where a bar's carriage returns would
    run into the failure lines."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.stream = total, 0, stream or sys.stderr
        self.started = self.shown = time.monotonic()

    def update(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if now - self.shown >= PLAIN_EVERY and self.done < self.total:
            self.shown = now
            rate = self.done / (now - self.started)
            print(f"explain: {self.done}/{self.total} images ({rate:.2f} images/s)", file=self.stream, flush=True)

    def close(self) -> None:
        """Nothing to clear: the summary line follows."""


def progress_bar(total: int, quiet: bool) -> tqdm | PlainProgress:
    """A tqdm bar over ``total`` images on stderr where stderr is a terminal (none when ``quiet``
    or there is nothing to do); elsewhere (a log file, a pipe) :class:`PlainProgress`."""
    if quiet or not total or sys.stderr.isatty():
        return tqdm(total=total, unit="img", disable=quiet or not total, file=sys.stderr, dynamic_ncols=True)
    return PlainProgress(total)


def time_taken(images: int, elapsed: float, failed: int) -> str:
    """The part of a summary line about this run's work: images, seconds and rate where images
    were explained, and no rate where none needed it.

    >>> time_taken(12, 2.0, 0), time_taken(0, 0.01, 0), time_taken(0, 0.01, 2)
    ('12 images in 2.0 s (6.00 images/s)', 'nothing left to do', 'no images explained')
    """
    if not images:
        return "no images explained" if failed else "nothing left to do"
    return f"{images} images in {elapsed:.1f} s ({images / max(elapsed, 1e-9):.2f} images/s)"


def run_summary(stats: dict[str, int], images: int, elapsed: float) -> str:
    """``explain run``'s summary line (without what to look at): outputs done by this run,
    skipped because an earlier run made them, failed; then this run's images and time.

    >>> run_summary({"ok": 0, "skipped": 12, "failed": 0}, 0, 0.02)
    'explain: 0 done now, 12 skipped (done before), 0 failed; nothing left to do'
    """
    return (f"explain: {stats['ok']} done now, {stats['skipped']} skipped (done before), {stats['failed']} failed; "
            f"{time_taken(images, elapsed, stats['failed'])}")
