"""The model to explain, loaded from what a user names: a classifier or a torchvision
segmentation or detection model by name, a Hugging Face folder, or a model file; with its
preprocessing, class names, device and task (:class:`LoadedModel`)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor, nn

from ..concurrency import process_lock
from ..errors import Option, UsageError, is_out_of_memory
from ..imagenet import IMAGENET_MEAN, IMAGENET_STD
from ..model_tasks import segmentation_logits, task_of, task_of_output, torchvision_task
from ..options import MODEL_FORM_PARTS
from . import classifiers
from .dense import load_task_model, preprocess_for
from .detectors import YOLO_PREFIX, is_detector_spec, load_detector
from .files import MODEL_FILE_SUFFIXES, WEIGHTS, read_model_file
from .volumes import blank_example, input_kind, scaled_frames

__all__ = ["LoadedModel", "load_model", "pick_device", "warn_if_random"]


@dataclass
class LoadedModel:
    """A model ready to explain, with what running it needs."""

    model: nn.Module
    preprocess: object
    class_names: list[str]
    device: torch.device
    example: Tensor  # one preprocessed image on the device
    fixed_batch: bool = False  # an exported program that only takes batches of one
    random_weights: bool = False  # a torchvision architecture named without --weights
    task: str = "classify"  # what the model does: classify, segment or detect (see explain.tasks)
    #: what the model takes: images, volumes (and videos) or signals; ``preprocess`` reads a PIL
    #: image for images, (T, C, H, W) uint8 frames for volumes, and nothing for signals (None)
    kind: str = "images"


def pick_device(name: str | None) -> torch.device:
    """The device called ``name`` (``cpu``, ``cuda``, ``cuda:N``), or CUDA where there is one
    when ``name`` is None."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("CUDA is not available on this machine; use ", Option("device"), " cpu")
    return device


def load_model(spec: str, weights: str | None, trust: bool, device_name: str | None) -> LoadedModel:
    """The model ``spec`` names (a classifier's name, a torchvision segmentation or detection
    model's name, ``yolo:FILE``, a Hugging Face folder, or a model file), loaded on the device,
    with its preprocessing, class names and task. Mistakes are :class:`~explain.errors.UsageError`.

    Random weights (a name without --weights) are drawn from a fixed seed, so that every
    process of a run (the Ray engine's actors) and every rerun has the same model."""
    device, path = pick_device(device_name), Path(spec)
    if is_detector_spec(spec):
        return _load_detector(spec, weights, trust, device)
    named = spec.startswith(classifiers.TIMM_PREFIX) or classifiers.is_huggingface_folder(spec)
    class_names: list[str] | None
    if named or not (path.suffix.lower() in MODEL_FILE_SUFFIXES or os.sep in spec or path.is_file()):
        task = torchvision_task(spec)
        with process_lock, torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            try:
                if task is None:
                    model, preprocess, class_names = classifiers.load(spec, weights, device=device)
                    task = "classify"
                else:
                    model, preprocess, class_names = load_task_model(spec, weights, device=device)
            except classifiers.UnknownModel as error:
                hint = f"did you mean {', '.join(error.close)}? A" if error.close else "a"
                raise UsageError(f"unknown model {spec!r}; {hint} model is ", *MODEL_FORM_PARTS) from None
            except (ValueError, FileNotFoundError, RuntimeError) as error:
                if is_out_of_memory(error):  # allocating the weights: the machine's limit, exit 3
                    raise
                raise UsageError(f"{error}") from None
        fixed_batch = False
        random_weights = weights is None and not (
            classifiers.is_bundled(spec) or classifiers.is_huggingface_folder(spec))
    else:
        model, preprocess, class_names, task, fixed_batch = _from_file(path, weights, trust, device)
        random_weights = False
    kind = input_kind(model, spec)
    if kind == "images":
        example = preprocess(Image.new("RGB", (256, 256), (124, 116, 104))).unsqueeze(0).to(device)
    else:
        example = blank_example(model, kind, preprocess, device)
        if preprocess is None and kind == "volumes":  # a model file: its videos' frames scaled to [0, 1]
            preprocess = scaled_frames
    if class_names is None or task is None:
        with torch.no_grad():
            output = model(example)
        task = task or task_of_output(output)
        if task is None:
            raise UsageError(f"{spec} returns {type(output).__name__}, not (N, num_classes) logits, (N, C, H, W) "
                             "segmentation logits, or a detector's boxes")
    if class_names is None:
        if task == "detect":
            class_names = []  # unknown: labels are shown as ids
        else:
            classes = output.shape[1] if task == "classify" else segmentation_logits(output).shape[1]
            class_names = classifiers.imagenet_classes() if classes == 1000 else [str(i) for i in range(classes)]
        model.class_names = class_names  # type: ignore[assignment]  # torch types Module attributes as tensors or modules
    return LoadedModel(
        model, preprocess, list(class_names), device, example, fixed_batch, random_weights, task, kind
    )


def _from_file(path: Path, weights: str | None, trust: bool, device: torch.device):
    """(model, preprocess, class names, task, fixed_batch) of a model file."""
    if not path.is_file():
        raise UsageError(
            f"model file {path} does not exist; pass an existing file, {classifiers.BUNDLED!r}, "
            "or a torchvision model name such as resnet50"
        )
    if weights:
        raise UsageError(
            WEIGHTS, " goes with a model name (e.g. ", Option("model"), " resnet50 ", WEIGHTS, " FILE); "
            "a model file carries its own weights"
        )
    model, crop = read_model_file(path, trust)
    model = model.to(device).eval()
    task = task_of(model)
    images = input_kind(model) == "images"  # volumes and signals are read as arrays, not preprocessed
    preprocess = _file_preprocess(model, crop) if images else None
    if task == "detect":  # a detector normalises the images itself
        preprocess = preprocess_for(model, task)
    fixed_batch = images and path.suffix.lower() == ".pt2" and not _accepts_batches(model, preprocess, device)
    return model, preprocess, getattr(model, "class_names", None), task, fixed_batch


def _file_preprocess(model: nn.Module, crop: tuple[int, int]):
    """ImageNet's resize, centre crop and normalisation to ``crop``, or what the model's
    ``pretrained_cfg`` says of them (timm's keys, which a pickled timm model carries:
    ``input_size``, ``crop_pct``, ``interpolation``, ``mean``, ``std``; the resize to the
    crop's larger side over ``crop_pct``, rounded down, as timm's eval transform; its
    ``crop_mode`` is not read: always a centre crop)."""
    config = getattr(model, "pretrained_cfg", None)
    config = config if isinstance(config, dict) else {}
    if len(config.get("input_size") or ()) == 3:
        crop = (int(config["input_size"][1]), int(config["input_size"][2]))
    share = float(config.get("crop_pct") or 224 / 256)
    interpolation = str(config.get("interpolation"))
    interpolation = interpolation if interpolation in ("bicubic", "nearest") else "bilinear"
    mean, std = tuple(config.get("mean") or IMAGENET_MEAN), tuple(config.get("std") or IMAGENET_STD)
    return classifiers.imagenet_preprocess(math.floor(max(crop) / share), crop, mean, std, interpolation)


def _load_detector(spec: str, weights: str | None, trust: bool, device: torch.device) -> LoadedModel:
    """A YOLO model or a Hugging Face detector (:mod:`explain.models.detectors`), wrapped to
    return torchvision's detections."""
    if weights:
        raise UsageError(
            WEIGHTS, f" goes with a torchvision or timm model name; {spec} carries its own weights "
            "(yolo:FILE.pt, a Hugging Face folder), or has random ones (yolo:FILE.yaml)"
        )
    with process_lock, torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # a yaml's random weights: the same in every process and rerun
        model, preprocess, class_names, random_weights = load_detector(spec, trust, device)
    example = preprocess(Image.new("RGB", (256, 256), (124, 116, 104))).unsqueeze(0).to(device)
    model.class_names = class_names  # type: ignore[assignment]  # torch types Module attributes as tensors or modules
    return LoadedModel(model, preprocess, class_names, device, example, random_weights=random_weights, task="detect")


def _accepts_batches(model: nn.Module, preprocess, device: torch.device) -> bool:
    pair = preprocess(Image.new("RGB", (256, 256))).unsqueeze(0).repeat(2, 1, 1, 1).to(device)
    try:
        with torch.no_grad():
            model(pair)
    except Exception:
        return False
    return True


def warn_if_random(loaded: LoadedModel, model: str) -> None:
    """Say on stderr that ``loaded`` (named ``model``) has random weights, if it has."""
    if loaded.random_weights and model.startswith(YOLO_PREFIX):
        print(f"explain: warning: {model} has random weights (seed 0), so its maps explain an untrained model; "
              "pass a trained checkpoint: --model yolo:FILE.pt", file=sys.stderr)
    elif loaded.random_weights:
        print(f"explain: warning: {model} has random weights (seed 0), so its maps explain an untrained model; "
              "pass --weights FILE (a state dict) or --weights DEFAULT (torchvision's, downloads)", file=sys.stderr)
