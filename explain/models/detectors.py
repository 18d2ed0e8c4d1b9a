"""Detectors beyond torchvision's, loaded from what a user names: an Ultralytics YOLO model
(``yolo:FILE.pt``, a checkpoint, or ``yolo:FILE.yaml``, a model yaml with random weights) and
a Hugging Face DETR-style detector saved in a folder; each wrapped so that it returns
torchvision's detections (:mod:`explain.detectors`), with its preprocessing and class names.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor, nn
from torchvision import transforms

from ..detectors import DETRDetector, YOLODetector, is_yolo
from ..errors import Option, UsageError, first_line
from ..imagenet import IMAGENET_MEAN, IMAGENET_STD

__all__ = [
    "YOLO_PREFIX",
    "StrideResize",
    "detr_preprocess",
    "is_detector_spec",
    "is_huggingface_detector",
    "load_detector",
    "yolo_preprocess",
]

#: ``yolo:FILE`` names an Ultralytics YOLO model.
YOLO_PREFIX = "yolo:"
#: The image size ultralytics trains and predicts at by default (the longer side).
YOLO_SIZE = 640
#: The largest stride of a YOLO model: its input's sides are multiples of it.
YOLO_STRIDE = 32


def is_huggingface_detector(spec: str) -> bool:
    """Whether ``spec`` is a folder holding a Hugging Face object detector: its
    ``config.json`` names a ``...ForObjectDetection`` architecture."""
    config = Path(spec) / "config.json"
    if not config.is_file():
        return False
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    return any(str(name).endswith("ForObjectDetection") for name in architectures)


def is_detector_spec(spec: str) -> bool:
    """Whether ``--model spec`` names a YOLO model or a Hugging Face detector folder."""
    return spec.startswith(YOLO_PREFIX) or is_huggingface_detector(spec)


def load_detector(
    spec: str, trust: bool, device: torch.device
) -> tuple[nn.Module, Callable[..., Tensor], list[str], bool]:
    """The detector ``spec`` names, wrapped, in eval mode on ``device``, with its
    preprocessing, class names and whether its weights are random. Mistakes are
    :class:`~explain.errors.UsageError` that name the fix."""
    if spec.startswith(YOLO_PREFIX):
        model, size, random = _load_yolo(spec[len(YOLO_PREFIX) :], trust)
        detector: nn.Module = YOLODetector(model)
        preprocess = yolo_preprocess(size)
    else:
        detr = _load_huggingface_detector(Path(spec))
        detector, preprocess, random = DETRDetector(detr), detr_preprocess(Path(spec)), False
    names = list(getattr(detector, "class_names", []))
    return detector.to(device).eval(), preprocess, names, random


def _ultralytics():
    # Importing ultralytics replaces PIL.Image.open with a version that, on a file PIL cannot
    # identify, pip-installs a HEIF plugin and raises ModuleNotFoundError offline: it would turn
    # the CLI's "not an image" into a crash and a download. The library keeps PIL's own.
    pil_open = Image.open
    try:
        from ultralytics.nn import tasks
    except ImportError:
        raise UsageError("YOLO models need the ultralytics package: pip install 'explain-vision[yolo]'") from None
    finally:
        Image.open = pil_open
    return tasks


def _load_yolo(name: str, trust: bool) -> tuple[nn.Module, int, bool]:
    """A YOLO DetectionModel from a model yaml (random weights, seeded by the caller) or an
    ultralytics checkpoint, with the image size it works at."""
    path = Path(name)
    if path.suffix.lower() in (".yaml", ".yml"):
        tasks = _ultralytics()
        try:
            model = tasks.DetectionModel(name, verbose=False)
        except Exception as error:  # a missing or malformed yaml: ultralytics' own exception types vary
            raise UsageError(
                f"cannot build a YOLO model from {name}: {type(error).__name__}: {error}; pass an ultralytics "
                "detection model yaml (e.g. yolov8n.yaml) or a .pt checkpoint"
            ) from None
        return model.float(), YOLO_SIZE, True
    if not path.is_file():
        raise UsageError(f"YOLO model file {name} does not exist; pass yolo:FILE.pt (a checkpoint) or yolo:FILE.yaml")
    if not trust:
        raise UsageError(
            f"{name} is an ultralytics checkpoint, a pickle, and loading it runs code from the file. If you "
            "trust it, add ",
            Option("trust_model_file"),
        )
    _ultralytics()  # the checkpoint's classes live in ultralytics
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise UsageError(f"cannot load {name}: not a PyTorch file, or a damaged one ({type(error).__name__})") from None
    model = checkpoint
    if isinstance(checkpoint, dict):  # ultralytics keeps the EMA weights, where training left them, first
        model = checkpoint.get("ema") if checkpoint.get("ema") is not None else checkpoint.get("model")
    if not isinstance(model, nn.Module) or not is_yolo(model):
        raise UsageError(
            f"{name} holds no YOLO detection model (an ultralytics checkpoint has one under 'model'); pass a "
            "detection checkpoint such as yolov8n.pt, or a model yaml as yolo:FILE.yaml"
        )
    arguments = checkpoint.get("train_args") if isinstance(checkpoint, dict) else None
    size = (arguments or {}).get("imgsz", YOLO_SIZE) if isinstance(arguments, dict) else YOLO_SIZE
    return model.float(), int(size if isinstance(size, int) else max(size)), False


class StrideResize:
    """Resize a PIL image so that its longer side is about ``size`` and each side a multiple
    of ``stride`` (a plain resize: the aspect ratio changes by less than a stride).

    >>> from PIL import Image
    >>> StrideResize(128)(Image.new("RGB", (300, 200))).size
    (128, 96)
    """

    def __init__(self, size: int, stride: int = YOLO_STRIDE):
        self.size, self.stride = size, stride

    def __call__(self, image):
        width, height = image.size
        scale = self.size / max(width, height)
        sides = [max(self.stride, round(side * scale / self.stride) * self.stride) for side in (height, width)]
        return transforms.functional.resize(image, sides, interpolation=transforms.InterpolationMode.BILINEAR)

    def __repr__(self) -> str:
        return f"StrideResize(size={self.size}, stride={self.stride})"


def yolo_preprocess(size: int = YOLO_SIZE) -> transforms.Compose:
    """A YOLO model's preprocessing: the image resized so that its longer side is ``size``
    and each side a multiple of 32 (:class:`StrideResize`; no letterbox padding, so that the
    boxes and maps cover the image alone), scaled to [0, 1]. (``Normalize`` with mean 0 and
    std 1 is the identity; it lets the command line scale the pixels on the model's device.)"""
    return transforms.Compose([StrideResize(size), transforms.ToTensor(), transforms.Normalize((0.0,) * 3, (1.0,) * 3)])


def _load_huggingface_detector(folder: Path) -> nn.Module:
    try:
        from transformers import AutoModelForObjectDetection
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise UsageError(f"{folder} is a Hugging Face detector folder; install transformers to load it") from None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar per load would fill the CLI's stderr
    try:
        return AutoModelForObjectDetection.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot load the detector in {folder}: {first_line(error)}") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def detr_preprocess(folder: Path):
    """A DETR detector's preprocessing, as its ``preprocessor_config.json`` says: the shorter
    side resized to ``size["shortest_edge"]`` (800) with the longer at most
    ``size["longest_edge"]`` (1333), scaled to [0, 1] and normalised with ``image_mean`` and
    ``image_std`` (ImageNet's where the folder has no processor config)."""
    path = folder / "preprocessor_config.json"
    settings = json.loads(path.read_text()) if path.is_file() else {}
    size = settings.get("size") or {}
    shortest = int(size.get("shortest_edge", 800)) if isinstance(size, dict) else int(size)
    longest = size.get("longest_edge", 1333) if isinstance(size, dict) else None
    steps: list = []
    if settings.get("do_resize", True):
        steps.append(transforms.Resize(shortest, max_size=longest if longest and longest > shortest else None))
    steps += [
        transforms.ToTensor(),
        transforms.Normalize(settings.get("image_mean", IMAGENET_MEAN), settings.get("image_std", IMAGENET_STD)),
    ]
    return transforms.Compose(steps)
