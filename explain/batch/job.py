"""The job interface: a dataset-scale command (``explain run``, ``explain evaluate``,
``explain concepts atlas`` and the next ones) as a :class:`DatasetJob`, the steps of its own:
inputs -> plan -> groups of decoded images -> records -> files; and :func:`run_job`, what every
job is given: the engine's loop (the local one, :func:`~explain.batch.loop.for_each_batch`:
decoding in DataLoader workers, progress, the memory budget, Ctrl-C and SIGTERM; or Ray Data's,
:func:`~explain.batch.ray_jobs.ray_loop`), the output device's refusal (a full disk: what was
written is kept), the summary line and the exit status (:func:`~explain.batch.outcome.exit_code`).

A new command writes a :class:`DatasetJob` (its plan, what a group becomes, its files) and
calls :func:`run_job`; it touches neither the loops nor the other jobs. Out-of-memory halving is
:func:`~explain.batch.loop.in_halves`, which a job's group work calls. A job whose work on a
group is a :class:`GroupWorker` (a plain object that makes its own model where it runs, and
returns what the driver's :meth:`DatasetJob.take` records) runs on either engine:
:func:`~explain.batch.ray_jobs.run_job_on_ray` works its groups in Ray actors."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch import Tensor

from ..models import LoadedModel
from .decoding import DecodedBatch, ModelInputs
from .inputs import Source
from .kinds import FileInputs
from .loop import LoopEnd, for_each_batch
from .options import ModelOptions
from .outcome import exit_code, interrupted_summary, out_of_memory_note, stopped_summary
from .storage import OutputDeviceError


class GroupWorker:
    """What a job does to a group of decoded images, where the images are: in the job's
    process (the local engine) or in each Ray actor (the Ray engine, which pickles it before
    :meth:`start`). What :meth:`work` returns goes to :meth:`DatasetJob.take` (from an actor:
    pickled, so plain values and CPU tensors)."""

    def start(self) -> None:
        """Make what the work needs where it runs (load the model), once; nothing where it has it."""

    def work(self, indices: list[int], images: Tensor) -> Any:
        """The result of the sources at ``indices``, decoded as ``images`` (one size)."""
        raise NotImplementedError


class DatasetJob:
    """One run of a dataset-scale command. :func:`run_job` calls, in order:
    :meth:`plan` (the work left, by source index), :meth:`begin`, then per decoded batch
    :meth:`failed_input` for each image that could not be decoded, :meth:`group` for each group
    of decoded images and :meth:`batch_done`, and :meth:`between_batches`; at the end
    :meth:`drain` (unless a second Ctrl-C forced the stop), :meth:`stop`, :meth:`finish` (the
    files written from what was done), :meth:`report` and the summary line. A job implements
    :meth:`plan`, :meth:`failed_input`, :meth:`group`, :meth:`finish`, :attr:`failed` and
    :meth:`summary`; the other steps do nothing unless it says otherwise. A job that runs on
    Ray too returns a :class:`GroupWorker` from :meth:`worker` and records its results in
    :meth:`take` (its :meth:`group` is then the two, in this process)."""

    sources: list[Source]
    #: the model (a :class:`~explain.models.LoadedModel`), the job's options (batch size,
    #: workers, --max-memory, --quiet, --max-pixels) and each method's estimated cost per image
    loaded: LoadedModel
    options: ModelOptions
    costs: dict[str, float]
    inputs: ModelInputs | FileInputs
    #: Outputs that failed for memory running out (exit status 3 where no other failure counts more).
    out_of_memory: int = 0
    _local_worker: GroupWorker | None = None

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
        record what they gave, queue or write their files. By default, the job's
        :meth:`worker`'s work, then :meth:`take`."""
        if self._local_worker is None:
            worker = self.worker()
            if worker is None:
                raise NotImplementedError(f"{type(self).__name__} implements neither group() nor worker()")
            worker.start()
            self._local_worker = worker
        self.take(indices, self._local_worker.work(indices, images))

    def worker(self) -> GroupWorker | None:
        """What explains a group where the images are (None: the job runs on the local engine
        only, by its own :meth:`group`). The Ray engine pickles it for each actor."""
        return None

    def take(self, indices: list[int], result: Any) -> None:
        """Record what the worker made of the sources at ``indices``, in this process."""
        raise NotImplementedError

    def decoding(self) -> bytes:
        """How Ray's decode tasks preprocess an image (the job's inputs and model, pickled)."""
        from .decoding import pickled_decoding

        if not isinstance(self.inputs, ModelInputs):
            raise NotImplementedError(f"{type(self.inputs).__name__} run on the local engine only")
        return pickled_decoding(self.inputs, self.loaded.example)

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


#: An engine's loop: the job's work (source indices, sorted) to its groups, in order, until
#: the end or a stop; how far it got. (Its ``KeyboardInterrupt``: a forced stop.)
JobLoop = Callable[[DatasetJob, list[int]], LoopEnd]


def local_loop(job: DatasetJob, work: list[int]) -> LoopEnd:
    """The local engine: the sources decoded in DataLoader workers, their groups handed to
    :meth:`DatasetJob.group` in this process (:func:`~explain.batch.loop.for_each_batch`)."""

    def handle(batch: DecodedBatch) -> None:
        for position, error in batch.failures:
            job.failed_input(work[position], error)
        for positions, images in batch.groups:
            job.group([work[p] for p in positions], images)
        job.batch_done()

    paths = [job.sources[i].path for i in work]
    return for_each_batch(paths, job.inputs, job.loaded, job.options, handle, job.between_batches, job.costs)


def run_job(job: DatasetJob, loop: JobLoop = local_loop) -> int:
    """Run ``job`` with the engine's ``loop`` (this process's by default); its exit status."""
    try:
        pending = job.plan()
    except OutputDeviceError as error:  # the files keep their last whole version
        print(f"explain: error: {error}", file=sys.stderr)
        print(stopped_summary(error, job.summary(LoopEnd())))
        return exit_code(0, True, device_error=True)
    end: LoopEnd | None = None
    completed, refused = False, None
    try:
        job.begin()
        end = loop(job, sorted(pending))
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
