"""Explaining images on Ray Data in pipelines of your own: :func:`explain_dataset`.

It runs the stages of ``explain run --engine ray`` (``explain.batch.ray_stages``): a decode
step in CPU tasks (the model's resize and crop, as ``explain run``'s DataLoader workers do) and
an explain step in a pool of actors that each load the model once and explain batches with the
same explainers, checks and settings as the command line. Ray is the optional extra
``explain-vision[ray]``. This module imports neither Ray nor torch until it is used.

For example (``tests/test_ray_engine.py`` runs the same on a local Ray)::

    import ray, explain.ray_data
    images = ray.data.read_images("photos/", include_paths=True, mode="RGB")
    maps = explain.ray_data.explain_dataset(images, methods="gradcam,layercam")
    row = maps.take(1)[0]
    row["method"], row["target_name"], row["map"].shape   # ('gradcam', 'tabby', (224, 224))
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np

from .batch.options import NameList, RunOptions
from .batch.ray_stages import (
    DECODE_CPUS,
    DECODED,
    ExplainingActor,
    actor_resources,
    decode_arrays,
    decode_files,
    decoded_groups,
    remote_prepare,
)
from .errors import UsageError
from .options import BUNDLED_MODEL

__all__ = ["explain_dataset"]


def explain_dataset(dataset, model: str = BUNDLED_MODEL, methods: str | Sequence[str] = "gradcam", *,
                    target: str = "top1", layer: str = "auto", weights: str | None = None, image_column: str = "image",
                    path_column: str = "path", batch_size: int = 16, actors: int | None = None,
                    device: str | None = None, max_memory: str | int | None = None):
    """Explain the images of a Ray ``dataset``; returns a dataset with one row per image,
    method and target.

    ``dataset`` has an ``image_column`` of (H, W, 3) uint8 arrays (what
    ``ray.data.read_images(..., mode="RGB")`` gives), or else a ``path_column`` of image files,
    read as ``explain run`` reads them. ``model``, ``weights``, ``methods`` (comma-separated, or a list),
    ``target`` and ``layer`` take what ``explain run``'s options take (``explain run --help``),
    for classifiers; the explainers are the command line's, checked on the model before any
    image runs. Each actor loads the model once; ``actors`` defaults as ``explain run --engine
    ray --actors``; ``max_memory`` (such as ``"2GB"``) bounds each actor's inner batches as
    ``--max-memory`` does.

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

    options = RunOptions(inputs=["-"], out="-", model=model, weights=weights, methods=NameList.parse(methods),
                         target=target, layer=NameList.parse(layer, "auto"), batch_size=batch_size, actors=actors,
                         device=device, max_memory=max_memory).with_absolute_paths()
    try:
        checked = remote_prepare(ray, options)
    except UsageError as error:
        raise ValueError(python_message(error)) from None
    if checked.task != "classify":
        raise ValueError(f"{model} is a {checked.task} model; explain_dataset explains classifiers "
                         "(explain run --engine ray runs segmentation and detection models)")
    columns = dataset.columns() or []
    if image_column in columns:
        decoded = dataset.map_batches(decode_arrays, fn_kwargs=dict(decoding=checked.decoding, column=image_column),
                                      batch_size=batch_size, num_cpus=DECODE_CPUS)
    elif path_column in columns:
        decoded = dataset.map_batches(decode_files, fn_kwargs=dict(decoding=checked.decoding, column=path_column,
                                                                    max_pixels=None),
                                      batch_size=batch_size, num_cpus=DECODE_CPUS)
    else:
        raise ValueError(f"the dataset has neither an {image_column!r} column of images nor a {path_column!r} column "
                         f"of files (its columns: {', '.join(columns)}); pass image_column= or path_column=")
    resources = actor_resources(ray, options, checked.device)
    return decoded.map_batches(MapActor, fn_constructor_kwargs=dict(options=options, threads=resources.pop("threads")),
                               batch_size=1 if checked.fixed_batch else batch_size, **resources)


class MapActor(ExplainingActor):
    """:func:`explain_dataset`'s actor: maps and targets as columns, nothing written."""

    def __call__(self, batch: dict) -> dict:
        prepared, inputs = self.explainer.prepared, self.explainer.inputs
        n = len(batch["decode_error"])
        names = [str(p) for p in batch["path"]] if "path" in batch else [None] * n
        carried = [name for name in batch if name not in DECODED and name not in _MAP_COLUMNS]
        labels, out = prepared.target.labels, []
        decoded = decoded_groups(batch)
        for i, error in decoded.failures:
            out += [_map_row(names[i], cam.name, label, error=error, _image=i) for cam in prepared.explainers
                    for label in labels]
        for positions, images in decoded.groups:
            model_input = inputs.model_input(images.to(prepared.loaded.device))
            for cam in prepared.explainers:
                try:
                    with self.explaining():
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
        maps = columns["map"]
        shapes = {m.shape for m in maps}
        return {**columns, "map": np.stack(maps) if len(shapes) == 1 else _object_array(maps)}


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


def python_message(error: UsageError) -> str:
    """A usage error of ``explain run``'s checks worded for :func:`explain_dataset`'s caller:
    each option it is about that is one of its parameters (the same Python name: ``methods``,
    ``max_memory``) named as the parameter; the others (``method_options``, which it does not
    take) as the command line's flags.

    >>> from explain.errors import Option
    >>> python_message(UsageError(Option("max_memory"), " 2XB: give a size such as 2GB; ",
    ...                           Option("method_options"), " ig: ..."))
    'max_memory 2XB: give a size such as 2GB; --method-option ig: ...'
    >>> python_message(UsageError(Option("methods"), ": unknown method 'gradcan'"))
    "methods: unknown method 'gradcan'"
    """
    return error.worded({name: name for name in inspect.signature(explain_dataset).parameters})
