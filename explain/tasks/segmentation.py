"""Segmentation targets: explain why the pixels of a region got a class.

A semantic segmentation model gives every pixel a score per class: (N, C, H, W) logits, or
torchvision's dict whose ``"out"`` holds them. :class:`SegmentationTarget` turns them into
one score per image, the class's logits summed over a region, so that any explainer of the
library explains that sum (``targets=SegmentationTarget(...)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..model_tasks import segmentation_logits

__all__ = ["SegmentationTarget"]

REGION_KINDS = ("predicted", "mask", "box")


class SegmentationTarget:
    """The score of a class over a region of each image, for semantic segmentation models.

    The score of image n is the sum of the class's logits over the region's pixels,
    y_n = sum_{p in R_n} z_{c_n}(p), as in Seg-Grad-CAM (Vinogradova, Dibrov & Myers,
    "Towards Interpretable Semantic Segmentation via Gradient-weighted Class Activation
    Mapping", AAAI 2020) and pytorch-grad-cam's ``SemanticSegmentationTarget``. A map of it
    shows what made the model give those pixels that class.

    Parameters
    ----------
    category:
        The class: one id for every image, one id per image, or ``None`` (default) for the
        predicted class that covers the most pixels of the region (of the whole image when
        no region is given), ``background`` left out where another class is predicted.
    mask:
        The region as a boolean mask (H, W) for every image, or (N, H, W), on the grid of
        the model's output (torchvision's models output at the input's size).
    box:
        The region as a box ``(x0, y0, x1, y1)`` in output pixels, or one box per image
        (N, 4); a pixel is inside when its centre is.
    background:
        The class id that the default class avoids; ``None`` to let it be chosen too.

    Notes
    -----
    With neither ``mask`` nor ``box``, the region is the predicted mask of the class: the
    pixels whose top class it is. An empty region scores 0, and its map is blank.

    Called on the model's output for a batch (explainers do this), the target reads what was
    not given from that output and records it: ``explained`` is then a target holding the
    class (N,) and the region (N, H, W) of each image, and :meth:`describe` says what was
    explained. Explainers that score images derived from the batch (Score-CAM, Ablation-CAM)
    call :meth:`score_rows`, which keeps each image's class and region. Other explainers that
    run the model on many derived images (integrated gradients, occlusion) should be given a
    fixed target, ``SegmentationTarget(...).resolve(model(images))``, for one image at a time.

    Examples
    --------
    >>> logits = torch.zeros(1, 3, 2, 2)
    >>> logits[0, 2, 0] = 5.0                    # class 2 wins the top row
    >>> target = SegmentationTarget()
    >>> target(logits).tolist()                 # the logits of class 2 summed over its 2 pixels
    [10.0]
    >>> target.describe(0)["class_id"], target.describe(0)["pixels"]
    (2, 2)
    >>> SegmentationTarget(1, box=(0, 0, 2, 1))(logits).tolist()   # class 1 over the top row
    [0.0]
    """

    def __init__(
        self,
        category: int | Sequence[int] | Tensor | np.ndarray | None = None,
        *,
        mask: Tensor | np.ndarray | None = None,
        box: Sequence[float] | Tensor | np.ndarray | None = None,
        background: int | None = 0,
    ):
        if mask is not None and box is not None:
            raise ValueError("give the region as a mask or as a box, not both")
        self.category = None if category is None else _class_ids(category)
        self.mask = None if mask is None else _masks(mask)
        self.box = None if box is None else _boxes(box)
        if background is not None and (isinstance(background, bool) or not isinstance(background, (int, np.integer))):
            raise TypeError(f"background must be a class id or None, got {background!r}")
        self.background = None if background is None else int(background)
        self.kind = "mask" if mask is not None else "box" if box is not None else "predicted"
        #: What the last call explained: a target with the class (N,) and region (N, H, W) of each image.
        self.explained: SegmentationTarget | None = self if self.fixed else None

    @property
    def fixed(self) -> bool:
        """Whether the class and the region are given, so that no model output changes them."""
        return self.category is not None and self.mask is not None

    def __repr__(self) -> str:
        category = None if self.category is None else self.category.tolist()
        return f"SegmentationTarget(category={category}, region={self.kind!r})"

    def resolve(self, output) -> SegmentationTarget:
        """A fixed target: the class and region of each image of the batch that ``output``
        (the model's output for it) comes from, as this target defines them."""
        logits = segmentation_logits(output)
        n, classes, height, width = logits.shape
        if self.fixed:
            self._check_rows(n)
            _check_class_ids(self._given()[0], classes)
            return self
        region = _given_region(self.mask, self.box, n, height, width, logits.device)
        predicted = logits.detach().argmax(dim=1)
        if self.category is None:
            category = _dominant_classes(predicted, region, classes, self.background)
        else:
            category = _given_classes(self.category, n, classes, logits.device)
        if region is None:
            region = predicted == category[:, None, None]
        fixed = SegmentationTarget(category, mask=region, background=self.background)
        fixed.kind = self.kind
        return fixed

    def __call__(self, output) -> Tensor:
        """(N,) scores: each image's class logits summed over its region; records ``explained``."""
        logits = segmentation_logits(output)
        self.explained = self.resolve(logits)
        return self.explained._scores(logits, torch.arange(logits.shape[0], device=logits.device))

    def score_rows(self, output, rows: Tensor) -> Tensor:
        """(B,) scores of a model output on images derived from ``images[rows]``, one output row
        per entry of ``rows``, each with the class and region explained for its image."""
        if self.explained is None:
            raise ValueError(
                "this target has explained no batch yet; call it on the model's output for the images first"
            )
        logits = segmentation_logits(output)
        if len(rows) != logits.shape[0]:
            raise ValueError(f"got {len(rows)} rows for a model output of {logits.shape[0]} images")
        return self.explained._scores(logits, rows.to(logits.device))

    def describe(self, index: int, class_names: Sequence[str] | None = None) -> dict:
        """What was explained for image ``index``: the class, how the region was given
        (``kind``: predicted, mask or box), its size in pixels and its bounding box
        ``[x0, y0, x1, y1]`` (pixel edges; ``None`` when the region is empty)."""
        explained = self._explained()
        category, masks = explained._given()
        class_id = int(category[index if len(category) > 1 else 0])
        mask = masks[index if len(masks) > 1 else 0]
        ys, xs = mask.nonzero(as_tuple=True)
        box = None if len(ys) == 0 else [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]
        name = class_names[class_id] if class_names is not None and class_id < len(class_names) else str(class_id)
        return {
            "task": "segment",
            "class_id": class_id,
            "class_name": name,
            "kind": explained.kind,
            "pixels": len(ys),
            "box": box,
        }

    def probabilities(self, output) -> Tensor:
        """(N,) mean softmax probability of each image's explained class over its region (NaN
        where the region is empty)."""
        explained = self._explained()
        logits = segmentation_logits(output).detach().float()
        n = logits.shape[0]
        rows = torch.arange(n, device=logits.device)
        category, mask = explained._rows(rows, logits.device)
        picked = logits.softmax(dim=1).gather(1, category[:, None, None, None].expand(n, 1, *logits.shape[-2:]))[:, 0]
        pixels = mask.flatten(1).sum(1)
        total = (picked * mask).flatten(1).sum(1)
        return torch.where(pixels > 0, total / pixels.clamp_min(1), float("nan"))

    # -- helpers

    def _explained(self) -> SegmentationTarget:
        if self.explained is None:
            raise ValueError("this target has explained no batch yet; call it on the model's output, or resolve() it")
        return self.explained

    def _given(self) -> tuple[Tensor, Tensor]:
        """The class and region of a fixed target (what :meth:`resolve` returns)."""
        if self.category is None or self.mask is None:
            raise ValueError("this target is not fixed yet; resolve() it on the model's output first")
        return self.category, self.mask

    def _rows(self, rows: Tensor, device) -> tuple[Tensor, Tensor]:
        """The class (B,) and region (B, H, W) of each row."""

        def pick(values: Tensor) -> Tensor:
            values = values.to(device)
            return values[rows if len(values) > 1 else torch.zeros_like(rows)]

        category, mask = self._given()
        return pick(category), pick(mask)

    def _scores(self, logits: Tensor, rows: Tensor) -> Tensor:
        category, mask = self._rows(rows, logits.device)
        n, _, height, width = logits.shape
        if tuple(mask.shape[-2:]) != (height, width):
            raise ValueError(f"the region is {tuple(mask.shape[-2:])} but the model's output is {height} x {width}")
        picked = logits.gather(1, category[:, None, None, None].expand(n, 1, height, width))[:, 0]
        return (picked * mask.to(picked.dtype)).flatten(1).sum(dim=1).float()

    def _check_rows(self, n: int) -> None:
        held = max(len(part) for part in self._given())
        if held not in (1, n):
            raise ValueError(
                f"this target holds the classes and regions of {held} images, but the model's output has {n} rows; "
                "explainers that score images derived from the batch must pass their rows (score_rows), else "
                "explain one image at a time"
            )


def _check_class_ids(category: Tensor, classes: int) -> None:
    """ValueError unless every id in ``category`` is a class of a model with ``classes``."""
    bad = [int(c) for c in category if not 0 <= c < classes]
    if bad:
        raise ValueError(f"class id {bad[0]} is out of range: the model has {classes} classes (0..{classes - 1})")


def _given_classes(category: Tensor, n: int, classes: int, device) -> Tensor:
    """The given class ids (one, or one per image) checked and as (n,) on ``device``."""
    _check_class_ids(category, classes)
    if len(category) not in (1, n):
        raise ValueError(f"got {len(category)} classes for {n} images; give one for every image or one per image")
    return category.to(device).expand(n)


def _given_region(mask: Tensor | None, box: Tensor | None, n: int, height: int, width: int, device) -> Tensor | None:
    """The given region (from ``mask`` or ``box``) as (n, height, width) on ``device``; None
    where neither is given."""
    region = mask
    if box is not None:
        from ..regions import region_masks

        region = region_masks(box, (height, width))
    if region is None:
        return None
    if tuple(region.shape[-2:]) != (height, width):
        raise ValueError(
            f"the mask is {tuple(region.shape[-2:])} but the model's output is {height} x {width}; give "
            "the mask on the output's grid (torchvision's segmentation models output at the input's size)"
        )
    region = region.to(device)
    if len(region) not in (1, n):
        raise ValueError(f"got {len(region)} regions for {n} images; give one for every image or one per image")
    return region.expand(n, height, width)


def _dominant_classes(predicted: Tensor, region: Tensor | None, classes: int, background: int | None) -> Tensor:
    """Per image, the predicted class with the most pixels in the region, ``background``
    only where no other class is predicted there."""
    ids = []
    for i in range(len(predicted)):
        pixels = predicted[i] if region is None else predicted[i][region[i]]
        counts = torch.bincount(pixels.flatten(), minlength=classes)
        if background is not None and 0 <= background < classes:
            others = counts.clone()
            others[background] = 0
            if others.any():
                counts = others
        ids.append(counts.argmax())
    return torch.stack(ids)


def _class_ids(category) -> Tensor:
    if isinstance(category, str) or (isinstance(category, Sequence) and any(isinstance(c, str) for c in category)):
        raise TypeError(
            "give the class as an id; explain.targets.class_index(name, class_names) finds the id of a name"
        )
    ids = torch.as_tensor(category).reshape(-1)
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.numel() == 0:
        raise TypeError(f"the class must be an int id or one int id per image, got {category!r}")
    return ids.long()


def _masks(mask) -> Tensor:
    mask = torch.as_tensor(mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"the mask must be boolean, got {mask.dtype}; e.g. pass labels == class_id")
    if mask.dim() == 2:
        mask = mask[None]
    if mask.dim() != 3:
        raise ValueError(f"the mask must be (H, W) or (N, H, W), got {tuple(mask.shape)}")
    return mask


def _boxes(box) -> Tensor:
    box = torch.as_tensor(box, dtype=torch.float32)
    if box.dim() == 1:
        box = box[None]
    if box.dim() != 2 or box.shape[1] != 4:
        raise ValueError(f"the box must be (x0, y0, x1, y1), or one per image (N, 4); got shape {tuple(box.shape)}")
    if not torch.isfinite(box).all() or (box[:, 2] < box[:, 0]).any() or (box[:, 3] < box[:, 1]).any():
        raise ValueError(f"a box is (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1; got {box.tolist()}")
    return box
