"""The one loader loop of the batch jobs (``explain run`` and ``explain evaluate``): images decoded
in DataLoader workers, a batch at a time, with a progress bar that moves within a batch as the
methods run their passes, the run's memory budget (``--max-memory``), Ctrl-C (the running method
stops after its current inner batch, then the run; twice: stop now) and glibc's heap kept for the
next batch (trimmed where a batch's passes grow it); and out-of-memory halving, which the Ray actors use too."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from ..heap import ReusedHeap
from ..passes import PassListener, StopRequested, pass_settings
from .decoding import DecodedBatch, ModelInputs, collate, init_worker
from .guards import StopFlag, Terminated
from .kinds import FileInputs
from .progress import WithinBatch, progress_bar


class OutOfMemory(Exception):
    """A group of images ran out of device memory: :func:`in_halves` explains it in halves."""


def in_halves(function: Callable, members: list, images: Tensor, device: torch.device) -> list:
    """``[function(members, images)]``; where that raises :class:`OutOfMemory` on more than one
    image, each half again, down to single images (on one image, out of memory is that image's
    failure, which ``function`` records). Nothing of a group that ran out is returned."""
    try:
        return [function(members, images)]
    except OutOfMemory:
        if len(members) < 2:
            raise
        if device.type == "cuda":
            torch.cuda.empty_cache()
        half = len(members) // 2
        return in_halves(function, members[:half], images[:half], device) + in_halves(
            function, members[half:], images[half:], device
        )


class LoopListener(PassListener):
    """What the loop hears of the methods' passes: each inner batch moves the bar within the
    batch (``within``), the first Ctrl-C (``stop``) stops the running method there, and the
    heap is trimmed between them where they grew it (``heap``)."""

    asked_at_layers = True

    def __init__(self, within: WithinBatch, stop: StopFlag, heap: ReusedHeap):
        self.within, self.stop, self.heap = within, stop, heap

    def advanced(self, method: str, done: int, total: int) -> None:
        self.within(method, done, total)

    def should_stop(self) -> bool:
        return self.stop.set

    def between(self) -> None:
        self.heap.after_passes()


@dataclass
class LoopEnd:
    """How the loop ended: images done (decoded or failed), whether Ctrl-C stopped it (``forced``:
    a second Ctrl-C, which stopped it at once), the time."""

    images: int = 0
    interrupted: bool = False
    forced: bool = False
    elapsed: float = 0.0
    #: Whether SIGTERM stopped it (exit status 143, not 130).
    terminated: bool = False


def for_each_batch(
    paths: list[str],
    inputs: ModelInputs | FileInputs,
    loaded,
    options,
    handle: Callable[[DecodedBatch], None],
    after: Callable[[], None] = lambda: None,
    costs: dict[str, float] | None = None,
) -> LoopEnd:
    """Decode ``paths`` in ``options.workers`` processes and call ``handle`` on each batch (its
    ``failures`` hold the positions in ``paths`` that could not be decoded, its ``groups`` the
    decoded images by shape), then ``after``; either way the loop returns how far it got.

    The methods and metrics that ``handle`` calls run under ``options.max_memory`` and show no
    bars of their own: the loop's bar moves within a batch as they run (by their estimated
    ``costs`` per image, method -> forward passes) and names the one running. Ctrl-C makes the
    running method stop after its current inner batch (:class:`~explain.passes.StopRequested`,
    which leaves that batch unfinished) and ends the loop; a second Ctrl-C ends it at once."""
    batch_size = 1 if loaded.fixed_batch else options.batch_size
    loader = torch.utils.data.DataLoader(
        inputs.dataset(paths, loaded.example),
        batch_size=batch_size,
        num_workers=options.workers,
        collate_fn=collate,
        pin_memory=loaded.device.type == "cuda",
        worker_init_fn=partial(init_worker, options.max_pixels),
    )
    progress = progress_bar(len(paths), options.quiet)
    within = WithinBatch(progress, costs or {})
    end = LoopEnd()
    started = time.perf_counter()
    stop = StopFlag()
    try:
        with (
            stop,
            ReusedHeap() as heap,
            pass_settings(max_memory=options.max_memory, progress=False, listener=LoopListener(within, stop, heap)),
        ):
            for batch in loader:
                count = len(batch.failures) + sum(len(indices) for indices, _ in batch.groups)
                within.start(count)
                handle(batch)
                after()
                end.images += count
                progress.update(count)
                heap.after_batch()
                if stop.set:
                    end.interrupted = True
                    break
    except StopRequested:  # the first Ctrl-C, within a method: what was finished is kept
        end.interrupted = True
    except KeyboardInterrupt as interrupt:
        end.interrupted = end.forced = True
        end.terminated = isinstance(interrupt, Terminated)
    finally:
        progress.close()
        end.elapsed = time.perf_counter() - started
        end.terminated = end.terminated or stop.terminated
    return end
