"""Each method's result on a group of images, or the error it raised, and what a group's
results come to: failed manifest rows and files to write."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from ..methods import BaseCAM, explain_together
from ..errors import is_out_of_memory
from .loop import OutOfMemory
from .writing import Job


@dataclass
class Outcome:
    """What explaining a group gave: rows that failed, and the files to write (whose rows say
    ok or failed once written)."""

    failed: list[dict] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)

    def extend(self, other: Outcome) -> None:
        self.failed += other.failed
        self.jobs += other.jobs


def explain_all(cams: list, images: Tensor, targets, topk: int | None = None) -> list:
    """Each explainer's explanation of ``images``, or the error it raised: the CAMs together,
    sharing one forward and backward pass, and where that fails (or for the other methods)
    each on its own, so that an error lands on the method that fails and not on the others."""
    shared = [cam for cam in cams if isinstance(cam, BaseCAM)]
    outcome: dict = {}
    try:
        outcome.update(zip(shared, explain_together(shared, images, targets, topk=topk)))
    except Exception:
        pass  # each CAM on its own, below
    for cam in cams:
        if cam not in outcome:
            try:
                outcome[cam] = cam(images, targets, topk=topk)
            except Exception as error:
                outcome[cam] = error
    return [outcome[cam] for cam in cams]


def raise_if_out_of_memory(results, images: int) -> None:
    """A group of several images where some method ran out of device memory is explained
    again in halves (:func:`~explain.batch.loop.in_halves`)."""
    if images > 1 and any(isinstance(result, BaseException) and is_out_of_memory(result) for result in results):
        raise OutOfMemory
