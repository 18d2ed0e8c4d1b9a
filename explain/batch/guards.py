"""What guards a batch job: one job per output folder (a flock on a local folder, a lease on a
folder given by URI), Pillow's pixel limit, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from PIL import Image

from ..errors import Option, UsageError
from .inputs import RUN_FOLDER_LEASE
from .storage import OutputFolder

#: The lease of a run on a folder given by URI, a JSON object in the folder.
LEASE = RUN_FOLDER_LEASE
#: How long a lease holds unless renewed; the running driver renews it every third of that.
LEASE_SECONDS = 60.0
#: How long a new lease settles before its holder reads it back: of two runs that both found
#: no lease, the one whose write came last keeps it and the other is refused.
LEASE_SETTLE_SECONDS = 1.0


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
                f"another `explain {command}` is writing to {out_dir}; wait for it to finish or pass another ",
                Option("out"),
            ) from None
        yield
    finally:
        os.close(fd)


@contextmanager
def leased_run(folder: OutputFolder, command: str = "run", seconds: float = LEASE_SECONDS) -> Iterator[bool]:
    """:func:`sole_run` for a folder given by URI, where there is no flock: a lease object
    (:data:`LEASE`: owner, host, pid, expiry) that a second run finds and is refused by, renewed
    by a thread while the run goes on and deleted at its end, error and Ctrl-C included. A
    lease that expired, or whose holder on this host is no longer running (killed), is taken
    over. Yields whether it was: a run that did not end left it, and perhaps other leftovers."""
    mine = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}
    left = _refuse_if_held(folder, mine, command)
    _renew(folder, mine, seconds)
    time.sleep(LEASE_SETTLE_SECONDS)
    _refuse_if_held(folder, mine, command)
    stop = threading.Event()
    renewer = threading.Thread(
        target=_keep_renewing, args=(folder, mine, seconds, stop), daemon=True, name="explain-lease"
    )
    renewer.start()
    try:
        yield left
    finally:
        stop.set()
        renewer.join()
        if (_lease_holder(folder) or {}).get("owner") == mine["owner"]:
            folder.remove(LEASE)


def _refuse_if_held(folder: OutputFolder, mine: dict, command: str) -> bool:
    """Raise a usage error where another run holds the lease; whether one that did not end left it."""
    holder = _lease_holder(folder)
    if holder is None or holder.get("owner") == mine["owner"]:
        return False
    if _is_live(holder):
        raise UsageError(
            f"another `explain {command}` (pid {holder.get('pid')} on {holder.get('host')}) is writing to "
            f"{folder}; wait for it to finish or pass another ",
            Option("out"),
            " (the lock of a run that was killed, "
            f"{folder.shown(LEASE)}, lapses {max(0, round(holder['expires'] - time.time()))} s from now)",
        )
    return True


def _lease_holder(folder: OutputFolder) -> dict | None:
    try:
        holder = json.loads(folder.read_text(LEASE) or "null")
    except ValueError:  # a lease cut short: nobody's
        return None
    return holder if isinstance(holder, dict) and isinstance(holder.get("expires"), (int, float)) else None


def _is_live(holder: dict) -> bool:
    if holder["expires"] < time.time():
        return False
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
    return True


def _renew(folder: OutputFolder, mine: dict, seconds: float) -> None:
    folder.write(LEASE, json.dumps(dict(mine, expires=time.time() + seconds)).encode("utf-8"))


def _keep_renewing(folder: OutputFolder, mine: dict, seconds: float, stop: threading.Event) -> None:
    while not stop.wait(seconds / 3):
        try:
            if (_lease_holder(folder) or {}).get("owner") != mine["owner"]:
                # Two runs must not write one folder: this one stops as Ctrl-C stops it.
                print(f"explain: error: another run took over the lock on {folder}; stopping this one", file=sys.stderr)
                signal.raise_signal(signal.SIGINT)
                return
            _renew(folder, mine, seconds)
        except OSError:  # the store did not answer: try again at the next turn
            pass


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


class Terminated(KeyboardInterrupt):
    """SIGTERM, where no :class:`StopFlag` takes it: before a run's first batch (loading the
    model, checking the methods) the command stops as Ctrl-C stops it, with exit status 143."""


def _terminated(signum, frame):
    raise Terminated


@contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the block (in the main thread), and the signal's
    handler is put back after it. (Ray's ``ray.init`` installs handlers of its own: the Ray
    engine enters the block again once Ray is up.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


class StopFlag:
    """The first Ctrl-C or SIGTERM: the running method stops at the next layer of its model (the
    loop's :class:`~explain.pass_listener.PassListener` reads :attr:`set`), the writes
    under way finish, and the run stops (``how``: what the message says of the stop);
    :attr:`signal` says which signal it was (SIGTERM: exit status 143, else 130). A second
    signal of either kind: stop now (``KeyboardInterrupt``)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, how: str = "the running method stops at its next layer; what is finished is kept"):
        self.set = False
        self.signal: int | None = None
        self.how = how
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None] = {}

    @property
    def terminated(self) -> bool:
        """Whether SIGTERM stopped the run."""
        return self.signal == signal.SIGTERM

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt  # a second signal: stop now
        self.set, self.signal = True, signum
        if signum == signal.SIGTERM:
            print(f"\nexplain: terminated: stopping: {self.how} (a second signal stops now)", file=sys.stderr)
        else:
            print(f"\nexplain: stopping: {self.how} (Ctrl-C again to stop now)", file=sys.stderr)

    def __exit__(self, *exc_info):
        for number, previous in self._previous.items():
            if previous is not None:
                signal.signal(number, previous)
