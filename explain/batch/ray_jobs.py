"""Any :class:`~explain.batch.job.DatasetJob` with a :class:`~explain.batch.job.GroupWorker`
on Ray Data (``--engine ray``): :func:`run_job_on_ray` is :func:`~explain.batch.job.run_job`
with Ray's loop, :func:`ray_loop`, in place of the local one.

The driver (this process) plans and records, as on the local engine; Ray Data decodes the
planned images in CPU tasks (the local engine's DataLoader step,
:func:`~explain.batch.ray_stages.decode_files`) and runs the job's worker in a pool of actors
(:class:`JobActor`: each unpickles the worker and starts it, loading the model once), under the
job's memory budget; what the worker made of each batch comes back to the driver, which hands
it to :meth:`~explain.batch.job.DatasetJob.take` as it arrives. So a job writes its group work
once and runs on both engines: ``explain concepts atlas --engine ray`` is the atlas job's
worker (a shard's probe values) in the actors and its running top-N merged in the driver.

A stop (Ctrl-C, SIGTERM) ends Ray's execution at once: what reached the driver is kept, the
batches the actors held are the next run's (a job resumes from what it recorded). Images whose
batch Ray itself lost (an actor that died on it, past Ray's retries) fail with that reason.
``explain run --engine ray`` keeps its own driver (:mod:`~explain.batch.ray_driver`): its
actors write the files and its driver never loads torch, for inputs in the millions.
"""

from __future__ import annotations

import io
import threading
import time
from contextlib import redirect_stderr
from functools import partial

import numpy as np

from ..errors import UsageError
from .guards import StopFlag, Terminated, terminated_as_interrupt
from .job import DatasetJob, run_job
from .loop import LoopEnd
from .progress import progress_bar
from .ray_cluster import connect, import_ray
from .ray_stages import DECODE_CPUS, ExplainedPlan, actor_resources, decode_files, decoded_groups
from .ray_stream import CLOSE_SECONDS, Stream

#: What the first Ctrl-C (or SIGTERM) does to a job on Ray, as its message says.
STOPPING = "the batches the actors hold are left to the next run; what reached this process is kept"
#: The reason of an image whose batch Ray lost.
LOST = "worker failed: Ray lost this image's batch (an actor died on it; see Ray's log)"


def run_job_on_ray(job: DatasetJob) -> int:
    """Run ``job`` with its groups worked on Ray (``job.options``: --address, --actors);
    the exit status, as :func:`~explain.batch.job.run_job`'s."""
    if job.worker() is None:
        raise UsageError(f"{type(job).__name__} runs on the local engine only: leave --engine ray out")
    ray = import_ray()
    started = connect(ray, job.options.address)
    # ray.init's SIGTERM handlers give way to ours: SIGTERM stops the job as Ctrl-C does.
    with terminated_as_interrupt():
        try:
            return run_job(job, partial(ray_loop, ray))
        finally:
            if started:
                ray.shutdown()


def ray_loop(ray, job: DatasetJob, work: list[int]) -> LoopEnd:
    """The engine's loop on Ray: the sources at ``work`` decoded and worked in Ray, the results
    handed to the job in this process as they come, until the end or a stop."""
    end, started = LoopEnd(), time.perf_counter()
    progress = progress_bar(len(work), job.options.quiet)
    received: set[int] = set()
    stream = None
    try:
        with StopFlag(STOPPING) as stop:
            stream = Stream(worked_batches(ray, job, work))
            while not stop.set:
                try:
                    item = stream.get()
                except StopIteration:
                    break
                if item is not None:
                    count = take_batch(job, item, received)
                    end.images += count
                    progress.update(count)
            end.interrupted, end.terminated = stop.set, stop.terminated
        if not end.interrupted:
            for index in sorted(set(work) - received):
                job.failed_input(index, LOST)
                end.images += 1
    except KeyboardInterrupt as interrupt:  # a second Ctrl-C: at once
        end.interrupted = end.forced = True
        end.terminated = isinstance(interrupt, Terminated)
    finally:
        if stream is not None:
            stream.close(CLOSE_SECONDS)
        progress.close()
        end.elapsed = time.perf_counter() - started
    return end


def take_batch(job: DatasetJob, item: tuple, received: set[int]) -> int:
    """Hand one batch's results to the job (``item``: its failures and its groups' results);
    how many images it held."""
    failures, results = item
    for index, error in failures:
        job.failed_input(index, error)
    for indices, result in results:
        job.take(indices, result)
    job.batch_done()
    job.between_batches()
    indices = [index for index, _ in failures] + [i for members, _ in results for i in members]
    received.update(indices)
    return len(indices)


def worked_batches(ray, job: DatasetJob, work: list[int]) -> WorkedBatches:
    """The execution on Ray Data of the job's work: decode tasks, then the job's actors."""
    import cloudpickle

    options = job.options
    batch_size = 1 if job.loaded.fixed_batch else options.batch_size
    resources = actor_resources(ray, options, job.loaded.device.type)
    items = ray.data.from_items([{"index": index, "path": job.sources[index].path} for index in work])
    decoded = items.map_batches(
        decode_files,
        fn_kwargs=dict(decoding=job.decoding(), column="path", max_pixels=options.max_pixels),
        batch_size=batch_size,
        num_cpus=DECODE_CPUS,
    )
    worker = cloudpickle.dumps(job.worker())
    threads = resources.pop("threads")
    worked = decoded.map_batches(
        JobActor,
        fn_constructor_kwargs=dict(worker=worker, threads=threads, max_memory=options.max_memory),
        batch_size=batch_size,
        **resources,
    )
    return WorkedBatches(worked)


class WorkedBatches(ExplainedPlan):
    """The job's batches worked on Ray Data: iterated, each batch's failures and groups'
    results as the actors finish them; :meth:`shutdown` ends the execution."""

    def __iter__(self):
        import cloudpickle

        for batch in self.dataset.iter_batches(batch_size=None, batch_format="numpy"):
            for payload in batch["result"]:
                yield cloudpickle.loads(payload)


# -- what runs in Ray's workers


class JobActor:
    """A job's actor: its :class:`~explain.batch.job.GroupWorker`, unpickled and started once
    (the model loaded), working the decoded batches it is given under the job's memory budget."""

    def __init__(self, worker: bytes, threads: int, max_memory):
        import cloudpickle
        import torch

        torch.set_num_threads(threads)
        self.worker = cloudpickle.loads(worker)
        with redirect_stderr(io.StringIO()):  # the driver has printed the notes once
            self.worker.start()
        self.max_memory = max_memory
        self.lock = threading.Lock()  # the worker's hooks are the model's

    def __call__(self, batch: dict) -> dict:
        import cloudpickle

        from ..passes import pass_settings

        decoded = decoded_groups(batch)
        index = [int(i) for i in batch["index"]]
        results = []
        with self.lock, pass_settings(max_memory=self.max_memory, progress=False):
            for positions, images in decoded.groups:
                members = [index[p] for p in positions]
                results.append((members, self.worker.work(members, images)))
        failures = [(index[p], error) for p, error in decoded.failures]
        return {"result": np.array([cloudpickle.dumps((failures, results))], dtype=object)}
