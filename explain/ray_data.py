"""Explaining images on Ray Data: the stages of ``explain run --engine ray``, and
:func:`explain_dataset` for pipelines of your own.

The stages are a decode step in CPU tasks (the model's resize and crop, as ``explain run``'s
DataLoader workers do) and an explain step in a pool of actors that each load the model once
and explain batches with the same explainers, checks and settings as the command line. Ray
is the optional extra ``explain-vision[ray]``. This module imports neither Ray nor torch until
it is used, so that the command line's driver plans without them.

For example (``tests/test_ray_engine.py`` runs the same on a local Ray)::

    import ray, explain.ray_data
    images = ray.data.read_images("photos/", include_paths=True, mode="RGB")
    maps = explain.ray_data.explain_dataset(images, methods="gradcam,layercam")
    row = maps.take(1)[0]
    row["method"], row["target_name"], row["map"].shape   # ('gradcam', 'tabby', (224, 224))
"""

from __future__ import annotations

import io
import math
import warnings
from contextlib import redirect_stderr
from functools import lru_cache

import numpy as np

from .options import BUNDLED_MODEL

__all__ = ["explain_dataset"]

#: CPUs a decode task reserves (it mostly waits on the disk and Pillow).
DECODE_CPUS = 0.5
#: Calls an explaining actor runs at once: one on the model, one writing its overlays.
CALLS_PER_ACTOR = 2


def explain_dataset(dataset, model: str = BUNDLED_MODEL, methods: str = "gradcam", *, target: str = "top1",
                    layer: str = "auto", weights: str | None = None, image_column: str = "image",
                    path_column: str = "path", batch_size: int = 16, actors: int | None = None,
                    device: str | None = None):
    """Explain the images of a Ray ``dataset``; returns a dataset with one row per image,
    method and target.

    ``dataset`` has an ``image_column`` of (H, W, 3) uint8 arrays (what
    ``ray.data.read_images(..., mode="RGB")`` gives), or else a ``path_column`` of image files,
    read as ``explain run`` reads them. ``model``, ``weights``, ``methods`` (comma-separated),
    ``target`` and ``layer`` take what ``explain run``'s options take (``explain run --help``),
    for classifiers; the explainers are the command line's, checked on the model before any
    image runs. Each actor loads the model once; ``actors`` defaults as ``explain run --engine
    ray --actors``.

    The rows carry the dataset's other columns (an id, a label: whatever identifies the image),
    the input's path as ``input`` (None for images given as arrays), ``method``, ``target``
    (``top1``...), ``target_id``,
    ``target_name``, ``target_probability``, ``predicted_id``, ``predicted_name``, ``map``
    (float32, the model input's height and width, scaled to 0..1, signed maps to -1..1; empty
    where the row failed),
    ``status`` (ok or failed) and ``error``. An image that cannot be read or explained gives
    failed rows with the reason and no map; the others go on.
    """
    import ray

    from .cli.parser import build_parser

    args = build_parser().parse_args(["run", "-", "--out", "-", "--model", model, "--method", methods, "--target",
                                      target, "--layer", layer, "--batch-size", str(batch_size)]
                                     + (["--weights", weights] if weights else [])
                                     + (["--device", device] if device else []))
    args.actors = actors
    args = for_workers(args)
    from .cli.common import UsageError

    try:
        setup = remote_prepare(ray, args)
    except UsageError as error:
        raise ValueError(str(error).replace("--method", "methods").replace("--", "")) from None
    if setup["task"] != "classify":
        raise ValueError(f"{model} is a {setup['task']} model; explain_dataset explains classifiers "
                         "(explain run --engine ray runs segmentation and detection models)")
    columns = dataset.columns() or []
    if image_column in columns:
        decoded = dataset.map_batches(_decode_arrays, fn_kwargs=dict(decoding=setup["decoding"], column=image_column),
                                      batch_size=batch_size, num_cpus=DECODE_CPUS)
    elif path_column in columns:
        decoded = dataset.map_batches(_decode_files, fn_kwargs=dict(decoding=setup["decoding"], column=path_column,
                                                                    max_pixels=None),
                                      batch_size=batch_size, num_cpus=DECODE_CPUS)
    else:
        raise ValueError(f"the dataset has neither an {image_column!r} column of images nor a {path_column!r} column "
                         f"of files (its columns: {', '.join(columns)}); pass image_column= or path_column=")
    resources = actor_resources(ray, args, setup)
    return decoded.map_batches(_MapActor, fn_constructor_kwargs=dict(args=args, threads=resources.pop("threads")),
                               batch_size=1 if setup["fixed_batch"] else batch_size, **resources)


# -- what the command line's driver calls (no torch here)


def remote_prepare(ray, args) -> dict:
    """Check the run's options against the model in a Ray task (the driver does not load torch):
    the methods, their layers and settings, the targets, and how the decode tasks preprocess.
    A mistake in the options raises the command line's usage error."""
    from .cli.common import UsageError

    gpus = ray.cluster_resources().get("GPU", 0) if _may_use_gpu(args) else 0
    task = ray.remote(_prepare).options(num_cpus=DECODE_CPUS, num_gpus=1 if gpus else 0, max_retries=0)
    setup = ray.get(task.remote(for_workers(args)))
    if "usage_error" in setup:
        raise UsageError(setup["usage_error"])
    return setup


def actor_resources(ray, args, setup: dict) -> dict:
    """``map_batches`` options of the explaining actors: one per GPU where the cluster has GPUs
    (and the run may use them), else one per node with CPUs, each leaving a CPU of its node
    to the read and decode tasks (:func:`~explain.cli.ray_engine.cpus_per_actor`); ``--actors`` sets how
    many. ``threads``: torch's threads per actor."""
    from .cli.ray_engine import cpus_per_actor

    gpus = int(ray.cluster_resources().get("GPU", 0)) if _may_use_gpu(args) else 0
    if gpus and setup["device"] != "cpu":
        actors = args.actors or gpus
        return dict(compute=_pool(ray, actors), num_gpus=1, num_cpus=1, threads=1)
    nodes = [node["Resources"].get("CPU", 0) for node in ray.nodes() if node.get("Alive")]
    nodes = [cpus for cpus in nodes if cpus > 0] or [1]
    actors = args.actors or len(nodes)
    per_node = math.ceil(actors / len(nodes))
    # Torch's threads take the node's cores; the decode tasks are short and share them.
    return dict(compute=_pool(ray, actors), num_cpus=cpus_per_actor(min(nodes), per_node),
                threads=max(1, int(min(nodes)) // per_node))


def _pool(ray, actors: int):
    return ray.data.ActorPoolStrategy(size=actors, max_concurrent_calls_per_actor=CALLS_PER_ACTOR,
                                      enable_true_multi_threading=True,
                                      max_tasks_in_flight_per_actor=2 * CALLS_PER_ACTOR)


def explain_plan(ray, plan_dir: str, filesystem, args, setup: dict, resources: dict):
    """The rows (dicts) of the plan's images (parquet files in ``plan_dir``, on ``filesystem``:
    pyarrow's, or None for a local folder), a batch at a time as the actors finish them."""
    import json

    plan = ray.data.read_parquet(plan_dir, filesystem=filesystem, num_cpus=DECODE_CPUS)
    decoded = plan.map_batches(_decode_files, fn_kwargs=dict(decoding=setup["decoding"], column="path",
                                                              max_pixels=args.max_pixels),
                               batch_size=args.batch_size, num_cpus=DECODE_CPUS)
    resources = dict(resources)
    # An actor that dies is restarted (a node may go), but a batch that kills actors is tried
    # twice more, not forever; the driver fails its images (ray_engine._RayRun._fail_lost).
    # Ray 2.60 offers no named option for that and warns about the remote arguments that it
    # will drop in 2.64 (hence the extra's bound).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        explained = decoded.map_batches(
            _WriteActor, fn_constructor_kwargs=dict(args=args, threads=resources.pop("threads")),
            batch_size=1 if setup["fixed_batch"] else args.batch_size, max_task_retries=2, **resources)
    for batch in explained.iter_batches(batch_size=None, batch_format="numpy"):
        yield [json.loads(line) for line in batch["row"]]


def remote_metric_summary(ray, location: str) -> tuple[str, str]:
    """--metrics: the summary table of the values in the manifest of the output folder at
    ``location`` as text and HTML, made in a Ray task."""
    return ray.get(ray.remote(_metric_summary).options(num_cpus=DECODE_CPUS).remote(location))


def for_workers(args):
    """``args`` with the paths they name made absolute: Ray's workers do not share the driver's
    working directory."""
    import copy
    import os

    from .cli.storage import is_uri

    args = copy.copy(args)
    if not is_uri(args.out):
        args.out = os.path.abspath(args.out)
    if args.weights:
        args.weights = os.path.abspath(args.weights)
    if os.path.exists(args.model):
        args.model = os.path.abspath(args.model)
    return args


def _may_use_gpu(args) -> bool:
    return args.device is None or args.device.startswith("cuda")


# -- what runs in Ray's workers


def _prepare(args) -> dict:
    import cloudpickle

    from .cli.common import UsageError
    from .cli.decoding import _Inputs
    from .models import warn_if_random as _warn_if_random
    from .cli.preparation import prepare_run
    from .metrics.registry import METRICS

    messages = io.StringIO()
    try:
        with redirect_stderr(messages):
            prepared = prepare_run(args)
            _warn_if_random(prepared.loaded, args.model)
    except UsageError as error:
        return {"usage_error": str(error)}
    loaded = prepared.loaded
    inputs = _Inputs(loaded.preprocess)
    return {
        "messages": messages.getvalue(),
        "methods": [cam.name for cam in prepared.explainers],
        "labels": list(prepared.target.labels),
        "layers": prepared.layers,
        "settings": prepared.settings,
        "task": prepared.task,
        "metrics": prepared.metrics,
        "metric_columns": [column for name in prepared.metrics for column in METRICS[name].columns],
        "fixed_batch": loaded.fixed_batch,
        "device": loaded.device.type,
        "decoding": cloudpickle.dumps((inputs.in_workers, 2 * max(loaded.example.shape[-2:]))),
    }


@lru_cache(maxsize=4)
def _decoder(decoding: bytes):
    import cloudpickle

    return cloudpickle.loads(decoding)


def _encode(tensor) -> tuple[bytes, str, str]:
    array = tensor.numpy()
    return array.tobytes(), "x".join(map(str, array.shape)), array.dtype.str


def _decode_files(batch: dict, decoding: bytes, column: str, max_pixels: int | None) -> dict:
    """Decode task: each file of ``column`` read and preprocessed (``explain run``'s DataLoader
    step); the image as bytes with its shape and dtype, or the reason it failed."""
    from PIL import Image

    from .cli.decoding import _Decode

    preprocess, draft_size = _decoder(decoding)
    if max_pixels is not None:
        Image.MAX_IMAGE_PIXELS = max_pixels or None
    decode = _Decode(list(batch[column]), preprocess, draft_size)
    return dict(batch, **_columns(decode[i][1:] for i in range(len(decode))))


def _decode_arrays(batch: dict, decoding: bytes, column: str) -> dict:
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
        data, shape, dtype = _encode(tensor) if tensor is not None else (b"", "", "")
        images.append(data)
        shapes.append(shape)
        dtypes.append(dtype)
        errors.append(error or "")
    return {"image_data": np.array(images, dtype=object), "image_shape": np.array(shapes),
            "image_dtype": np.array(dtypes), "decode_error": np.array(errors)}


def _groups(batch: dict) -> tuple[list[tuple[list[int], object]], list[tuple[int, str]]]:
    """The decoded images stacked per shape (``[(positions, tensor)]``) and the failures, as the
    local engine's DataLoader collates them."""
    import torch

    from .cli.decoding import _collate

    def image(i: int):
        dims = tuple(int(d) for d in batch["image_shape"][i].split("x"))
        array = np.frombuffer(batch["image_data"][i], dtype=np.dtype(batch["image_dtype"][i])).reshape(dims)
        return torch.from_numpy(array.copy())

    collated = _collate([(i, None, str(error)) if error else (i, image(i), None)
                         for i, error in enumerate(batch["decode_error"])])
    return collated.groups, collated.failures


class _Actor:
    """An explaining actor: the model loaded once, with the command line's explainers."""

    def __init__(self, args, threads: int):
        import threading

        import torch

        from .cli.preparation import prepare_run

        torch.set_num_threads(threads)
        with redirect_stderr(io.StringIO()):  # the driver has printed the notes once
            self.prepared = prepare_run(args)
        self.args = args
        self.model_lock = threading.Lock()  # calls run in threads; the explainers' hooks are the model's


class _WriteActor(_Actor):
    """``explain run --engine ray``'s actor: explains a batch of the plan with the local engine's
    batch code, writes the overlays, and returns the manifest rows (as JSON lines).

    Two calls run at once (:data:`CALLS_PER_ACTOR`): the model explains one batch (under a
    lock: the explainers' hooks are the model's) while the other batch's overlays are drawn
    and written, as the local engine's writer threads overlap the model."""

    def __init__(self, args, threads: int):
        super().__init__(args, threads)
        base = self.prepared.run_class
        self.run_class = type("_Collecting" + base.__name__, (_Collecting, base), {})

    def __call__(self, batch: dict) -> dict:
        from collections import deque

        from .cli.inputs import Source
        from .report import manifest_line

        sources = [Source(str(batch["input"][i]), str(batch["path"][i]), "", str(batch["folder"][i]),
                          str(batch["stem"][i])) for i in range(len(batch["input"]))]
        run = self.run_class(self.args, self.args.out, sources, *self.prepared.run_arguments())
        by_name = {cam.name: cam for cam in run.explainers}
        run.pending = {i: [by_name[name] for name in str(batch["methods"][i]).split(",")]
                       for i in range(len(run.sources))}
        run.collected = []
        try:
            groups, failures = _groups(batch)
            for i, error in failures:
                for cam in run.pending[i]:
                    run._fail(run.sources[i], cam.name, error)
            writes: deque = deque()
            with self.model_lock:
                for positions, images in groups:
                    run._explain_in_halves(positions, images, _Later(), writes)
            for write in writes:
                run._record(write.result())
        except Exception as error:  # a failure of the whole batch fails its rows, not the run
            explained = {(row["input"], row["method"]) for row in run.collected}
            for i, source in enumerate(run.sources):
                for cam in run.pending[i]:
                    if (source.input, cam.name) not in explained:
                        run._fail(source, cam.name, f"worker failed: {type(error).__name__}: {error}")
        return {"row": np.array([manifest_line(row) for row in run.collected], dtype=object)}


class _Collecting:
    """Mixed into the local engine's run classes in an actor: rows are collected for the
    driver instead of recorded, and errors are reported by the driver."""

    def _record(self, rows: list[dict]) -> None:
        self.collected.extend(rows)

    def _report_error(self, where: str, error: str) -> None:
        pass


class _Later:
    """An executor that keeps what it is given until its ``result()`` is asked for: the actor
    writes a batch's outputs once the model is free for the next batch."""

    def submit(self, function, *args):
        return _Later.Call(function, args)

    class Call:
        def __init__(self, function, args):
            self.function, self.args = function, args

        def result(self):
            return self.function(*self.args)


class _MapActor(_Actor):
    """:func:`explain_dataset`'s actor: maps and targets as columns, nothing written."""

    def __call__(self, batch: dict) -> dict:
        from .cli.decoding import _Inputs

        prepared = self.prepared
        inputs = _Inputs(prepared.loaded.preprocess)
        n = len(batch["decode_error"])
        names = [str(p) for p in batch["path"]] if "path" in batch else [None] * n
        carried = [name for name in batch if name not in _DECODED and name not in _MAP_COLUMNS]
        labels, out = prepared.target.labels, []
        groups, failures = _groups(batch)
        for i, error in failures:
            out += [_map_row(names[i], cam.name, label, error=error, _image=i) for cam in prepared.explainers
                    for label in labels]
        for positions, images in groups:
            model_input = inputs.model_input(images.to(prepared.loaded.device))
            for cam in prepared.explainers:
                try:
                    with self.model_lock:
                        result = cam(model_input, prepared.target.targets, topk=prepared.target.topk)
                except Exception as error:
                    out += [_map_row(names[i], cam.name, label, error=f"{type(error).__name__}: {error}", _image=i)
                            for i in positions for label in labels]
                    continue
                maps, ids, probabilities = result.maps, result.targets, result.probabilities
                if maps.dim() == 3:
                    maps, ids, probabilities = maps[:, None], ids[:, None], probabilities[:, None]
                best_probability, best_id = result.logits.float().softmax(dim=1).max(dim=1)
                maps = maps.float().cpu().numpy()
                for j, i in enumerate(positions):
                    for k, label in enumerate(labels):
                        class_id = int(ids[j, k])
                        out.append(_map_row(
                            names[i], cam.name, label, map=maps[j, k], target_id=class_id,
                            target_name=prepared.loaded.class_names[class_id],
                            target_probability=float(probabilities[j, k]), predicted_id=int(best_id[j]),
                            predicted_name=prepared.loaded.class_names[int(best_id[j])],
                            predicted_probability=float(best_probability[j]), _image=i))
        for row in out:  # the dataset's own columns (ids, labels) come along with each image's rows
            image = row.pop("_image")
            row.update({name: batch[name][image] for name in carried})
        columns = {key: [row[key] for row in out] for key in (*_MAP_COLUMNS, *carried)}
        shapes = {m.shape for m in columns["map"]}
        columns["map"] = np.stack(columns["map"]) if len(shapes) == 1 else _object_array(columns["map"])
        return columns


#: The columns the decode tasks add, which the maps' rows leave out.
_DECODED = ("image_data", "image_shape", "image_dtype", "decode_error")
_MAP_COLUMNS = ("input", "method", "target", "target_id", "target_name", "target_probability", "predicted_id",
                "predicted_name", "predicted_probability", "map", "status", "error")


def _map_row(input: str, method: str, label: str, map=None, error: str | None = None, **values) -> dict:
    row = dict.fromkeys(_MAP_COLUMNS)
    row.update(input=input, method=method, target=label, status="failed" if error else "ok", error=error, **values)
    row["map"] = np.zeros((0, 0), np.float32) if map is None else map
    return row


def _object_array(values: list) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _metric_summary(location: str) -> tuple[str, str]:
    from .cli.common import MANIFEST
    from .cli.pipeline import metric_table
    from .cli.storage import OutputFolder
    from .evaluation import format_summary
    from .report import iter_json_records

    table = metric_table(iter_json_records(OutputFolder(location).lines(MANIFEST)))
    return (format_summary(table), format_summary(table, "html")) if table else ("", "")

