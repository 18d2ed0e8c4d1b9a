"""The stages of a run on Ray Data: a decode step in CPU tasks (the model's resize and crop, as
the local engine's DataLoader workers do) and an explain step in a pool of actors that each
load the model once and explain batches with the local engine's
:class:`~explain.batch.explaining.GroupExplainer`. Used by ``explain run --engine ray``
(:mod:`~explain.batch.ray_driver`) and :func:`explain.ray_data.explain_dataset`. This module
imports neither Ray nor torch until it is used, so that the driver plans without them."""

from __future__ import annotations

import io
import json
import math
import os
import uuid
import warnings
from contextlib import contextmanager, nullcontext, redirect_stderr, suppress
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ..errors import UsageError
from ..pass_listener import PassListener
from .options import CheckedRun, ModelOptions, RunOptions
from .ray_stream import BUSY_SUFFIX, ROWS_FILE_SUFFIX, STOP_FILE

if TYPE_CHECKING:
    from ..report import ManifestRecord

#: CPUs a decode task reserves (it mostly waits on the disk and Pillow).
DECODE_CPUS = 0.5
#: Calls an explaining actor runs at once: one on the model, one writing its overlays.
CALLS_PER_ACTOR = 2
#: Tries of a batch on the explaining actors after the first. Ray also spends them while a
#: lost node's actor cannot be reached, until the cluster declares the node dead (about 15 s
#: with Ray's default health checks; Ray waits 0.1 s, 0.2 s, 0.4 s, ... at most 5 s between
#: tries): ten outlast that, where two failed the batches in flight on the node. A batch that
#: kills its actor every time is tried as often, then its images are failed.
ACTOR_TASK_RETRIES = 10
#: The columns the decode tasks add.
DECODED = ("image_data", "image_shape", "image_dtype", "decode_error")


# -- what the driver calls (no torch here)


def remote_prepare(ray, options: RunOptions) -> CheckedRun:
    """Check the run's options against the model in a Ray task (the driver does not load torch):
    the methods, their layers and settings, the targets, and how the decode tasks preprocess.
    A mistake in the options raises :class:`~explain.errors.UsageError`."""
    gpus = ray.cluster_resources().get("GPU", 0) if may_use_gpu(options) else 0
    task = ray.remote(check_run).options(num_cpus=DECODE_CPUS, num_gpus=1 if gpus else 0, max_retries=0)
    checked = ray.get(task.remote(options.with_absolute_paths()))
    if isinstance(checked, UsageError):
        raise checked  # raised again here, its options still data (worded by the caller)
    return checked


def actor_resources(ray, options: ModelOptions, model_device: str) -> dict:
    """``map_batches`` options of the explaining actors: one per GPU where the cluster has GPUs
    (and the run may use them), else one per node with CPUs, each leaving a CPU of its node
    to the read and decode tasks (:func:`cpus_per_actor`); ``options.actors`` sets how many.
    ``threads``: torch's threads per actor."""
    gpus = int(ray.cluster_resources().get("GPU", 0)) if may_use_gpu(options) else 0
    if gpus and model_device != "cpu":
        actors = options.actors or gpus
        return dict(compute=_pool(ray, actors), num_gpus=1, num_cpus=1, threads=1)
    nodes = [node["Resources"].get("CPU", 0) for node in ray.nodes() if node.get("Alive")]
    nodes = [cpus for cpus in nodes if cpus > 0] or [1]
    actors = options.actors or len(nodes)
    per_node = math.ceil(actors / len(nodes))
    # Torch's threads take the node's cores; the decode tasks are short and share them.
    return dict(
        compute=_pool(ray, actors),
        num_cpus=cpus_per_actor(min(nodes), per_node),
        threads=max(1, int(min(nodes)) // per_node),
    )


def cpus_per_actor(node_cpus: float, actors_per_node: int) -> float:
    """CPUs each CPU actor reserves in Ray's accounting: the node's, less one for the read and
    decode tasks, shared by its actors (at least half a CPU each). An actor pool that reserves
    every CPU leaves the read stage none and the run hangs; Ray Data's read stage asks for a
    whole CPU at first.

    >>> cpus_per_actor(2, 1), cpus_per_actor(16, 1), cpus_per_actor(16, 3)
    (1.0, 15.0, 5.0)
    """
    return max(0.5, math.floor((node_cpus - 1) / actors_per_node * 2) / 2)


def _pool(ray, actors: int):
    return ray.data.ActorPoolStrategy(
        size=actors,
        max_concurrent_calls_per_actor=CALLS_PER_ACTOR,
        enable_true_multi_threading=True,
        max_tasks_in_flight_per_actor=2 * CALLS_PER_ACTOR,
    )


def explain_plan(
    ray,
    plan_dir: str,
    filesystem,
    options: RunOptions,
    checked: CheckedRun,
    resources: dict,
    rows_folder: str | None = None,
) -> ExplainedPlan:
    """The execution on Ray Data of the plan's images (parquet files in ``plan_dir``, on
    ``filesystem``: pyarrow's, or None for a local folder), the actors keeping each batch's
    rows in ``rows_folder`` of the output folder too."""
    plan = ray.data.read_parquet(plan_dir, filesystem=filesystem, num_cpus=DECODE_CPUS)
    decoded = decode_stage(plan, checked.decoding, options)
    resources = dict(resources)
    constructor = dict(options=options, threads=resources.pop("threads"), rows_folder=rows_folder)
    explained = actor_stage(
        decoded, WriteActor, constructor, 1 if checked.fixed_batch else options.batch_size, resources
    )
    return ExplainedPlan(explained)


def decode_stage(dataset, decoding: bytes, options: ModelOptions):
    """``dataset`` (a ``path`` column) with each file decoded and preprocessed in CPU tasks,
    ``options.batch_size`` files a task."""
    return dataset.map_batches(
        decode_files,
        fn_kwargs=dict(decoding=decoding, column="path", max_pixels=options.max_pixels),
        batch_size=options.batch_size,
        num_cpus=DECODE_CPUS,
    )


def actor_stage(dataset, actor: type, constructor: dict, batch_size: int, resources: dict):
    """``dataset``'s batches worked by a pool of ``actor(**constructor)`` (``resources``: from
    :func:`actor_resources`, without ``threads``)."""
    # An actor that dies is restarted (a node may go), but a batch that kills actors is tried
    # ACTOR_TASK_RETRIES more times, not forever (Ray Data's default): the driver fails its
    # images. Ray 2.60 offers no named option for that and warns about the remote arguments
    # that it will drop in 2.64 (hence the extra's bound).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        return dataset.map_batches(
            actor,
            fn_constructor_kwargs=constructor,
            batch_size=batch_size,
            max_task_retries=ACTOR_TASK_RETRIES,
            **resources,
        )


class ExplainedPlan:
    """A plan explained on Ray Data: iterated, the rows (dicts) of its images a batch at a time
    as the actors finish them, with the files of the rows folder that keep them too;
    :meth:`shutdown` ends the execution from another thread (the thread that iterates then
    sees its end)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        for batch in self.dataset.iter_batches(batch_size=None, batch_format="numpy"):
            rows = [json.loads(line) for line in batch["row"]]
            for row, refused in zip(rows, batch["refused"], strict=True):
                if refused:  # the output folder's device refused its files: the driver stops the run
                    row["refused"] = True
            yield rows, sorted({str(name) for name in batch["kept"] if name})

    def shutdown(self) -> bool:
        """End the execution: its tasks cancelled and its actors killed (a stopped run has
        waited for the calls under way). Whether it could: Ray Data (2.60) keeps the
        execution's executor on the dataset once its first batch has come, and breaking off
        an iteration, the only public way, must happen in the iterating thread."""
        executor = getattr(self.dataset, "_current_executor", None)
        if executor is None:
            return False
        executor.shutdown(force=True)
        return True


def remote_metric_summary(ray, location: str) -> tuple[str, str]:
    """--metrics: the summary table of the values in the manifest of the output folder at
    ``location`` as text and HTML, made in a Ray task (the metrics' directions live beside torch)."""
    return ray.get(ray.remote(metric_summary).options(num_cpus=DECODE_CPUS).remote(location))


def may_use_gpu(options: ModelOptions) -> bool:
    return options.device is None or options.device.startswith("cuda")


# -- what runs in Ray's workers


def check_run(options: RunOptions) -> CheckedRun | UsageError:
    """The model check, in a worker: what it found, or the usage error (which pickles with
    its parts, :class:`~explain.errors.Option` s included)."""
    from ..models import warn_if_random
    from .preparation import prepare_run

    messages = io.StringIO()
    try:
        with redirect_stderr(messages):
            prepared = prepare_run(options)
            warn_if_random(prepared.loaded, options.model)
    except UsageError as error:
        return error.with_traceback(None)
    return prepared.checked(messages.getvalue())


@lru_cache(maxsize=4)
def _decoder(decoding: bytes):
    import cloudpickle

    return cloudpickle.loads(decoding)


def decode_files(batch: dict, decoding: bytes, column: str, max_pixels: int | None) -> dict:
    """Decode task: each file of ``column`` read and preprocessed (the local engine's DataLoader
    step); the image as bytes with its shape and dtype, or the reason it failed."""
    from .decoding import DecodedImages
    from .guards import set_pixel_limit

    preprocess, draft_size = _decoder(decoding)
    set_pixel_limit(max_pixels)
    decode = DecodedImages([os.fsdecode(path) for path in batch[column]], preprocess, draft_size)
    return dict(batch, **_columns(decode[i][1:] for i in range(len(decode))))


def decode_arrays(batch: dict, decoding: bytes, column: str) -> dict:
    """Decode task for a column of (H, W, 3) uint8 arrays: preprocessed as files are."""
    from PIL import Image

    preprocess, _ = _decoder(decoding)

    def one(array):
        try:
            return preprocess(Image.fromarray(np.asarray(array, dtype=np.uint8)).convert("RGB")), None
        except Exception as error:
            return None, f"preprocessing failed: {type(error).__name__}: {error}"

    rest = {name: values for name, values in batch.items() if name != column}
    return dict(rest, **_columns(one(array) for array in batch[column]))


def _columns(decoded) -> dict:
    images, shapes, dtypes, errors = [], [], [], []
    for tensor, error in decoded:
        array = tensor.numpy() if tensor is not None else None
        images.append(array.tobytes() if array is not None else b"")
        shapes.append("x".join(map(str, array.shape)) if array is not None else "")
        dtypes.append(array.dtype.str if array is not None else "")
        errors.append(error or "")
    return {
        "image_data": np.array(images, dtype=object),
        "image_shape": np.array(shapes),
        "image_dtype": np.array(dtypes),
        "decode_error": np.array(errors),
    }


def decoded_groups(batch: dict):
    """The decoded images of a batch from the decode tasks, collated as the local engine's
    DataLoader collates them (:func:`~explain.batch.decoding.collate`)."""
    import torch

    from .decoding import collate

    def image(i: int):
        dims = tuple(int(d) for d in batch["image_shape"][i].split("x"))
        array = np.frombuffer(batch["image_data"][i], dtype=np.dtype(batch["image_dtype"][i])).reshape(dims)
        return torch.from_numpy(array.copy())

    return collate(
        [(i, None, str(error)) if error else (i, image(i), None) for i, error in enumerate(batch["decode_error"])]
    )


class ExplainingActor:
    """An explaining actor: the model loaded once, with the run's explainers, shared by the
    calls it runs at once under a lock (the explainers' hooks are the model's)."""

    def __init__(self, options: RunOptions, threads: int, rows_folder: str | None = None):
        import threading

        import torch

        from .explaining import GroupExplainer
        from .preparation import prepare_run
        from .storage import OutputFolder

        torch.set_num_threads(threads)
        with redirect_stderr(io.StringIO()):  # the driver has printed the notes once
            prepared = prepare_run(options)
        self.explainer = GroupExplainer(prepared)
        self.model_lock = threading.Lock()
        #: Where each batch's rows go as soon as its files are written (see WriteActor).
        self.rows_folder = rows_folder
        #: Whether the driver asked the run to stop (its first Ctrl-C), read from the rows folder
        self.stopping = StopMarker(OutputFolder(options.out), rows_folder) if rows_folder else None

    @contextmanager
    def explaining(self):
        """The block in which a call explains: the model's lock held, the run's memory budget
        (``--max-memory``) for the methods' inner batches, no progress bars of theirs, and the
        driver's stop (:class:`StopMarker`) asked within their passes, at each layer."""
        from ..passes import pass_settings

        with (
            self.model_lock,
            pass_settings(max_memory=self.explainer.options.max_memory, progress=False, listener=self.stopping),
            self.stopping.watched() if self.stopping is not None else nullcontext(),
        ):
            yield


#: How often an actor looks for the stop file while a call explains.
STOP_LOOK_SECONDS = 0.25


class StopMarker(PassListener):
    """The stop of a run's actors: whether the driver wrote its stop file
    (:data:`~explain.batch.ray_stream.STOP_FILE`) in the run's rows folder. :meth:`look` looks
    at the folder; while a call explains (:meth:`watched`) a thread looks every
    :data:`STOP_LOOK_SECONDS`. As the methods' :class:`~explain.pass_listener.PassListener` (asked at
    each layer of the model), it answers what was seen, without looking again."""

    asked_at_layers = True

    def __init__(self, folder, rows_folder: str):
        self.folder, self.name = folder, f"{rows_folder}/{STOP_FILE}"
        self.seen = False

    def should_stop(self) -> bool:
        return self.seen

    def look(self) -> bool:
        """Whether the stop file is there (once seen, it stays seen)."""
        if not self.seen:
            with suppress(OSError):
                self.seen = self.folder.is_file(self.name)
        return self.seen

    @contextmanager
    def watched(self):
        """The block of a call that explains, a thread looking for the stop meanwhile."""
        import threading

        done = threading.Event()

        def watch() -> None:
            while not done.wait(STOP_LOOK_SECONDS) and not self.look():
                pass

        watcher = threading.Thread(target=watch, daemon=True, name="explain-stop-watch")
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()


class WriteActor(ExplainingActor):
    """``explain run --engine ray``'s actor: explains a batch of the plan with the local engine's
    :class:`~explain.batch.explaining.GroupExplainer`, writes the overlays, and returns the
    manifest rows (as JSON lines) with the name of the file that keeps them: the rows of each
    batch are also written at once, beside the plan (``rows_folder``), so that a driver killed,
    or stopped, before they reach it loses no finished output (the driver removes the file once
    the rows are in the manifest; a stopped driver and the next run read the rest back,
    :mod:`~explain.batch.ray_stream`).

    While a call works it keeps a ``.busy`` file in the rows folder; once the driver asks for a
    stop (:class:`StopMarker`), the methods stop at their next layer, the call writes what
    finished and its rows, and later calls explain nothing.

    Two calls run at once (:data:`CALLS_PER_ACTOR`): the model explains one batch (under the
    lock) while the other batch's overlays are drawn and written, as the local engine's writer
    threads overlap the model."""

    def __call__(self, batch: dict) -> dict:
        from ..report import manifest_line
        from .storage import OutputFolder

        folder = OutputFolder(self.explainer.options.out)
        busy = f"{self.rows_folder}/{uuid.uuid4().hex}{BUSY_SUFFIX}" if self.rows_folder else None
        try:
            if busy is not None:
                folder.write(busy, b"")  # before the look at the stop file: the driver waits for it
            if self.stopping is not None and self.stopping.look():
                return _returned([], [], "")
            rows, refused = self._explain_batch(folder, batch)
            lines = [manifest_line(row.row()) for row in rows]
            kept = self._keep_rows(folder, lines)
            return _returned(lines, [manifest_line(row.row()) for row in refused], kept)
        finally:
            if busy is not None:
                with suppress(Exception):
                    folder.remove(busy)

    def _explain_batch(self, folder, batch: dict) -> tuple[list[ManifestRecord], list[ManifestRecord]]:
        """The records of a batch's outputs, and those whose files the folder's device refused."""
        from .inputs import Source
        from .storage import OutputDeviceError

        explainer = self.explainer
        by_name = {cam.name: cam for cam in explainer.prepared.explainers}
        work = [
            (
                Source(
                    os.fsdecode(bytes(batch["input"][i])),
                    os.fsdecode(bytes(batch["path"][i])),
                    "",
                    str(batch["folder"][i]),
                    str(batch["stem"][i]),
                ),
                [by_name[name] for name in str(batch["methods"][i]).split(",")],
            )
            for i in range(len(batch["input"]))
        ]
        rows: list[ManifestRecord] = []
        refused: list[ManifestRecord] = []  # the rows whose files the output folder's device refused (a full disk)
        try:
            decoded = decoded_groups(batch)
            for i, error in decoded.failures:
                for cam in work[i][1]:
                    rows += explainer.failed_records(work[i][0], cam.name, error)
            jobs = []
            with self.explaining():
                for positions, images in decoded.groups:
                    if self.stopping is not None and self.stopping.should_stop():
                        break  # the driver stops: the groups left are the next run's
                    outcome = explainer.explain([work[p] for p in positions], images)
                    rows += outcome.failed
                    jobs += outcome.jobs
            for index, job in enumerate(jobs):
                try:
                    rows += job.write(folder)
                except OutputDeviceError as error:
                    refused = [row.with_status("failed", str(error)) for later in jobs[index:] for row in later.rows]
                    break
        except Exception as error:  # a failure of the whole batch fails its rows, not the run
            explained = {(row.input, row.method) for row in rows + refused}
            for source, cams in work:
                for cam in cams:
                    if (source.input, cam.name) not in explained:
                        rows += explainer.failed_records(
                            source, cam.name, f"worker failed: {type(error).__name__}: {error}"
                        )
        return rows, refused

    def _keep_rows(self, folder, lines: list[str]) -> str:
        """Write the rows to a file of their own in the rows folder; its name ("" where none)."""
        if not (self.rows_folder and lines):
            return ""
        name = f"{self.rows_folder}/{uuid.uuid4().hex}{ROWS_FILE_SUFFIX}"
        try:
            folder.write(name, "".join(line + "\n" for line in lines).encode())
        except Exception:  # e.g. a full disk: the rows still reach the driver, only a kill loses them
            return ""
        return name


def _returned(lines: list[str], refused: list[str], kept: str) -> dict:
    """A call's columns: each row (a JSON line), whether the device refused its files, and the
    file in the rows folder that keeps the rows (the driver removes it once they are in the
    manifest)."""
    return {
        "row": np.array(lines + refused, dtype=object),
        "refused": np.array([False] * len(lines) + [True] * len(refused), dtype=bool),
        "kept": np.array([kept] * (len(lines) + len(refused)), dtype=object),
    }


def metric_summary(location: str) -> tuple[str, str]:
    """The metric summary of the manifest in the output folder at ``location``: text and HTML."""
    from ..evaluation import format_summary
    from ..report import iter_json_records
    from .manifest import MANIFEST, metric_table
    from .storage import OutputFolder

    table = metric_table(iter_json_records(OutputFolder(location).lines(MANIFEST)))
    return (format_summary(table), format_summary(table, "html")) if table else ("", "")
