"""Which task a model does, its target layer for CAMs, and loading torchvision's
segmentation and detection models by name."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import torch
from torch import Tensor, nn
from torchvision import transforms

from ..models import _read_state_dict
from ..options import TASKS

__all__ = ["TASKS", "backbone_layer", "load", "preprocess_for", "task_of", "task_of_output", "torchvision_task"]

#: Backbone parts that serve the detection head rather than compute the image's features:
#: feature pyramids and SSD's extra layers.
_HEAD_PARTS = ("fpn", "extra")


def torchvision_task(name: str) -> str | None:
    """``"segment"`` or ``"detect"`` for a torchvision segmentation or detection model name,
    else ``None``.

    >>> torchvision_task("lraspp_mobilenet_v3_large"), torchvision_task("fcos_resnet50_fpn"), torchvision_task("resnet50")
    ('segment', 'detect', None)
    """
    import torchvision.models as tvm

    if name in tvm.list_models(module=tvm.segmentation):
        return "segment"
    if name in tvm.list_models(module=tvm.detection):
        return "detect"
    return None


def task_of(model: nn.Module) -> str | None:
    """The task of a torchvision segmentation or detection model, from its class; ``None``
    for any other model (see :func:`task_of_output`)."""
    from torchvision.models import segmentation
    from torchvision.models.detection.fcos import FCOS
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
    from torchvision.models.detection.retinanet import RetinaNet
    from torchvision.models.detection.ssd import SSD
    from torchvision.models.segmentation._utils import _SimpleSegmentationModel

    if isinstance(model, (GeneralizedRCNN, RetinaNet, FCOS, SSD)):
        return "detect"
    if isinstance(model, (_SimpleSegmentationModel, segmentation.LRASPP)):
        return "segment"
    return None


def task_of_output(output) -> str | None:
    """The task a model output looks like: (N, classes) logits classify, (N, C, H, W) logits
    or a dict with ``"out"`` segment, a list of dicts with ``boxes`` detect; else ``None``.

    >>> task_of_output(torch.zeros(2, 10)), task_of_output({"out": torch.zeros(1, 3, 4, 4)})
    ('classify', 'segment')
    """
    if isinstance(output, Tensor):
        return {2: "classify", 4: "segment"}.get(output.dim())
    if isinstance(output, dict) and isinstance(output.get("out"), Tensor) and output["out"].dim() == 4:
        return "segment"
    if isinstance(output, (list, tuple)) and output and all(isinstance(p, dict) and "boxes" in p for p in output):
        return "detect"
    return None


def backbone_layer(model: nn.Module, example: Tensor) -> str:
    """The target layer for CAMs of a segmentation or detection model: the last layer of
    ``model.backbone`` whose output is one spatial (N, C, h, w) tensor, feature pyramids and
    SSD's extra layers left out (their outputs are dicts or lists, or serve the head).

    Picks ``backbone.layer4`` in torchvision's ResNet segmentation models,
    ``backbone.body.layer4`` in ResNet-FPN detectors, the last MobileNet block in the
    MobileNet ones, ``backbone.features`` in SSD300-VGG16. One forward pass on ``example``
    finds it; layers that run more than once in a pass are left out.
    """
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise ValueError(f"{type(model).__name__} has no `backbone` to pick a target layer from; pass target_layer "
                         "explicitly (`explain layers MODEL` lists the layers)")
    from ..layers import module_calls  # here: explain.layers imports this module

    calls = [(name, shape) for name, _, shape in module_calls(model, example[:1])
             if name.startswith("backbone.") and name.split(".")[1] not in _HEAD_PARTS]
    counts = Counter(name for name, _ in calls)
    spatial = [name for name, shape in calls if shape is not None and len(shape) == 4 and shape[-2] * shape[-1] > 1
               and counts[name] == 1]
    if not spatial:
        raise ValueError(f"no layer of {type(model).__name__}.backbone outputs one spatial tensor; pass target_layer "
                         "explicitly (`explain layers MODEL` lists the layers)")
    return spatial[-1]


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
    from ..models import IMAGENET_MEAN, IMAGENET_STD

    return transforms.Compose([transforms.Resize(520), transforms.ToTensor(),
                               transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def load(name: str, weights: str | os.PathLike | None = None, *,
         device: torch.device | str = "cpu") -> tuple[nn.Module, object, list[str]]:
    """Load a torchvision segmentation or detection model in eval mode, with its
    preprocessing and class names (from the weights' metadata, offline).

    ``weights``: ``None`` for random weights (nothing is downloaded, the backbone's included),
    a local state-dict file (a fine-tuned head with another number of classes is fine), or
    a weight enum name such as ``"DEFAULT"`` or ``"COCO_V1"`` (downloads on first use).
    """
    import torchvision.models as tvm

    task = torchvision_task(name)
    if task is None:
        raise ValueError(f"{name!r} is not a torchvision segmentation or detection model")
    known = tvm.get_model_weights(name)
    default = known.DEFAULT
    if weights is None or Path(weights).suffix in (".pt", ".pth", ".bin", ".ckpt") or Path(weights).is_file():
        state = None if weights is None else _read_state_dict(Path(weights))
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
            raise ValueError(f"{name} has no weights {weights!r}; known: {', '.join(w.name for w in known)}, or a "
                             "local file") from None
        try:
            model = tvm.get_model(name, weights=enum)
        except (OSError, RuntimeError) as error:  # URLError is an OSError
            raise RuntimeError(f"could not download the {enum} weights ({error}); on an offline machine download "
                               "them elsewhere and pass the .pth file as weights=") from error
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
