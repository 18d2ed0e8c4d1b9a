"""torchvision's semantic segmentation and detection models by name, with their preprocessing
and class names."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn
from torchvision import transforms

from ..imagenet import IMAGENET_MEAN, IMAGENET_STD
from ..model_tasks import torchvision_task
from .devices import checked_device
from .files import read_state_dict

__all__ = ["load_task_model", "preprocess_for"]


def preprocess_for(model: nn.Module, task: str, preprocess=None):
    """The preprocessing of a segmentation or detection model for the command line.

    A detector takes images in [0, 1] and normalises them itself; they are resized to its
    own smaller side (``model.transform.min_size``), so that the detector's resizing is about
    the identity and the maps are drawn at the size the detector sees. (``Normalize`` with
    mean 0 and std 1 is the identity; it lets the command line move the uint8 pixels and do
    the scaling on the model's device.) A segmentation model keeps ``preprocess`` (its
    weights' transforms), or gets an ImageNet-normalised resize of the smaller side to 520,
    as torchvision's segmentation weights use.
    """
    if task == "detect":
        transform = getattr(model, "transform", None)
        side = getattr(transform, "min_size", (800,))[-1]
        limit = getattr(transform, "max_size", None)
        resize = transforms.Resize(side, max_size=limit if limit and limit > side else None)
        return transforms.Compose([resize, transforms.ToTensor(), transforms.Normalize((0.0,) * 3, (1.0,) * 3)])
    if preprocess is not None:
        return preprocess
    return transforms.Compose(
        [transforms.Resize(520), transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )


def load_task_model(
    name: str, weights: str | os.PathLike | None = None, *, device: torch.device | str = "cpu"
) -> tuple[nn.Module, Callable[..., Tensor], list[str]]:
    """Load a torchvision segmentation or detection model in eval mode, with its
    preprocessing and class names (from the weights' metadata, offline).

    ``weights``: ``None`` for random weights (nothing is downloaded, the backbone's included),
    a local state-dict file (a fine-tuned head with another number of classes is fine), or
    a weight enum name such as ``"DEFAULT"`` or ``"COCO_V1"`` (downloads on first use).
    """
    import torchvision.models as tvm

    device = checked_device(device)
    task = torchvision_task(name)
    if task is None:
        raise ValueError(f"{name!r} is not a torchvision segmentation or detection model")
    known = tvm.get_model_weights(name)
    default = known.DEFAULT
    if weights is None or Path(weights).suffix in (".pt", ".pth", ".bin", ".ckpt") or Path(weights).is_file():
        state = None if weights is None else read_state_dict(Path(weights))
        classes = list(default.meta["categories"])
        num_classes = len(classes) if state is None else _num_classes(state, task, len(classes))
        model = tvm.get_model(name, weights=None, weights_backbone=None, num_classes=num_classes)
        if state is not None:
            model.load_state_dict(state, strict=not any(key.startswith("aux_classifier") for key in state))
        if num_classes != len(classes):
            classes = [str(i) for i in range(num_classes)]
        enum = default
    else:
        try:
            enum = default if str(weights) == "DEFAULT" else known[str(weights)]
        except KeyError:
            raise ValueError(
                f"{name} has no weights {weights!r}; known: {', '.join(w.name for w in known)}, or a local file"
            ) from None
        try:
            model = tvm.get_model(name, weights=enum)
        except (OSError, RuntimeError) as error:  # URLError is an OSError
            raise RuntimeError(
                f"could not download the {enum} weights ({error}); on an offline machine download "
                "them elsewhere and pass the .pth file as weights="
            ) from error
        classes = list(enum.meta["categories"])
    model = model.to(device).eval()
    model.class_names = classes
    preprocess = preprocess_for(model, task, enum.transforms() if task == "segment" else None)
    return model, preprocess, classes


def _num_classes(state: dict[str, Tensor], task: str, default: int) -> int:
    """The number of classes of a segmentation or detection state dict, read from its
    classification head; ``default`` where no known head is found."""
    heads = {
        "segment": ("classifier.4.weight", "classifier.low_classifier.weight"),  # FCN and DeepLabV3; LR-ASPP
        "detect": ("roi_heads.box_predictor.cls_score.weight",),  # Faster and Mask R-CNN
    }[task]
    for key in heads:
        if key in state:
            return int(state[key].shape[0])
    return default
