"""The job interface of the local engine: a dataset-scale command (``explain run``, ``explain
evaluate``, and the next ones) as a :class:`DatasetJob`, the steps of its own: inputs -> plan ->
groups of decoded images -> records -> files; and :func:`run_job`, what every job is given: the
one loader loop (:func:`~explain.batch.loop.for_each_batch`: decoding, progress, the memory
budget, Ctrl-C and SIGTERM), the output device's refusal (a full disk: what was written is
kept), the summary line and the exit status (:func:`~explain.batch.outcome.exit_code`).

A new command writes a :class:`DatasetJob` (its plan, what a group becomes, its files) and
calls :func:`run_job`; it touches neither the loop nor the other jobs. Out-of-memory halving is
:func:`~explain.batch.loop.in_halves`, which a job's :meth:`~DatasetJob.group` calls."""

from __future__ import annotations

import sys

from torch import Tensor

from ..models import LoadedModel
from .decoding import DecodedBatch, ModelInputs
from .inputs import Source
from .kinds import FileInputs
from .loop import LoopEnd, for_each_batch
from .options import ModelOptions
from .outcome import exit_code, interrupted_summary, out_of_memory_note, stopped_summary
from .storage import OutputDeviceError


class DatasetJob:
    """One run of a dataset-scale command on the local engine. :func:`run_job` calls, in order:
    :meth:`plan` (the work left, by source index), :meth:`begin`, then per decoded batch
    :meth:`failed_input` for each image that could not be decoded, :meth:`group` for each group
    of decoded images and :meth:`batch_done`, and :meth:`between_batches`; at the end
    :meth:`drain` (unless a second Ctrl-C forced the stop), :meth:`stop`, :meth:`finish` (the
    files written from what was done), :meth:`report` and the summary line. A job implements
    :meth:`plan`, :meth:`failed_input`, :meth:`group`, :meth:`finish`, :attr:`failed` and
    :meth:`summary`; the other steps do nothing unless it says otherwise."""

    sources: list[Source]
    #: the model (a :class:`~explain.models.LoadedModel`), the job's options (batch size,
    #: workers, --max-memory, --quiet, --max-pixels) and each method's estimated cost per image
    loaded: LoadedModel
    options: ModelOptions
    costs: dict[str, float]
    inputs: ModelInputs | FileInputs
    #: Outputs that failed for memory running out (exit status 3 where no other failure counts more).
    out_of_memory: int = 0

    def plan(self) -> dict:
        """{source index: what is left to do on it}; the inputs that failed before decoding
        recorded as failed. Raising :class:`~explain.batch.storage.OutputDeviceError` stops the
        job before any image."""
        raise NotImplementedError

    def begin(self) -> None:
        """Before the first batch (the first files written: a killed job leaves them)."""

    def failed_input(self, index: int, error: str) -> None:
        """The source at ``index`` could not be decoded: its work fails with ``error``."""
        raise NotImplementedError

    def group(self, indices: list[int], images: Tensor) -> None:
        """The sources at ``indices``, decoded as ``images`` (one size): explain or score them,
        record what they gave, queue or write their files."""
        raise NotImplementedError

    def batch_done(self) -> None:
        """After each batch's groups."""

    def between_batches(self) -> None:
        """Between batches (the reports rewritten now and then)."""

    def drain(self) -> None:
        """After the loop, unless a second Ctrl-C stopped it: wait for the files still being written."""

    def stop(self) -> OutputDeviceError | None:
        """However the loop ended: stop the writers; the device's error if one of them met it."""
        return None

    def finish(self, end: LoopEnd, completed: bool, summary: str) -> None:
        """Write the job's files from what it did (``summary``: its last line, for index.html)."""
        raise NotImplementedError

    def report(self) -> None:
        """What the job prints before its summary line (a table of the results)."""

    @property
    def failed(self) -> int:
        """How many outputs failed (exit status 1 where none counts more)."""
        raise NotImplementedError

    def summary(self, end: LoopEnd) -> str:
        """The job's last line, ``explain: ...``, from how far the loop got."""
        raise NotImplementedError


def run_job(job: DatasetJob) -> int:
    """Run ``job`` on this machine; its exit status."""
    try:
        pending = job.plan()
    except OutputDeviceError as error:  # the files keep their last whole version
        print(f"explain: error: {error}", file=sys.stderr)
        print(stopped_summary(error, job.summary(LoopEnd())))
        return exit_code(0, True, device_error=True)
    work = sorted(pending)

    def handle(batch: DecodedBatch) -> None:
        for position, error in batch.failures:
            job.failed_input(work[position], error)
        for positions, images in batch.groups:
            job.group([work[p] for p in positions], images)
        job.batch_done()

    end: LoopEnd | None = None
    completed, refused = False, None
    try:
        job.begin()
        paths = [job.sources[i].path for i in work]
        end = for_each_batch(paths, job.inputs, job.loaded, job.options, handle, job.between_batches, job.costs)
        if not end.forced:
            job.drain()
        completed = not end.interrupted
    except KeyboardInterrupt:
        completed = False
    except OutputDeviceError as error:  # a full disk: what was written so far is kept
        refused = error
    finally:
        refused = job.stop() or refused
        completed = completed and refused is None
        end = end or LoopEnd()
        counts = job.summary(end)
        summary = counts if completed else interrupted_summary(counts)
        try:
            job.finish(end, completed, summary)
        except OutputDeviceError as error:  # the files keep their last whole version
            refused = refused or error
    job.report()
    if refused is not None:
        print(f"explain: error: {refused}", file=sys.stderr)
        summary = stopped_summary(refused, counts)
    print(summary)
    if job.out_of_memory:
        print(out_of_memory_note(job.out_of_memory), file=sys.stderr)
    return exit_code(
        job.failed,
        not completed,
        device_error=refused is not None,
        out_of_memory=job.out_of_memory > 0,
        terminated=end.terminated,
    )
