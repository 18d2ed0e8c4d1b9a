"""The Ray driver's side of the stream of rows (:func:`~explain.batch.ray_stages.explain_plan`)
and of a stop: the stream read by a thread, so that the driver answers Ctrl-C while it waits
for the actors; the stop asked of the actors through the run's rows folder; and the rows the
actors kept there whose batches the driver did not receive, read back into the manifest.

The actors keep each batch's rows in a file of the rows folder once its files are written
(:class:`~explain.batch.ray_stages.WriteActor`), and the driver removes the file once the rows
are in the manifest: what the folder holds are rows the manifest lacks. A first Ctrl-C (or
SIGTERM) writes the stop file there; the actors' methods stop at their next layer, each call
under way writes what finished and its rows, and the driver waits for the calls' ``.busy``
files to go (at most :data:`STOP_GRACE_SECONDS`; a second Ctrl-C ends the wait), then reads the
kept rows into the manifest. Driver-side: no torch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from contextlib import suppress

from ..report import iter_json_records
from .manifest import is_well_formed
from .storage import OutputFolder

#: The file in a run's rows folder by which its driver asks the actors to stop (its first
#: Ctrl-C or SIGTERM): a call that finds it explains nothing more.
STOP_FILE = "STOP"
#: The end of the name of the file an actor's call keeps in the rows folder while it works,
#: so that a stopping driver waits for the calls under way to write what they finished.
BUSY_SUFFIX = ".busy"
#: The end of the names of the files of rows the actors keep in the rows folder.
ROWS_FILE_SUFFIX = ".jsonl"
#: How long a stopping driver waits for the actors' calls under way (their methods stop at the
#: next layer; they write what finished): a call that outlasts it is the next run's to redo.
STOP_GRACE_SECONDS = 60.0
#: How often a stopping driver looks for the calls under way.
BUSY_LOOK_SECONDS = 0.1
#: How long the driver waits at a time for the stream, between two looks at Ctrl-C.
WAIT_SECONDS = 0.1
#: How long a stopped driver waits for the stream's thread to close Ray Data's execution.
CLOSE_SECONDS = 5.0

_END = object()


class Stream:
    """The items of an iterable (the rows of :class:`~explain.batch.ray_stages.ExplainedPlan`),
    read by a daemon thread into a short queue: :meth:`get` waits a bounded time, so the caller
    answers Ctrl-C at once. :meth:`close` ends the iterable's execution where it can
    (``shutdown()``: Ray Data's, its actors killed), else the thread stops at its next item,
    and waits for the thread at most ``wait`` seconds; :attr:`ended` says whether it did."""

    def __init__(self, items: Iterable):
        self._items = items
        self._queue: queue.Queue = queue.Queue(maxsize=4)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True, name="explain-ray-stream")
        self._thread.start()

    @property
    def ended(self) -> bool:
        """Whether the thread has ended (the iterable's execution with it)."""
        return not self._thread.is_alive()

    def _read(self) -> None:
        items = iter(self._items)
        try:
            for item in items:
                if not self._put((item, None)):
                    break
        except BaseException as error:  # handed to the reader, which raises it
            self._put((None, error))
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                with suppress(Exception):  # the execution is going away anyway
                    close()
        self._put((_END, None))

    def _put(self, item) -> bool:
        """Queue ``item`` unless the stream is closing; whether it was queued."""
        while not self._closing.is_set():
            try:
                self._queue.put(item, timeout=WAIT_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def get(self, timeout: float = WAIT_SECONDS):
        """The next item; :data:`None` where none came within ``timeout``; raises
        ``StopIteration`` at the end, and what the iterator raised."""
        try:
            item, error = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if error is not None:
            raise error
        if item is _END:
            raise StopIteration
        return item

    def close(self, wait: float = CLOSE_SECONDS) -> None:
        """End the iterable's execution and the thread; wait for it at most ``wait`` seconds."""
        self._closing.set()
        shutdown = getattr(self._items, "shutdown", None)
        if shutdown is not None:
            with suppress(Exception):  # e.g. Ray already gone
                shutdown()
        self._thread.join(wait)


def ask_actors_to_stop(folder: OutputFolder, rows_folder: str) -> None:
    """Write the stop file that the actors look for (:class:`~explain.batch.ray_stages.StopMarker`)."""
    folder.write(f"{rows_folder}/{STOP_FILE}", b"")


def calls_under_way(folder: OutputFolder, rows_folder: str) -> int:
    """How many actors' calls are under way (their ``.busy`` files)."""
    return sum(name.endswith(BUSY_SUFFIX) for name in folder.names("", under=rows_folder))


def kept_row_files(folder: OutputFolder, rows_folder: str) -> list[str]:
    """The files of rows the actors kept in ``rows_folder`` (names relative to ``folder``)."""
    return [f"{rows_folder}/{name}" for name in folder.names("", under=rows_folder) if name.endswith(ROWS_FILE_SUFFIX)]


def kept_rows(folder: OutputFolder, name: str, received: Collection[int] = ()) -> list[dict]:
    """The well-formed rows of one file of kept rows (a line cut short by a kill is dropped),
    but those of inputs whose hash is in ``received`` (a killed actor's batch that Ray redid:
    its rows came back through the stream)."""
    rows = (row for row in iter_json_records(folder.lines(name)) if is_well_formed(row))
    return [row for row in rows if hash(row["input"]) not in received]


def kept_lines(folder: OutputFolder, rows_folder: str) -> Iterator[str]:
    """The lines of every file of rows kept in ``rows_folder``, file by file."""
    for name in kept_row_files(folder, rows_folder):
        yield from folder.lines(name)


def wait_for_calls(folder: OutputFolder, rows_folder: str, receive, grace: float = STOP_GRACE_SECONDS) -> bool:
    """Wait until the actors' calls under way have ended (at most ``grace`` seconds), calling
    ``receive()`` between looks (the driver takes in the rows that arrive meanwhile); whether
    they all ended."""
    deadline = time.monotonic() + grace
    while calls_under_way(folder, rows_folder):
        if time.monotonic() > deadline:
            return False
        receive()
    return True
