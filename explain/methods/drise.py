"""D-RISE: a detector-agnostic saliency map of one box, from the detector's answers to
randomly masked copies of the image (Petsiuk et al., "Black-box Explanation of Object
Detectors via Saliency Maps", CVPR 2021).

The masks are RISE's (Petsiuk et al., "RISE: Randomized Input Sampling for Explanation of
Black-box Models", BMVC 2018, sec. 3.2): a binary grid of cells, each kept with probability
``p``, upsampled bilinearly to cells of ``cell_size`` pixels and cut at a random shift of up
to one cell, so that its edges are soft and fall anywhere. Every masked copy runs through
the detector, batched through :mod:`explain.passes` (the memory budget, the fastest batch,
progress, Ctrl-C between batches), under ``torch.inference_mode()``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_iou

from ..base import Explainer, NotApplicable, register
from ..checks import check_images, positive_int
from ..detectors import detection_dicts, proposals_of
from ..explanation import Explanation, scale_maps
from ..hooks import preserved_state
from ..passes import Passes, inner_rows

__all__ = ["DRISE", "box_similarity", "rise_masks"]

#: The paper's masks: 16 x 16 cells over the image (its longer side here), 5000 of them.
GRID_CELLS = 16


def mask_grids(count: int, size: tuple[int, int], *, cell_size: int, p: float, seed: int) -> tuple[Tensor, Tensor]:
    """The binary grids (count, h, w) and shifts (count, 2) of ``count`` RISE masks for
    images of ``size``, drawn on the CPU from a generator seeded with ``seed``: the same
    masks for every image, whatever the batch; the first k of more masks are those of k."""
    height, width = size
    cells = (math.ceil(height / cell_size) + 1, math.ceil(width / cell_size) + 1)
    # Two streams, so that more masks extend the same sequence rather than draw another.
    grids = (torch.rand(count, *cells, generator=torch.Generator().manual_seed(seed)) < p).float()
    shifts = torch.randint(0, cell_size, (count, 2), generator=torch.Generator().manual_seed(seed + 1))
    return grids, shifts


def upsampled_masks(grids: Tensor, shifts: Tensor, size: tuple[int, int], cell_size: int) -> Tensor:
    """RISE's masks (k, H, W) from grids (k, h, w): each upsampled bilinearly to cells of
    ``cell_size`` pixels, then cut to ``size`` at its (dy, dx) shift."""
    height, width = size
    cells = grids.shape[-2:]
    up = F.interpolate(
        grids[:, None], size=(cells[0] * cell_size, cells[1] * cell_size), mode="bilinear", align_corners=False
    )[:, 0]
    return torch.stack(
        [mask[dy : dy + height, dx : dx + width] for mask, (dy, dx) in zip(up, shifts.tolist(), strict=True)]
    )


def rise_masks(
    count: int, size: tuple[int, int], *, cell_size: int, p: float = 0.5, seed: int = 0, device="cpu"
) -> Tensor:
    """``count`` RISE masks (count, H, W) in [0, 1] for images of ``size`` (see the module);
    those :class:`DRISE` uses with the same settings.

    >>> masks = rise_masks(200, (32, 48), cell_size=8, p=0.5)
    >>> tuple(masks.shape), 0.4 < float(masks.mean()) < 0.6
    ((200, 32, 48), True)
    """
    grids, shifts = mask_grids(count, size, cell_size=cell_size, p=p, seed=seed)
    return upsampled_masks(grids.to(device), shifts, size, cell_size)


def box_similarity(prediction: dict[str, Tensor], box: Tensor, label: int) -> Tensor:
    """D-RISE's similarity of a target detection with an image's detections (eq. 2-3): the
    largest, over the proposals, of IoU(boxes) x cosine(class vectors) x objectness.

    The target's vector is the box, objectness 1 and the one-hot vector of ``label``; a
    proposal's comes from :func:`~explain.detectors.proposals_of`: YOLO's and DETR's
    proposals before thresholds and suppression (YOLO: the sigmoid class scores, with the
    classic head's objectness, or the best class score where the anchor-free head folds
    objectness into them; DETR: the softmax over the classes and "no object", no objectness
    term), torchvision's kept boxes with one-hot labels and their score as objectness. As the
    cosine ignores a vector's length, the objectness term is what carries a proposal's
    confidence where the class vector is not a distribution. 0 where the image has no proposal.
    """
    proposals = proposals_of(prediction)
    if len(proposals.boxes) == 0:
        return box.new_zeros(())
    iou = box_iou(box[None].float(), proposals.boxes.float())[0]
    terms = iou * proposals.class_similarity(label)
    if proposals.objectness is not None:
        terms = terms * proposals.objectness.float()
    return terms.max()


@register
class DRISE(Explainer):
    """D-RISE: a box's saliency as the masks' average weighted by how well the detector still finds the box.

    For N random masks M_i (RISE's: binary grids kept with probability ``p``, upsampled
    bilinearly and shifted), the masked image I * M_i runs through the detector and
    w_i = max_j IoU(L_t, L_j) x cos(P_t, P_j) x O_j over its proposals j: box, class
    probability vector and objectness, against the target's box L_t and one-hot class P_t.
    The map is S = 1/N sum_i w_i M_i (eq. 1-3). Masked pixels are 0 in the model's input
    (black for detectors that take [0, 1] images, the mean colour for normalised ones).

    Works on torchvision's detectors and on YOLO and DETR wrapped by
    :func:`~explain.detectors.as_detector`; the proposals are read by
    :func:`~explain.detectors.proposals_of` (torchvision's detectors give only boxes after
    suppression, each with a label and a score: a one-hot class vector, the score as
    objectness). ``targets``: a :class:`~explain.tasks.DetectionTarget` (one box, or one
    per image), or None for each image's best box. ``n_masks`` = 5000, ``p`` = 0.5 and 16
    cells over the image's longer side (``cell_size=None``) are the paper's settings. The
    masks come from a generator seeded with ``seed``: every image gets the same masks, so
    its map does not depend on the batch or the batch size.

    Petsiuk et al., "Black-box Explanation of Object Detectors via Saliency Maps", CVPR
    2021, sec. 3; the masks of RISE, Petsiuk et al., BMVC 2018.
    """

    name = "drise"
    formula = (
        "a box's saliency: the masks averaged, each weighted by how well the detector still finds the box "
        "in the masked image ({n_masks:code}, {p:code})"
    )
    runs_on = "explain"
    family = "perturbation attribution"
    cost = "1 + {n_masks} forward"
    backward = False
    images_only = "it masks an image with a 2-D grid and explains a detector's boxes"
    #: The task whose outputs it explains: the command line runs it with --task detect.
    task = "detect"

    def __init__(
        self,
        model: nn.Module,
        *,
        n_masks: int = 5000,
        cell_size: int | None = None,
        p: float = 0.5,
        seed: int = 0,
        batch_size: int | None = None,
        class_names: Sequence[str] | None = None,
    ):
        super().__init__(model, class_names=class_names)
        self.n_masks = positive_int("n_masks", n_masks)
        self.cell_size = None if cell_size is None else positive_int("cell_size", cell_size)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"p, the share of cells a mask keeps, must lie in (0, 1]; got {p!r}")
        self.p, self.seed = float(p), int(seed)
        self.batch_size = None if batch_size is None else positive_int("batch_size", batch_size)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_masks)

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        """``("input",)``: the masks are the input's."""
        return ("input",)

    def check(self, images: Tensor, targets=None, *, topk: int | None = None) -> None:
        """The unmasked pass alone: it finds a model that is no detector, and the boxes."""
        images = check_images(images, self.model)
        self.check_applies(images)
        with preserved_state(self.model, freeze=False), torch.inference_mode():
            self._references(images, targets, topk)

    def _explain(self, images: Tensor, targets=None, *, topk: int | None = None) -> Explanation:
        images = check_images(images, self.model)
        self.check_applies(images)
        size = (images.shape[-2], images.shape[-1])
        with preserved_state(self.model, freeze=False), torch.inference_mode():
            output, boxes, labels = self._references(images, targets, topk)
            saliency = self._saliency(images, boxes, labels)
        maps = scale_maps(saliency, size)
        return Explanation(maps, {"input": saliency}, output, labels, self.name, self.class_names)

    def _references(self, images: Tensor, targets, topk: int | None) -> tuple[Any, Tensor, Tensor]:
        """The detector's output on ``images`` and the box and label each row explains."""
        if topk is not None:
            raise ValueError("topk applies to classifiers; D-RISE explains one box per image")
        output = self.model(images)
        predictions = detection_dicts(output)
        if predictions is None:
            raise NotApplicable(
                f"D-RISE explains a detector's boxes; {type(self.model).__name__} returns {type(output).__name__}, "
                "not detections (torchvision's detectors, or YOLO and DETR wrapped by explain.detectors.as_detector)"
            )
        if targets is None:
            return output, *self._best_boxes(predictions)
        if not hasattr(targets, "boxes") or not hasattr(targets, "labels"):
            raise ValueError(
                f"D-RISE explains boxes: targets is an explain.tasks.DetectionTarget or None (each image's "
                f"best box), not {type(targets).__name__}"
            )
        boxes, labels = targets.boxes.to(images.device).float(), targets.labels.to(images.device)
        if len(boxes) == 1:
            boxes, labels = boxes.expand(len(images), 4), labels.expand(len(images))
        if len(boxes) != len(images):
            raise ValueError(
                f"the target holds {len(boxes)} boxes for {len(images)} images; give one box, or one per image "
                "(images[target.image_ids], as explain_detections does)"
            )
        return output, boxes, labels

    def _best_boxes(self, predictions: list[dict[str, Tensor]]) -> tuple[Tensor, Tensor]:
        empty = [i for i, p in enumerate(predictions) if len(p["scores"]) == 0]
        if empty:
            raise ValueError(
                f"the detector finds no box in image {empty[0]} to explain; pass targets= (a DetectionTarget), "
                "or lower the detector's score threshold"
            )
        best = [p["scores"].float().argmax() for p in predictions]
        boxes = torch.stack([p["boxes"][i].float() for p, i in zip(predictions, best, strict=True)])
        labels = torch.stack([p["labels"][i] for p, i in zip(predictions, best, strict=True)])
        return boxes, labels

    def _saliency(self, images: Tensor, boxes: Tensor, labels: Tensor) -> Tensor:
        """(N, H, W): 1/N sum_i w_i M_i per row, the masked copies a batch at a time."""
        size = (images.shape[-2], images.shape[-1])
        cell = self.cell_size or math.ceil(max(size) / GRID_CELLS)
        grids, shifts = mask_grids(self.n_masks, size, cell_size=cell, p=self.p, seed=self.seed)
        grids = grids.to(images.device)
        total = len(images) * self.n_masks
        step = inner_rows(self.model, images, backward=False, total=total, given=self.batch_size)
        saliency = images.new_zeros((len(images), *size), dtype=torch.float32)
        with Passes(self.name, total) as passes:
            for start in range(0, total, step):
                pairs = torch.arange(start, min(start + step, total))
                rows, which = pairs // self.n_masks, pairs % self.n_masks
                masks = upsampled_masks(grids[which.to(grids.device)], shifts[which], size, cell)
                rows = rows.to(images.device)
                masked = images[rows] * masks[:, None].to(images.dtype)
                predictions = detection_dicts(self.model(masked))
                assert predictions is not None
                weights = torch.stack(
                    [
                        box_similarity(prediction, boxes[row], int(labels[row]))
                        for prediction, row in zip(predictions, rows.tolist(), strict=True)
                    ]
                )
                saliency.index_add_(0, rows, weights.float()[:, None, None] * masks.float())
                passes.advance(len(pairs))
        return saliency / self.n_masks
