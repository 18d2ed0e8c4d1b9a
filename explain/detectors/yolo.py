"""Ultralytics YOLO detectors, read from the raw output of their head.

In eval mode an ultralytics ``DetectionModel`` (YOLOv5u, v8, 11 and their kin, built from a
model yaml or loaded from a ``.pt`` checkpoint) returns a tuple whose first entry is
(N, 4 + C, A): for each of A anchor points a box ``(cx, cy, w, h)`` in input pixels and C
sigmoid class scores. The classic YOLOv5 head (anchor boxes, the ``yolov5`` repository's
``Detect``) returns (N, A, 5 + C) instead: box, objectness, class scores. :func:`decode_yolo`
reads either into torchvision's form (:mod:`explain.detectors.proposals`), as ultralytics'
own prediction does: a box's score is its best class score (times its objectness, in the
classic layout), kept above 0.25 and through class-wise non-maximum suppression at IoU 0.7,
at most 300 boxes. :class:`YOLODetector` wraps a model so that it returns that form.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert, clip_boxes_to_image

from .proposals import keep_boxes

__all__ = ["YOLODetector", "decode_yolo", "is_yolo", "yolo_backbone_roots"]

#: The names of the ultralytics (and yolov5) detection heads read here; segmentation, pose and
#: oriented-box heads add columns that are no class scores.
DETECTION_HEADS = ("Detect", "v10Detect")


def yolo_head(model: nn.Module) -> nn.Module | None:
    """The detection head of a YOLO ``DetectionModel`` (its last layer), or None."""
    layers = getattr(model, "model", None)
    if not isinstance(layers, nn.Sequential) or not len(layers):
        return None
    head = layers[-1]
    return head if type(head).__name__ in DETECTION_HEADS and hasattr(head, "nc") else None


def is_yolo(model: nn.Module) -> bool:
    """Whether ``model`` is a YOLO detection model (ultralytics' or yolov5's ``DetectionModel``)."""
    return yolo_head(model) is not None


def yolo_backbone_roots(model: nn.Module) -> tuple[str, ...]:
    """The names of a YOLO model's backbone layers: ``model.0`` up to the last layer its
    yaml lists under ``backbone`` (``model.9``, SPPF, in YOLOv8)."""
    spec = getattr(model, "yaml", None)
    depth = len(spec["backbone"]) if isinstance(spec, dict) and "backbone" in spec else 0
    return tuple(f"model.{i}" for i in range(depth))


def decode_yolo(
    raw: Tensor,
    *,
    anchored: bool | None = None,
    size: tuple[int, int] | None = None,
    score_threshold: float = 0.25,
    iou_threshold: float = 0.7,
    max_detections: int = 300,
) -> list[dict[str, Tensor]]:
    """Detections per image (see :func:`~explain.detectors.keep_boxes`) from a YOLO
    head's raw output: (N, 4 + C, A) anchor-free (``anchored=False``), or the classic
    (N, A, 5 + C) with objectness (``anchored=True``); None reads the layout from the shape
    (more rows than columns: the classic one). Boxes are clipped to ``size`` (H, W) where
    given, as ultralytics clips them to the image. Each dict also holds every proposal
    (``proposal_boxes``, ``proposal_classes`` and ``proposal_objectness``: the head's
    objectness in the classic layout; in the anchor-free one, which folds objectness into the
    class scores, the proposal's best class score).

    >>> import torch
    >>> raw = torch.zeros(1, 6, 8)   # 2 classes, 8 anchors
    >>> raw[0, :4, 0] = torch.tensor([10.0, 10, 4, 4]); raw[0, 5, 0] = 0.9
    >>> found = decode_yolo(raw)[0]
    >>> found["boxes"].tolist(), found["labels"].tolist(), round(float(found["scores"][0]), 2)
    ([[8.0, 8.0, 12.0, 12.0]], [1], 0.9)
    """
    if raw.dim() != 3:
        raise ValueError(f"a YOLO head's raw output is (N, 4 + classes, anchors); got shape {tuple(raw.shape)}")
    if anchored is None:
        anchored = raw.shape[1] > raw.shape[2]
    rows = raw if anchored else raw.transpose(1, 2)
    boxes = box_convert(rows[..., :4], "cxcywh", "xyxy")
    if size is not None:
        boxes = clip_boxes_to_image(boxes, size)
    objectness = rows[..., 4] if anchored else None
    classes = rows[..., 5:] if anchored else rows[..., 4:]
    found = []
    for i in range(len(rows)):
        confidence = classes[i] if objectness is None else classes[i] * objectness[i, :, None]
        kept = keep_boxes(
            boxes[i],
            confidence,
            score_threshold=score_threshold,
            iou_threshold=iou_threshold,
            max_detections=max_detections,
        )
        # The anchor-free head folds objectness into its class scores: a proposal's best
        # class score, the confidence ultralytics thresholds, stands for it.
        kept.update(
            proposal_boxes=boxes[i],
            proposal_classes=classes[i],
            proposal_objectness=classes[i].amax(dim=1) if objectness is None else objectness[i],
        )
        found.append(kept)
    return found


class YOLODetector(nn.Module):
    """A YOLO detection model that returns torchvision's detections (one dict of boxes,
    labels and scores per image, plus the proposals; see :func:`decode_yolo`), so that
    :class:`~explain.tasks.DetectionTarget`, :func:`~explain.tasks.explain_detections`, the
    automatic layer (the last backbone layer, SPPF in YOLOv8) and every CAM take it.

    The images are (N, 3, H, W) in [0, 1], H and W multiples of the model's largest stride
    (32), as ultralytics feeds them. A box's score is the sigmoid score of its class (times
    its objectness in the classic YOLOv5 layout), taken from the head's output on the
    autograd graph; only the choice of the boxes (threshold, suppression) is detached.

    >>> from ultralytics.nn.tasks import DetectionModel  # doctest: +SKIP
    >>> detector = YOLODetector(DetectionModel("yolov8n.yaml", verbose=False)).eval()  # doctest: +SKIP
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        score_threshold: float = 0.25,
        iou_threshold: float = 0.7,
        max_detections: int = 300,
        class_names: Sequence[str] | None = None,
    ):
        super().__init__()
        head = yolo_head(model)
        if head is None:
            raise ValueError(
                f"{type(model).__name__} is not a YOLO detection model: its last layer is no Detect head "
                "(segmentation, pose and oriented-box YOLO models are not read as detectors)"
            )
        self.model = model
        self.anchored = hasattr(head, "na")  # the classic YOLOv5 head has anchor boxes, na per cell
        self.score_threshold, self.iou_threshold = float(score_threshold), float(iou_threshold)
        self.max_detections = int(max_detections)
        count: int = getattr(head, "nc")  # noqa: B009 -- an int attribute, which Module's typing would hide
        names = getattr(model, "names", None)
        if class_names is None and isinstance(names, dict):
            class_names = [str(names.get(i, i)) for i in range(count)]
        self.class_names = list(class_names) if class_names is not None else [str(i) for i in range(count)]
        self.backbone_roots = tuple(f"model.{root}" for root in yolo_backbone_roots(model))

    def forward(self, images: Tensor) -> list[dict[str, Tensor]]:
        """The detections of ``images`` (see :func:`~explain.detectors.decode_yolo`)."""
        head = yolo_head(self.model)
        anchors = getattr(head, "anchors", None)
        if isinstance(anchors, Tensor) and anchors.is_inference() and not torch.is_inference_mode_enabled():
            # The head keeps the anchors of the last input size; made in inference mode (a
            # perturbation method's passes), they cannot enter a graph: have them made again.
            setattr(head, "shape", None)  # noqa: B010 -- the head is known to be there (checked in __init__)
        output = self.model(images)
        raw = output[0] if isinstance(output, (tuple, list)) else output
        return decode_yolo(
            raw,
            anchored=self.anchored,
            size=(images.shape[-2], images.shape[-1]),
            score_threshold=self.score_threshold,
            iou_threshold=self.iou_threshold,
            max_detections=self.max_detections,
        )
