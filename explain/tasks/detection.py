"""Detection targets: explain why a detector found a box.

torchvision's detectors (Faster R-CNN, RetinaNet, FCOS, SSD and their kin) return, in eval
mode, one dict per image with ``boxes`` (K, 4) as ``(x0, y0, x1, y1)`` in input pixels,
``labels`` (K,) and ``scores`` (K,). :class:`DetectionTarget` scores a reference box in such
an output, so that any CAM of the library explains it; :func:`explain_detections` picks the
boxes (by index, by class, or all above a score) and explains each one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_iou

from ..base import Explainer
from ..checks import check_images
from ..detectors import detection_dicts
from ..explanation import Explanation, scale_maps
from ..hooks import preserved_state

__all__ = ["Detection", "DetectionTarget", "crop_padding", "detections_of", "explain_detections"]


@dataclass(frozen=True)
class Detection:
    """One box to explain: the image it belongs to, where it is, its class, and, for a box
    the detector found, its score and its position among that image's detections."""

    image: int
    box: tuple[float, float, float, float]
    label: int
    score: float | None = None
    index: int | None = None

    def describe(self, class_names: Sequence[str] | None = None) -> dict:
        """The box as a plain dict (for a manifest): task, box, class id and name, score, index."""
        known = class_names is not None and 0 <= self.label < len(class_names)
        name = class_names[self.label] if class_names is not None and known else str(self.label)
        return {
            "task": "detect",
            "box": [round(v, 2) for v in self.box],
            "class_id": self.label,
            "class_name": name,
            "score": None if self.score is None else round(self.score, 6),
            "index": self.index,
        }


def detections_of(output) -> list[dict[str, Tensor]]:
    """The per-image dicts of a detector's output, checked to hold boxes, labels and scores:
    torchvision's, those of a wrapped YOLO or DETR model (:func:`~explain.detectors.as_detector`),
    or a raw YOLO head output, decoded (:func:`~explain.detectors.detection_dicts`)."""
    found = detection_dicts(output)
    if not found or not all({"boxes", "labels", "scores"} <= p.keys() for p in found):
        raise ValueError(
            "a detection target needs a detector's output in eval mode: a list with one dict of boxes, labels and "
            f"scores per image, as torchvision's detectors return; got {type(output).__name__} (a detector in "
            "training mode returns losses: call model.eval(); wrap a YOLO or DETR model with "
            "explain.detectors.as_detector)"
        )
    return found


class DetectionTarget:
    """The score of a reference box in a detector's output: row r of the batch explains box r.

    The score is that of the predicted box with the reference's class whose IoU with the
    reference is highest and at least ``iou_threshold`` (ties go to the higher score), and 0
    where no predicted box matches (the map is then blank). Matching by IoU and class follows
    pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` and D-RISE (Petsiuk et al., "Black-box
    Explanation of Object Detectors via Saliency Maps", CVPR 2021), which scores a perturbed
    image's detections by their IoU with the reference and their class. pytorch-grad-cam also
    adds the IoU to the score, which would explain the box's regression as well as its class,
    and picks the best IoU before checking the class.

    Parameters
    ----------
    boxes:
        Reference boxes (R, 4) as ``(x0, y0, x1, y1)`` in input pixels, one per row of the
        batch to explain (a single box serves every row).
    labels:
        Their class ids (R,).
    iou_threshold:
        The least IoU at which a predicted box matches the reference (0.5, as usual).

    Notes
    -----
    :meth:`select` makes a target from the detector's own boxes; its ``detections`` say which
    image each row comes from (``image_ids``, to repeat the images, one row per box).

    Examples
    --------
    >>> output = [{"boxes": torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 8]]),
    ...            "labels": torch.tensor([2, 1]), "scores": torch.tensor([0.9, 0.3])}]
    >>> DetectionTarget([[0, 0, 10, 10]], [1])(output).tolist()   # IoU 0.8 with the class-1 box
    [0.30000001192092896]
    >>> DetectionTarget([[0, 0, 10, 10]], [1], iou_threshold=0.9)(output).tolist()
    [0.0]
    """

    def __init__(self, boxes, labels, *, iou_threshold: float = 0.5):
        boxes = torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4) if len(boxes) else torch.zeros(0, 4)
        labels = torch.as_tensor(labels).reshape(-1) if len(labels) else torch.zeros(0, dtype=torch.long)
        if labels.is_floating_point() or labels.dtype == torch.bool:
            raise TypeError(f"labels must be int class ids, got {labels.dtype}")
        if len(boxes) != len(labels):
            raise ValueError(f"got {len(boxes)} boxes and {len(labels)} labels; give one label per box")
        if not torch.isfinite(boxes).all() or (boxes[:, 2] < boxes[:, 0]).any() or (boxes[:, 3] < boxes[:, 1]).any():
            raise ValueError(f"a box is (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1; got {boxes.tolist()}")
        if isinstance(iou_threshold, bool) or not isinstance(iou_threshold, (int, float)) or not 0 < iou_threshold <= 1:
            raise ValueError(f"iou_threshold must lie in (0, 1], got {iou_threshold!r}")
        self.boxes, self.labels, self.iou_threshold = boxes, labels.long(), float(iou_threshold)
        self.detections: tuple[Detection, ...] = tuple(
            Detection(row, tuple(box), int(label))
            for row, (box, label) in enumerate(zip(boxes.tolist(), labels.tolist(), strict=True))
        )

    @classmethod
    def select(
        cls,
        output,
        *,
        index: int | Sequence[int] | None = None,
        label: int | None = None,
        min_score: float | None = None,
        iou_threshold: float = 0.5,
    ) -> DetectionTarget:
        """A target for boxes the detector found in ``output`` (its output on the images).

        Per image: ``index`` picks the box(es) at those positions of its detections
        (torchvision sorts them by score, so 0 is the best); ``label`` every box of that
        class and ``min_score`` every box scoring at least that, both together where both are
        given, best first; with none of them, the best-scoring box. Images with no such box
        get no row.
        """
        if index is not None and (label is not None or min_score is not None):
            raise ValueError("select boxes by index, or by label and/or min_score, not both")
        positions = None if index is None else [index] if isinstance(index, int) else list(index)
        if positions is not None and any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in positions):
            raise ValueError(f"index must be a non-negative int or a list of them, got {index!r}")
        found = []
        for image, prediction in enumerate(detections_of(output)):
            scores = prediction["scores"].detach().float().cpu()
            labels = prediction["labels"].detach().cpu()
            if positions is not None:
                chosen = [p for p in positions if p < len(scores)]
            elif label is None and min_score is None:
                chosen = [int(scores.argmax())] if len(scores) else []
            else:
                keep = torch.ones(len(scores), dtype=torch.bool)
                if label is not None:
                    keep &= labels == label
                if min_score is not None:
                    keep &= scores >= min_score
                chosen = sorted(keep.nonzero()[:, 0].tolist(), key=lambda p: -float(scores[p]))
            boxes = prediction["boxes"].detach().float().cpu()
            found += [Detection(image, tuple(boxes[p].tolist()), int(labels[p]), float(scores[p]), p) for p in chosen]
        target = cls([d.box for d in found], [d.label for d in found], iou_threshold=iou_threshold)
        target.detections = tuple(found)
        return target

    def subset(self, rows: Sequence[int]) -> DetectionTarget:
        """The target of rows ``rows`` only (to explain many boxes a batch at a time).

        >>> DetectionTarget([[0, 0, 1, 1], [2, 2, 3, 3]], [1, 2]).subset([1]).labels.tolist()
        [2]
        """
        picked = [self.detections[row] for row in rows]
        target = DetectionTarget([d.box for d in picked], [d.label for d in picked], iou_threshold=self.iou_threshold)
        target.detections = tuple(picked)
        return target

    @property
    def image_ids(self) -> Tensor:
        """(R,) the image of the batch that each row explains: ``images[target.image_ids]``
        is the batch with one row per box."""
        return torch.tensor([d.image for d in self.detections], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.detections)

    def __repr__(self) -> str:
        return f"DetectionTarget({len(self)} boxes, iou_threshold={self.iou_threshold})"

    def __call__(self, output) -> Tensor:
        """(B,) scores of the reference boxes in a detector's output on B images, row r
        against box r (or against the single box)."""
        predictions = detections_of(output)
        if len(self) not in (1, len(predictions)):
            raise ValueError(
                f"this target holds {len(self)} boxes, one per row, but the detector's output has "
                f"{len(predictions)} images; repeat the images, one per box: images[target.image_ids] "
                "(explain_detections does)"
            )
        return self.score_rows(output, torch.arange(len(predictions)))

    def score_rows(self, output, rows: Tensor) -> Tensor:
        """(B,) scores of a detector's output on images derived from rows ``rows`` of the
        explained batch: output image i against reference box ``rows[i]``."""
        predictions = detections_of(output)
        if len(rows) != len(predictions):
            raise ValueError(f"got {len(rows)} rows for a detector output of {len(predictions)} images")
        if len(self) == 0:
            raise ValueError("this target holds no box: nothing was selected to explain")
        picks = rows.tolist() if len(self) > 1 else [0] * len(rows)
        return torch.stack(
            [self._score(p, self.boxes[r], int(self.labels[r])) for p, r in zip(predictions, picks, strict=True)]
        )

    def _score(self, prediction: dict[str, Tensor], box: Tensor, label: int) -> Tensor:
        boxes, scores = prediction["boxes"], prediction["scores"]
        ious = box_iou(box[None].to(boxes.device, torch.float32), boxes.detach().float())[0]
        ious = torch.where(prediction["labels"] == label, ious, -1.0)
        if len(ious) == 0 or ious.max() < self.iou_threshold:
            return scores.float().sum() * 0.0  # no match: 0, still on the graph, so gradients are 0
        best = torch.where(ious == ious.max(), scores.detach().float(), -float("inf")).argmax()
        return scores[best].float()

    def describe(self, row: int, class_names: Sequence[str] | None = None) -> dict:
        """What row ``row`` explains, as a plain dict (see :meth:`Detection.describe`)."""
        return self.detections[row].describe(class_names)


def crop_padding(explanation: Explanation, model: nn.Module) -> Explanation:
    """The explanation with maps made from the part of each layer's grid that covers the image.

    torchvision's detectors resize each image and pad the batch to a multiple of 32 before
    the backbone, so a layer's grid also covers the padding, at the bottom and right; a map
    stretched whole over the image would be shifted. Here each raw map is upsampled to the
    padded size, cut to the resized image, and scaled to the input's size. ``raw_layers``
    keep the whole grid. Models without such a transform are returned as they are, and so
    are maps made at the input's own size (D-RISE, the attributions), which cover no padding.
    """
    transform = getattr(model, "transform", None)
    height, width = explanation.maps.shape[-2:]
    if (
        transform is None
        or not callable(getattr(transform, "batch_images", None))
        or all(tuple(raw.shape[-2:]) == (height, width) for raw in explanation.raw_layers.values())
    ):
        return explanation
    sample = torch.zeros(3, height, width, device=explanation.maps.device)
    with preserved_state(model), torch.no_grad():
        batch, _ = transform([sample])
    resized, padded = tuple(batch.image_sizes[0]), tuple(batch.tensors.shape[-2:])
    if resized == padded:
        return explanation
    maps = []
    for raw in explanation.raw_layers.values():
        flat = raw.reshape(-1, 1, *raw.shape[-2:]).float()
        cut = F.interpolate(flat, size=padded, mode="bilinear", align_corners=False)[..., : resized[0], : resized[1]]
        maps.append(scale_maps(cut.reshape(*raw.shape[:-2], *resized), (height, width)))
    combined = torch.stack(maps).mean(dim=0)
    if len(maps) > 1:
        combined = scale_maps(combined, (height, width))
    return replace(explanation, maps=combined)


def explain_detections(
    explainer: Explainer,
    images: Tensor,
    *,
    index: int | Sequence[int] | None = None,
    label: int | None = None,
    min_score: float | None = None,
    iou_threshold: float = 0.5,
) -> tuple[Explanation, DetectionTarget]:
    """Explain boxes that a detector finds in ``images``: one map per box.

    The detector runs once on the images; :meth:`~explain.tasks.DetectionTarget.select` picks the boxes
    (``index``, ``label``, ``min_score``; by default each image's best box); the images are
    repeated, one row per box, and explained with the target, so that row r of the
    explanation is box ``target.detections[r]`` of image ``target.image_ids[r]``. Maps are
    cut to the image (:func:`~explain.tasks.crop_padding`).

    >>> import torchvision
    >>> from explain import GradCAM
    >>> model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
    ...     weights=None, weights_backbone=None, num_classes=3).eval()
    >>> cam = GradCAM(model, "backbone.features.1")
    >>> result, target = explain_detections(cam, torch.rand(1, 3, 64, 64), index=[0, 1])
    >>> tuple(result.maps.shape), target.image_ids.tolist()
    ((2, 64, 64), [0, 0])
    """
    model = explainer.model
    images = check_images(images, model)
    with preserved_state(model), torch.no_grad():
        output = model(images)
    target = DetectionTarget.select(output, index=index, label=label, min_score=min_score, iou_threshold=iou_threshold)
    if len(target) == 0:
        raise ValueError(
            "no detected box matches the selection; select by index, lower min_score, or lower the detector's own "
            "score threshold (box_score_thresh for Faster R-CNN, score_thresh for RetinaNet, FCOS and SSD)"
        )
    result = explainer(images[target.image_ids.to(images.device)], target)
    return crop_padding(result, model), target
