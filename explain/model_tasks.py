"""Which task a model does, read from its class or its output: classification, semantic
segmentation or detection (the names of :data:`explain.options.TASKS`), and the class
logits in a segmentation model's output."""

from __future__ import annotations

import torch  # noqa: F401 -- the doctests below use it
from torch import Tensor, nn

from .detectors import is_adapted, is_detr, is_yolo

__all__ = ["segmentation_logits", "task_of", "task_of_output", "torchvision_task"]


def torchvision_task(name: str) -> str | None:
    """``"segment"`` or ``"detect"`` for a torchvision segmentation or detection model name,
    else ``None``.

    >>> tuple(torchvision_task(name) for name in ("lraspp_mobilenet_v3_large", "fcos_resnet50_fpn", "resnet50"))
    ('segment', 'detect', None)
    """
    import torchvision.models as tvm

    if name in tvm.list_models(module=tvm.segmentation):
        return "segment"
    if name in tvm.list_models(module=tvm.detection):
        return "detect"
    return None


def task_of(model: nn.Module) -> str | None:
    """The task of a torchvision segmentation or detection model, from its class, or
    ``"detect"`` for a YOLO or DETR detector (:mod:`explain.detectors`), wrapped or not;
    ``None`` for any other model (see :func:`task_of_output`)."""
    from torchvision.models import segmentation
    from torchvision.models.detection.fcos import FCOS
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
    from torchvision.models.detection.retinanet import RetinaNet
    from torchvision.models.detection.ssd import SSD
    from torchvision.models.segmentation._utils import _SimpleSegmentationModel

    if (
        isinstance(model, (GeneralizedRCNN, RetinaNet, FCOS, SSD))
        or is_adapted(model)
        or is_yolo(model)
        or is_detr(model)
    ):
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


def segmentation_logits(output) -> Tensor:
    """The (N, C, H, W) class logits in a segmentation model's output: the output itself,
    or its ``"out"`` entry (torchvision's FCN, DeepLabV3 and LR-ASPP return a dict).

    >>> segmentation_logits({"out": torch.zeros(1, 3, 2, 2), "aux": torch.zeros(1, 3, 2, 2)}).shape
    torch.Size([1, 3, 2, 2])
    """
    logits = output.get("out") if isinstance(output, dict) else output
    if not isinstance(logits, Tensor) or logits.dim() != 4:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(output).__name__
        raise ValueError(
            f"a segmentation target needs (N, C, H, W) class logits, or a dict with them under 'out' as "
            f"torchvision's segmentation models return; the model returned {got}"
        )
    return logits
