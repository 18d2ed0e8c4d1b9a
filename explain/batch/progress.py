"""What a batch job shows while it runs and when it ends: a progress bar on a terminal, whole
lines now and then where stderr is a log file, and the summary line of ``explain run``."""

from __future__ import annotations

import math
import os
import sys
import time

from tqdm import tqdm

from ..errors import UsageError

#: Seconds between two progress lines when stderr is not a terminal (the environment
#: variable EXPLAIN_PROGRESS_EVERY sets others).
PLAIN_EVERY = 30.0


def plain_every() -> float:
    """Seconds between two progress lines: EXPLAIN_PROGRESS_EVERY where set, else :data:`PLAIN_EVERY`."""
    text = os.environ.get("EXPLAIN_PROGRESS_EVERY", "").strip()
    if not text:
        return PLAIN_EVERY
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise UsageError(f"EXPLAIN_PROGRESS_EVERY={text}: give the seconds between progress lines, such as 10")
    return seconds


def _images(count: float) -> str:
    """A count of images, whole or to a tenth (rounded down: 0.97 is not yet 1).

    >>> _images(3), _images(2.97), _images(0.25)
    ('3', '2.9', '0.2')
    """
    tenths = math.floor(count * 10 + 1e-9) / 10
    return f"{tenths:.0f}" if tenths == int(tenths) else f"{tenths:.1f}"


class PlainProgress:
    """Progress as whole lines, ``explain: 120/1000 images (3.10 images/s)``, at most one every
    :func:`plain_every` seconds: what a log file can hold, where a bar's carriage returns would
    run into the failure lines. Within a batch, the line also names the method running and its
    passes: ``explain: 2.4/10 images (0.05 images/s); scorecam 340/1280 passes``."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.stream = total, 0, stream or sys.stderr
        self.every = plain_every()
        self.started = self.shown = time.monotonic()

    def update(self, count: int) -> None:
        self.done += count
        self._show(self.done, "")

    def within(self, images: float, note: str) -> None:
        """``images`` of the running batch are done (a share of it), ``note`` says by what."""
        self._show(self.done + images, note)

    def _show(self, done: float, note: str) -> None:
        now = time.monotonic()
        if now - self.shown >= self.every and done < self.total:
            self.shown = now
            rate = done / max(now - self.started, 1e-9)
            print(
                f"explain: {_images(done)}/{self.total} images ({rate:.2f} images/s){'; ' * bool(note)}{note}",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        """Nothing to clear: the summary line follows."""


class BarProgress:
    """A tqdm bar over the images on stderr, which also moves within a batch (to a tenth of an
    image), its postfix naming the method running and its passes."""

    def __init__(self, total: int, quiet: bool):
        self.bar = tqdm(total=total, unit="img", disable=quiet or not total, file=sys.stderr, dynamic_ncols=True)
        self.done = 0
        self.shown = 0.0

    def update(self, count: int) -> None:
        self.done += count
        self._show(self.done, "", force=True)

    def within(self, images: float, note: str) -> None:
        """``images`` of the running batch are done (a share of it), ``note`` says by what."""
        tenths = math.floor(images * 10) / 10
        self._show(round(self.done + tenths, 1) if tenths else self.done, note)

    def _show(self, done: float, note: str, force: bool = False) -> None:
        if self.bar.disable:
            return
        self.bar.n = done  # set, not added: moves within a batch are not increments
        self.bar.set_postfix_str(note, refresh=False)
        now = time.monotonic()
        if force or now - self.shown >= self.bar.mininterval:
            self.shown = now
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def progress_bar(total: int, quiet: bool) -> BarProgress | PlainProgress:
    """A bar over ``total`` images on stderr where stderr is a terminal (none when ``quiet`` or
    there is nothing to do); elsewhere (a log file, a pipe) :class:`PlainProgress`."""
    if quiet or not total or sys.stderr.isatty():
        return BarProgress(total, quiet)
    return PlainProgress(total)


class WithinBatch:
    """The progress within a batch (told ``(method, passes done, passes in all)`` after each
    inner batch of a method's or metric's call, by the loop's
    :class:`~explain.pass_listener.PassListener`): moves ``progress`` by the share of the batch done,
    from the methods finished (by their estimated ``costs``) and the running call's passes,
    and names that call."""

    def __init__(self, progress: BarProgress | PlainProgress, costs: dict[str, float]):
        self.progress, self.costs = progress, costs
        self.start(0)

    def start(self, images: int) -> None:
        """A batch of ``images`` starts."""
        self.images = images
        self.finished: set[str] = set()
        self.running: str | None = None

    def __call__(self, method: str, done: int, total: int) -> None:
        if self.running not in (None, method):
            self.finished.add(self.running)
        self.running = method
        whole = sum(self.costs.values()) or 1.0
        past = sum(self.costs.get(name, 0.0) for name in self.finished - {method})
        share = (past + self.costs.get(method, 0.0) * done / max(total, 1)) / whole
        self.progress.within(self.images * min(share, 0.99), f"{method} {done}/{total} passes")


def time_taken(images: int, elapsed: float, failed: int) -> str:
    """The part of a summary line about this run's work: images, seconds and rate where images
    were explained, and no rate where none needed it.

    >>> time_taken(12, 2.0, 0), time_taken(0, 0.01, 0), time_taken(0, 0.01, 2)
    ('12 images in 2.0 s (6.00 images/s)', 'nothing left to do', 'no images explained')
    """
    if not images:
        return "no images explained" if failed else "nothing left to do"
    return f"{images} images in {elapsed:.1f} s ({images / max(elapsed, 1e-9):.2f} images/s)"


def method_times(seconds: dict[str, float]) -> str:
    """Each method's time in a run, slowest first.

    >>> method_times({"gradcam": 0.412, "scorecam": 61.23, "ig": 20.1})
    'method times: scorecam 61.2 s, ig 20.1 s, gradcam 0.41 s'
    """
    ranked = sorted(seconds.items(), key=lambda item: item[1], reverse=True)
    return "method times: " + ", ".join(
        f"{name} {time:.1f} s" if time >= 1 else f"{name} {time:.2f} s" for name, time in ranked
    )


def run_summary(
    stats: dict[str, int], images: int, elapsed: float, seconds: dict[str, float] | None = None, where: str = ""
) -> str:
    """``explain run``'s summary line (without what to look at): outputs done by this run,
    skipped because an earlier run made them, failed; then this run's images and time (and
    ``where``, where it explained any), and each method's time in it (``seconds``).

    >>> run_summary({"ok": 0, "skipped": 12, "failed": 0}, 0, 0.02)
    'explain: 0 done now, 12 skipped (done before), 0 failed; nothing left to do'
    >>> run_summary({"ok": 4, "skipped": 0, "failed": 0}, 2, 8.0, {"gradcam": 0.1, "scorecam": 7.5})[56:]
    '2 images in 8.0 s (0.25 images/s); method times: scorecam 7.5 s, gradcam 0.10 s'
    """
    text = (
        f"explain: {stats['ok']} done now, {stats['skipped']} skipped (done before), {stats['failed']} failed; "
        f"{time_taken(images, elapsed, stats['failed'])}{where if images else ''}"
    )
    return f"{text}; {method_times(seconds)}" if seconds else text


def label_summary(rows) -> str:
    """With ``--labels``: how many of the labelled images the model got wrong, for the end of
    the summary line ("" where no row has a verdict), from the manifest ``rows`` (a list or a
    stream). An image counts once, however many methods and targets its rows are for.

    >>> rows = [{"input": "a.png", "correct": False}, {"input": "a.png", "correct": False},
    ...         {"input": "b.png", "correct": True}, {"input": "c.png", "correct": None}]
    >>> label_summary(rows)
    '; labels: 1 of 2 labelled images predicted wrong (index.html filters them)'
    """
    verdicts: dict[int, bool] = {}  # by the input's hash: a stream of millions of rows holds no names
    for row in rows:
        if row.get("correct") is not None:
            key = hash(row.get("input"))
            verdicts[key] = verdicts.get(key, True) and bool(row["correct"])
    if not verdicts:
        return ""
    wrong = sum(not right for right in verdicts.values())
    return f"; labels: {wrong} of {len(verdicts)} labelled images predicted wrong (index.html filters them)"
