"""Each method's result on a group of images, or the error it raised (or the Ctrl-C that stopped
it), and the time it took; and what a group's results come to: failed manifest rows and files
to write."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torch import Tensor

from ..errors import is_out_of_memory
from ..methods import BaseCAM, explain_together
from ..passes import StopRequested, between_passes
from ..report import ManifestRecord
from .loop import OutOfMemory
from .writing import Job


@dataclass
class Outcome:
    """What explaining a group gave: records that failed, and the files to write (whose records
    say ok or failed once written)."""

    failed: list[ManifestRecord] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)

    def extend(self, other: Outcome) -> None:
        self.failed += other.failed
        self.jobs += other.jobs


#: A CAM estimated to cost at least this many forward passes per image (Score-CAM: one per
#: channel) runs on its own, not in the CAMs' shared pass: its time is its own, and a Ctrl-C
#: within it keeps the results of the CAMs before it.
ALONE_FROM = 16.0


def explain_all(
    cams: list,
    images: Tensor,
    targets,
    topk: int | None = None,
    costs: dict[str, float] | None = None,
    segments: list[Tensor] | None = None,
) -> tuple[list, list[float]]:
    """Each explainer's explanation of ``images``, or the error it raised, and the seconds each
    took: the quick CAMs together, sharing one forward and backward pass (they share its time,
    in proportion to their estimated ``costs``, method -> forward passes per image; equally
    where not given), and where that fails (or for the other methods) each on its own, so that
    an error lands on the method that fails and not on the others. ``segments`` (each image's
    masks) go to every method, which all take them (``Explainer.takes_segments``).

    The first Ctrl-C (:class:`~explain.passes.StopRequested`) ends the group where it comes:
    the method it stopped and those after it get that exception instead of a result, while
    the methods that finished keep theirs."""
    costs = costs or {}
    shared = [cam for cam in cams if isinstance(cam, BaseCAM) and costs.get(cam.name, 0.0) < ALONE_FROM]
    outcome: dict = {}
    seconds: dict = {}
    stopped: StopRequested | None = None
    try:
        started = time.perf_counter()
        outcome.update(zip(shared, explain_together(shared, images, targets, topk=topk), strict=True))
        took = time.perf_counter() - started
        weights = [max(costs.get(cam.name, 1.0), 1e-9) for cam in shared]
        seconds.update((cam, took * weight / sum(weights)) for cam, weight in zip(shared, weights, strict=True))
    except StopRequested as stop:
        stopped = stop
    except Exception:
        pass  # each CAM on its own, below
    between_passes()
    for cam in cams:
        if cam in outcome:
            continue
        if stopped is not None:
            outcome[cam], seconds[cam] = stopped, 0.0
            continue
        started = time.perf_counter()
        try:
            given = {} if segments is None else {"segments": segments}
            outcome[cam] = cam(images, targets, topk=topk, **given)
        except StopRequested as stop:
            outcome[cam] = stopped = stop
        except Exception as error:
            outcome[cam] = error
        seconds[cam] = time.perf_counter() - started
        between_passes()  # the batch job hands back what the method freed, where it grew the heap
    return [outcome[cam] for cam in cams], [seconds[cam] for cam in cams]


def raise_if_out_of_memory(results, images: int) -> None:
    """A group of several images where some method ran out of device memory is explained
    again in halves (:func:`~explain.batch.loop.in_halves`)."""
    if images > 1 and any(isinstance(result, BaseException) and is_out_of_memory(result) for result in results):
        raise OutOfMemory
