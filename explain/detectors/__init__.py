"""Detectors beyond torchvision's: Ultralytics YOLO and Hugging Face DETR, read into the form
torchvision's detectors return (one dict of ``boxes``, ``labels`` and ``scores`` per image),
so that :class:`~explain.tasks.DetectionTarget`, :func:`~explain.tasks.explain_detections`,
the automatic target layer, every CAM and D-RISE take them.

- :func:`as_detector` wraps a YOLO or DETR model (:class:`YOLODetector`, :class:`DETRDetector`)
  and returns any other model as it is;
- :func:`detection_dicts` reads a detector's output: torchvision's dicts as they are, a raw
  YOLO head output decoded (:func:`decode_yolo`);
- :func:`proposals_of` gives D-RISE an image's proposals (box, class vector, objectness);
- :func:`backbone_roots` names the modules that form a detector's backbone.

>>> import torch
>>> from ultralytics.nn.tasks import DetectionModel          # doctest: +SKIP
>>> detector = as_detector(DetectionModel("yolov8n.yaml", verbose=False)).eval()  # doctest: +SKIP
>>> detector(torch.rand(1, 3, 128, 128))[0].keys()           # doctest: +SKIP
dict_keys(['boxes', 'labels', 'scores', 'proposal_boxes', 'proposal_classes'])
"""

from __future__ import annotations

from torch import Tensor, nn

from .detr import DETRDetector, decode_detr, is_detr
from .proposals import Proposals, keep_boxes, proposals_of
from .yolo import YOLODetector, decode_yolo, is_yolo, yolo_backbone_roots

__all__ = [
    "DETRDetector",
    "Proposals",
    "YOLODetector",
    "as_detector",
    "backbone_roots",
    "decode_detr",
    "decode_yolo",
    "detection_dicts",
    "is_adapted",
    "is_detr",
    "is_yolo",
    "keep_boxes",
    "proposals_of",
]


def as_detector(model: nn.Module, **options) -> nn.Module:
    """``model`` as a detector that returns torchvision's detections: a YOLO model wrapped in
    :class:`~explain.detectors.YOLODetector`, a DETR-style one in
    :class:`~explain.detectors.DETRDetector` (``options`` go to the wrapper:
    ``score_threshold``, ...), any other model as it is."""
    if is_yolo(model):
        return YOLODetector(model, **options)
    if is_detr(model):
        return DETRDetector(model, **options)
    return model


def is_adapted(model: nn.Module) -> bool:
    """Whether ``model`` is one of the wrappers of :func:`as_detector`."""
    return isinstance(model, (YOLODetector, DETRDetector))


def backbone_roots(model: nn.Module) -> tuple[str, ...]:
    """The names of the modules that form ``model``'s backbone: ``backbone`` in torchvision's
    segmentation and detection models, ``model.0`` to ``model.9`` in YOLOv8 (the layers its
    yaml lists as backbone), ``model.backbone`` in DETR; those a wrapper names. Empty where
    the model has none."""
    if is_adapted(model):
        return tuple(getattr(model, "backbone_roots", ()))
    if is_yolo(model):
        return yolo_backbone_roots(model)
    if is_detr(model):
        return ("model.backbone",)
    return ("backbone",) if isinstance(getattr(model, "backbone", None), nn.Module) else ()


def detection_dicts(output) -> list[dict[str, Tensor]] | None:
    """The per-image detections in a detector's output: torchvision's list of dicts as it
    is, a YOLO model's raw head output (a tensor (N, 4 + C, A), or the tuple whose first entry
    it is) decoded with ultralytics' defaults; None for anything else. A DETR output (its
    boxes are normalised, and the image size is not in it) is an error that names the fix."""
    if isinstance(output, (list, tuple)) and output and all(isinstance(p, dict) for p in output):
        return list(output)
    if hasattr(output, "pred_boxes") and hasattr(output, "logits"):
        raise ValueError(
            "a DETR output holds boxes normalised to an image size it does not record; wrap the model: "
            "explain.detectors.as_detector(model) returns the boxes in pixels"
        )
    raw = output[0] if isinstance(output, (list, tuple)) and output else output
    if isinstance(raw, Tensor) and raw.dim() == 3 and raw.is_floating_point():
        return decode_yolo(raw)
    return None
