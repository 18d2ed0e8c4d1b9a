"""glibc heap settings for long CPU runs: fast repeated forward passes, bounded memory.

By default glibc maps every block over 32 MiB afresh and unmaps it when freed, so each CPU
forward pass page-faults its large activations in again. :class:`ReusedHeap` keeps freed
memory for reuse instead and, because a heap that is never given back fragments and creeps
upwards over thousands of batches, hands free pages back whenever the resident size grows
past the level it had after the first batches, or, within a batch, whenever the heavy methods'
passes leave it more than :data:`PASS_ROOM` above where the run started. Only the command line uses it, as a
context manager: a library must not change its host process's allocator, and a command
run from Python (``explain.cli.main``) gives the process back glibc's initial settings and
the kept memory when it ends. (glibc's thresholds start at 128 KiB and then follow the
sizes freed; ``mallopt`` can set them back but cannot restart that adjustment.)

Measured by ``benchmarks/bench_cli.py`` on this project's 2-core machine (bundled model,
Grad-CAM, 1,000 images): glibc's defaults 30 images/s with flat memory; keeping freed
memory alone 46 images/s but peak RSS +6 to +20 % from image 100 to 1,000; with the
trimming below about 44 images/s and +1 to +3.5 %. Score-CAM on one photo (676 masked passes):
13 s with glibc's defaults, 12 s with freed memory kept, where the heap would otherwise hold
on to every size its inner batches and the search for the fastest one ever used (1.0 GB
above the start after ``--method all``'s first methods).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["PASS_ROOM", "ReusedHeap"]

#: Bytes of freed memory a batch's passes may keep above the resident size the run started at.
PASS_ROOM = 256 * 2**20

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: glibc's initial M_TRIM_THRESHOLD and M_MMAP_THRESHOLD.
_GLIBC_DEFAULTS = {_M_TRIM_THRESHOLD: 128 * 1024, _M_MMAP_THRESHOLD: 128 * 1024}


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _resident_pages() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1])


def _page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


class ReusedHeap:
    """Keep freed memory in this process's heap; trim it back when it creeps up.

    Call :meth:`after_batch` after each batch. The largest resident size over the first
    ``warmup`` batches is the reference; after that, a batch that ends more than ``slack``
    above it returns the heap's free pages to the system (``malloc_trim``). Where the C
    library is not glibc, ``enabled`` is False and nothing changes.

    Within a batch, call :meth:`after_passes` after each inner batch of a heavy method's
    passes and after each method: where the resident size has grown more than ``room`` bytes
    above the one at the start (after the setup's freed memory is handed back), and above
    the reference once there is one, the heap is trimmed then, so that one long batch of
    many methods does not keep every size that any of them used.

    As a context manager it puts glibc's initial thresholds back on leaving the block and
    returns the kept memory to the system.

    >>> with ReusedHeap() as heap:
    ...     heap.after_batch()
    """

    def __init__(self, warmup: int = 4, slack: float = 0.01, room: int = PASS_ROOM):
        self.warmup, self.slack = warmup, slack
        self.batches = self.trims = 0
        self.reference = 0
        self._libc = _glibc()
        one_gib = 1 << 30
        self.enabled = bool(
            self._libc
            and self._libc.mallopt(_M_MMAP_THRESHOLD, one_gib)
            and self._libc.mallopt(_M_TRIM_THRESHOLD, one_gib)
        )
        self.floor = self.ceiling = 0
        if self.enabled:
            self._trim()  # what the setup freed (the methods' checks) goes back first
            self.floor = _resident_pages()
            self.ceiling = self.floor + room // _page_size()

    def __enter__(self) -> ReusedHeap:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Put glibc's initial thresholds back and hand the kept memory back."""
        if not self.enabled or self._libc is None:
            return
        self.enabled = False
        for option, value in _GLIBC_DEFAULTS.items():
            self._libc.mallopt(option, value)
        self._libc.malloc_trim(0)

    def after_passes(self) -> None:
        """An inner batch of passes (or a method) ended: trim where the heap has grown past
        the room, or past the level of the first batches where that is higher (a run whose
        batches need more than the room keeps what they need)."""
        if not self.enabled:
            return
        ceiling = max(self.ceiling, int(self.reference * (1 + self.slack)))
        if _resident_pages() > ceiling:
            self._trim()
            self.trims += 1

    def after_batch(self) -> None:
        if not self.enabled:
            return
        self.batches += 1
        resident = _resident_pages()
        if self.batches <= self.warmup:
            self.reference = max(self.reference, resident)
        elif resident > self.reference * (1 + self.slack):
            self._trim()
            self.trims += 1

    def _trim(self) -> None:
        """Hand the heap's free pages back to the system (enabled implies glibc)."""
        if self._libc is not None:
            self._libc.malloc_trim(0)
