"""Hugging Face DETR-style detectors (``DetrForObjectDetection`` and its kin): a fixed set of
queries, each with class logits over the classes and a last "no object" class, and a box
``(cx, cy, w, h)`` normalised to the image.

:func:`decode_detr` reads them into torchvision's form (:mod:`explain.detectors.proposals`)
as ``DetrImageProcessor.post_process_object_detection`` does: a query's score and label are
its best softmax probability among the real classes, kept above 0.5, with no suppression
(DETR predicts a set); boxes are scaled to the image's pixels. :class:`DETRDetector` wraps
a model so that it returns that form.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torchvision.ops import box_convert

from .proposals import keep_boxes

__all__ = ["DETRDetector", "decode_detr", "is_detr"]


def is_detr(model: nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face DETR-style detector: a transformers model whose
    config names a ``...ForObjectDetection`` architecture with queries (``num_queries``)."""
    config = getattr(model, "config", None)
    return (
        type(model).__name__.endswith("ForObjectDetection")
        and hasattr(config, "num_queries")
        and isinstance(getattr(model, "model", None), nn.Module)
    )


def decode_detr(
    logits: Tensor,
    pred_boxes: Tensor,
    size: tuple[int, int],
    *,
    score_threshold: float = 0.5,
    max_detections: int = 100,
) -> list[dict[str, Tensor]]:
    """Detections per image from DETR's ``logits`` (N, Q, C + 1) and ``pred_boxes`` (N, Q, 4),
    normalised ``(cx, cy, w, h)``, on images of ``size`` (H, W). Each dict also holds every
    query as a proposal: its box and its whole softmax vector, "no object" included, as its
    class probability vector (``proposal_classes``, C + 1 columns; no objectness).

    >>> import torch
    >>> logits = torch.tensor([[[4.0, 0.0, 0.0], [0.0, 0.0, 4.0]]])   # 2 classes and no-object
    >>> boxes = torch.tensor([[[0.5, 0.5, 0.5, 0.5], [0.2, 0.2, 0.1, 0.1]]])
    >>> found = decode_detr(logits, boxes, (100, 200))[0]
    >>> found["boxes"].tolist(), found["labels"].tolist()
    ([[50.0, 25.0, 150.0, 75.0]], [0])
    """
    height, width = size
    scale = pred_boxes.new_tensor([width, height, width, height])
    boxes = box_convert(pred_boxes, "cxcywh", "xyxy") * scale
    probabilities = logits.softmax(dim=-1)
    found = []
    for i in range(len(logits)):
        kept = keep_boxes(
            boxes[i],
            probabilities[i, :, :-1],
            score_threshold=score_threshold,
            iou_threshold=None,
            max_detections=max_detections,
        )
        kept.update(proposal_boxes=boxes[i], proposal_classes=probabilities[i])
        found.append(kept)
    return found


class DETRDetector(nn.Module):
    """A Hugging Face DETR-style detector that returns torchvision's detections (see
    :func:`decode_detr`) for images (N, 3, H, W) normalised as its image processor does, so
    that :class:`~explain.tasks.DetectionTarget`, :func:`~explain.tasks.explain_detections`,
    the automatic layer (the last layer of its convolutional backbone) and every CAM take it.
    A box's score is its class probability, on the autograd graph.

    >>> from transformers import DetrForObjectDetection  # doctest: +SKIP
    >>> detector = DETRDetector(DetrForObjectDetection.from_pretrained(folder)).eval()  # doctest: +SKIP
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        score_threshold: float = 0.5,
        max_detections: int = 100,
        class_names: Sequence[str] | None = None,
    ):
        super().__init__()
        if not is_detr(model):
            raise ValueError(
                f"{type(model).__name__} is not a DETR-style detector (a transformers ...ForObjectDetection "
                "model with num_queries in its config)"
            )
        self.model = model
        self.score_threshold, self.max_detections = float(score_threshold), int(max_detections)
        config = getattr(model, "config")  # noqa: B009 -- a transformers config, which Module's typing would hide
        labels = getattr(config, "id2label", None) or {}
        count = int(config.num_labels)
        self.class_names = (
            list(class_names) if class_names is not None else [str(labels.get(i, i)) for i in range(count)]
        )
        self.backbone_roots = ("model.model.backbone",)

    def forward(self, images: Tensor) -> list[dict[str, Tensor]]:
        """The detections of ``images`` (see :func:`~explain.detectors.decode_detr`)."""
        output = self.model(pixel_values=images)
        return decode_detr(
            output.logits,
            output.pred_boxes,
            (images.shape[-2], images.shape[-1]),
            score_threshold=self.score_threshold,
            max_detections=self.max_detections,
        )
