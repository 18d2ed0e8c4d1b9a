"""Explaining one group of decoded images with every method still to run on them, into failed
manifest rows and overlays to write: the code both engines call, the local one from its loader
loop, the Ray actors from theirs. What the task changes (the classes of a classifier, the
regions or boxes of a segmentation or detection model) is a strategy of
:mod:`~explain.batch.task_outputs`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import Tensor

from ..errors import failure_reason, is_out_of_memory
from ..evaluation import score
from ..report import TEMP_NAME_BYTES
from .decoding import ModelInputs
from .inputs import Source
from .kinds import FileInputs, file_kind
from .loop import in_halves
from .manifest import NAME_MAX, fitted_path, manifest_row, safe_name
from .method_results import Outcome, raise_if_out_of_memory
from .preparation import PreparedRun
from .storage import OutputFolder
from .task_outputs import outputs_for


def report_nothing(where: str, error: str) -> None:
    """The Ray actors' reporter: the driver reports the failed rows it receives."""


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
        self.reported: set[str] = set()  # metric failures are reported once each
        self.outputs = outputs_for(prepared.task)
        #: The longest output file name, in bytes: the output folder's limit, less what the
        #: name of the temporary file that writes it adds.
        self.name_limit = OutputFolder(self.options.out).name_max(NAME_MAX) - TEMP_NAME_BYTES

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
        try:
            model_input = self.inputs.model_input(images.to(self.loaded.device, non_blocking=True))
            pictures = self.inputs.pictures(images, model_input)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            raise_if_out_of_memory([error], len(work))  # several images: explained in halves
            outcome = Outcome()
            for cam in self.pending(work):
                self.fail(outcome, work, range(1), cam, failure_reason(error))
            return outcome
        return self.outputs.explain(self, work, model_input, pictures)

    # -- what the strategies share

    def pending(self, work: list[tuple[Source, list]]) -> list:
        """The explainers that some image of ``work`` still needs, in the run's order."""
        return [cam for cam in self.prepared.explainers if any(cam in cams for _, cams in work)]

    def row(self, source_input: str, method: str, label: str, **values) -> dict:
        prepared = self.prepared
        return manifest_row(
            source_input, method, label, prepared.layers[method], prepared.settings[method], prepared.task, **values
        )

    def failed_rows(self, source: Source, method: str, error: str) -> list[dict]:
        """A failed row per target of the run."""
        return [
            self.row(source.input, method, label, status="failed", error=error) for label in self.prepared.target.labels
        ]

    def fail(
        self, outcome: Outcome, work: list[tuple[Source, list]], positions, cam, error: str, reported: str | None = None
    ) -> None:
        """``cam`` failed on the images at ``positions`` that still need it: their rows fail with
        ``error``, and each is reported (with ``reported``, where the report says it otherwise)."""
        for j in positions:
            source, cams = work[j]
            if cam in cams:
                self.report(source.input, f"{cam.name}: {error if reported is None else reported}")
                outcome.failed += self.failed_rows(source, cam.name, error)

    def output_names(self, source: Source, method: str, what: str) -> tuple[str, str | None]:
        """The overlay's file name for one target (``what``: its id and name, or the box) and the
        image's .npz (with --save-maps). A name past the file system's limit (with the
        temporary file's name that writes it) is shortened by :func:`~explain.batch.manifest.fitted_path`:
        the same on every run, so that a rerun finds it."""
        maps = (
            fitted_path(source.folder, source.stem, f"__{safe_name(method)}.npz", self.name_limit)
            if self.options.save_maps
            else None
        )
        suffix = ".png" if self.kind is None else self.kind.suffix(source.path)
        return fitted_path(source.folder, source.stem, f"__{safe_name(method)}__{what}{suffix}", self.name_limit), maps

    def drawing(self, source: Source):
        """How the maps of ``source`` are drawn, for :class:`~explain.batch.writing.Job`: None
        for images (overlays), else its kind's."""
        return None if self.kind is None else partial(self.kind.draw, source.path)

    def scores(self, cam, images: Tensor, result) -> dict[tuple[int, int], dict]:
        """--metrics for one method's explanation of a batch: {(image, target rank): {column: value}};
        a metric that fails is reported (once) and left out."""
        if not self.prepared.metrics:
            return {}
        found = score(cam, images, result, self.prepared.metrics, options=self.prepared.metric_options, method=cam.name)
        for failure in found.failures:
            message = f"{cam.name} {failure['metric']}: {failure['error']}"
            if message not in self.reported:
                self.reported.add(message)
                self.report("--metrics", message)
        values: dict[tuple[int, int], dict] = {}
        for row in found.rows:
            values.setdefault((row["image"], row["rank"]), {})[row["metric"]] = round(row["value"], 6)
        return values
