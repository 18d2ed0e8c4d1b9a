"""Explaining one group of decoded images with every method still to run on them, into failed
manifest records and overlays to write: the code both engines call, the local one from its
loader loop, the Ray actors from theirs. What the task changes (the classes of a classifier,
the regions or boxes of a segmentation or detection model) is a strategy of
:mod:`~explain.batch.task_outputs`, which returns what it made; the records and files are
:class:`~explain.batch.outputs.OutputBuilder`'s."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..errors import failure_reason, is_out_of_memory
from ..report import ManifestRecord
from .decoding import ModelInputs
from .inputs import Source
from .kinds import FileInputs, file_kind
from .loop import in_halves
from .method_results import Outcome, raise_if_out_of_memory
from .outputs import Explained, Failure, OutputBuilder
from .preparation import PreparedRun
from .scoring import MetricScorer
from .task_outputs import outputs_for


def report_nothing(where: str, error: str) -> None:
    """The Ray actors' reporter: the driver reports the failed rows it receives."""


def pending(explainers: list, work: list[tuple[Source, list]]) -> list:
    """The explainers that some image of ``work`` still needs, in the run's order."""
    return [cam for cam in explainers if any(cam in cams for _, cams in work)]


class GroupExplainer:
    """The run's explainers applied to groups of images, with the run's settings.

    ``report(where, error)`` is told each failure as it happens (the local engine prints it).
    """

    def __init__(self, prepared: PreparedRun, report: Callable[[str, str], None] = report_nothing):
        self.prepared, self.options, self.loaded = prepared, prepared.options, prepared.loaded
        self.kind = file_kind(prepared.loaded.kind)  # None: images
        self.inputs: ModelInputs | FileInputs = (
            ModelInputs(prepared.loaded.preprocess)
            if self.kind is None
            else FileInputs(self.kind, prepared.loaded.preprocess)
        )
        self.report = report
        self.records = prepared.records
        self.outputs = outputs_for(prepared, MetricScorer(prepared.metrics, prepared.metric_options, report))
        self.builder = OutputBuilder(self.records, self.options, self.kind)

    def explain(self, work: list[tuple[Source, list]], images: Tensor) -> Outcome:
        """Explain ``images`` (one decoded group, as the decode step gives it) with, per image,
        ``work``'s source and the explainers still to run on it. Where a group runs out of
        device memory, each half again, down to single images (an image that alone does not fit
        fails with the reason); nothing of a group that ran out is returned twice."""
        outcome = Outcome()
        for part in in_halves(self._explain_once, work, images, self.loaded.device):
            outcome.extend(part)
        return outcome

    def _explain_once(self, work: list[tuple[Source, list]], images: Tensor) -> Outcome:
        cams = pending(self.prepared.explainers, work)
        try:
            model_input = self.inputs.model_input(images.to(self.loaded.device, non_blocking=True))
            pictures = self.inputs.pictures(images, model_input)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            raise_if_out_of_memory([error], len(work))  # several images: explained in halves
            return self._outcome(work, None, Explained([], [Failure([0], cam, failure_reason(error)) for cam in cams]))
        return self._outcome(work, pictures, self.outputs.explain(work, model_input, pictures, cams))

    def _outcome(self, work: list[tuple[Source, list]], pictures, found: Explained) -> Outcome:
        """The failed records (each reported) and the files to write of what the strategy found."""
        outcome = Outcome()
        for failure in found.failures:
            for j in failure.positions:
                source, cams = work[j]
                if failure.cam in cams:
                    name = failure.cam.name  # type: ignore[attr-defined]
                    said = failure.error if failure.reported is None else failure.reported
                    self.report(source.input, f"{name}: {said}")
                    outcome.failed += self.failed_records(source, name, failure.error)
        outcome.jobs += [
            self.builder.job(work[image.position][0], image, pictures[image.position]) for image in found.outputs
        ]
        return outcome

    def failed_records(self, source: Source, method: str, error: str) -> list[ManifestRecord]:
        """A failed record per target of the run."""
        return self.records.failed(source.input, method, self.prepared.target.labels, error)
