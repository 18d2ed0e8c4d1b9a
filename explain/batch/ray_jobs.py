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

from ..errors import Option, UsageError
from .decoding import ModelInputs
from .guards import StopFlag, Terminated
from .job import DatasetJob, run_job
from .loop import LoopEnd
from .progress import progress_bar
from .ray_cluster import import_ray, ray_session
from .ray_stages import ExplainedPlan, actor_resources, actor_stage, decode_stage, decoded_groups
from .ray_stream import CLOSE_SECONDS, Stream

#: What the first Ctrl-C (or SIGTERM) does to a job on Ray, as its message says.
STOPPING = "the batches the actors hold are left to the next run; what reached this process is kept"
#: The reason of an image whose batch Ray lost.
LOST = "worker failed: Ray lost this image's batch (its actor raised or died on it; see Ray's log above)"


def check_ray_job(job: type[DatasetJob], inputs) -> None:
    """Refuse (before Ray starts) a job that has no Ray side, or inputs the decode tasks do
    not read (volumes, signals: the local engine's)."""
    if job.worker is DatasetJob.worker:
        raise UsageError(f"{job.__name__} runs on the local engine only: leave ", Option("engine"), " ray out")
    if not isinstance(inputs, ModelInputs):
        raise UsageError(f"{type(inputs).__name__} run on the local engine only: leave ", Option("engine"), " ray out")


def run_job_on_ray(job: DatasetJob) -> int:
    """Run ``job`` with its groups worked on Ray (``job.options``: --address, --actors);
    the exit status, as :func:`~explain.batch.job.run_job`'s."""
    check_ray_job(type(job), job.inputs)
    ray = import_ray()
    with ray_session(ray, job.options.address):
        return run_job(job, partial(ray_loop, ray))


def ray_loop(ray, job: DatasetJob, work: list[int]) -> LoopEnd:
    """The engine's loop on Ray: the sources at ``work`` decoded and worked in Ray, the results
    handed to the job in this process as they come, until the end or a stop."""
    end, started = LoopEnd(), time.perf_counter()
    progress = progress_bar(len(work), job.options.quiet)
    received: set[int] = set()
    stream, stop = None, StopFlag(STOPPING)
    try:
        with stop:
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
            end.interrupted = stop.set
            if not end.interrupted:
                for index in sorted(set(work) - received):
                    job.failed_input(index, LOST)
                    end.images += 1
                    progress.update(1)
    except KeyboardInterrupt as interrupt:  # a second Ctrl-C: at once
        end.interrupted = end.forced = True
        end.terminated = isinstance(interrupt, Terminated)
    finally:
        try:
            if stream is not None:
                stream.close(CLOSE_SECONDS)
        except KeyboardInterrupt as interrupt:  # a second signal while Ray's execution ends
            end.interrupted = end.forced = True
            end.terminated = end.terminated or isinstance(interrupt, Terminated)
        progress.close()
        end.elapsed = time.perf_counter() - started
        end.terminated = end.terminated or stop.terminated
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
    # the actors' device: the driver's where --device names one; else the cluster's GPUs if it
    # has any (the driver may run on a head node without one)
    resources = actor_resources(ray, options, job.loaded.device.type if options.device else "cuda")
    items = ray.data.from_items([{"index": index, "path": job.sources[index].path} for index in work])
    decoded = decode_stage(items, job.decoding(), options)
    constructor = dict(
        worker=cloudpickle.dumps(job.worker()), threads=resources.pop("threads"), max_memory=options.max_memory
    )
    batch_size = 1 if job.loaded.fixed_batch else options.batch_size
    return WorkedBatches(actor_stage(decoded, JobActor, constructor, batch_size, resources))


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
