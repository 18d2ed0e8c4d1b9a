"""A detector's output read one way for every family: the boxes it keeps, as torchvision's
detectors return them, and the proposals it scored, which D-RISE compares with a box.

Every detector of the library returns, in eval mode, one dict per image with ``boxes``
(K, 4) as ``(x0, y0, x1, y1)`` in input pixels, ``labels`` (K,) and ``scores`` (K,), best
first. The adapters of YOLO and DETR (:mod:`explain.detectors.yolo`,
:mod:`explain.detectors.detr`) add every proposal the head scored, before the score
threshold and non-maximum suppression: ``proposal_boxes`` (A, 4), ``proposal_classes`` (A, C),
the class probability vector of each, and, where the head has one, ``proposal_objectness`` (A,).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch  # noqa: F401 -- the doctests below use it
from torch import Tensor
from torchvision.ops import batched_nms

__all__ = ["Proposals", "keep_boxes", "proposals_of"]


@dataclass(frozen=True)
class Proposals:
    """One image's proposals, as D-RISE reads them (Petsiuk et al., CVPR 2021, sec. 3.1): a
    detection vector per proposal, its box, its class probabilities and its objectness.

    ``classes`` (K, C) holds the class probability vectors; where the detector gives only a
    label per box (torchvision's detectors, after their non-maximum suppression), ``classes``
    is None and ``labels`` (K,) stands for one-hot vectors. ``objectness`` (K,) is None where
    the detector has none.
    """

    boxes: Tensor
    classes: Tensor | None = None
    labels: Tensor | None = None
    objectness: Tensor | None = None

    def class_similarity(self, label: int) -> Tensor:
        """(K,) cosine similarity of each proposal's class vector with the one-hot vector of
        ``label``: ``P[label] / |P|``, or 1 where a one-hot proposal has that label, else 0.

        >>> Proposals(torch.zeros(2, 4), torch.tensor([[3.0, 4.0], [0.0, 1.0]])).class_similarity(0)
        tensor([0.6000, 0.0000])
        """
        if self.classes is None:
            assert self.labels is not None
            return (self.labels == label).float()
        if not 0 <= label < self.classes.shape[1]:
            return self.classes.new_zeros(len(self.classes))
        norms = self.classes.float().norm(dim=1).clamp_min(1e-12)
        return self.classes[:, label].float() / norms


def proposals_of(prediction: dict[str, Tensor]) -> Proposals:
    """The proposals of one image's detections: those the adapters keep under ``proposal_*``,
    or else the boxes themselves with one-hot class vectors (their labels) and their scores
    as objectness, which is what a torchvision detector gives after its suppression (the
    D-RISE paper forms such vectors for detectors without class probability vectors; as the
    cosine ignores a vector's length, the score weighs a box through the objectness term)."""
    if "proposal_boxes" in prediction:
        return Proposals(
            prediction["proposal_boxes"],
            prediction["proposal_classes"],
            objectness=prediction.get("proposal_objectness"),
        )
    return Proposals(prediction["boxes"], labels=prediction["labels"], objectness=prediction["scores"])


def keep_boxes(
    boxes: Tensor,
    confidence: Tensor,
    *,
    score_threshold: float,
    iou_threshold: float | None,
    max_detections: int,
) -> dict[str, Tensor]:
    """One image's detections from its proposals: each proposal's best class and its
    confidence, those above ``score_threshold``, then class-wise non-maximum suppression at
    ``iou_threshold`` (None: none, as for DETR's set prediction), best first, at most
    ``max_detections``.

    ``boxes`` (A, 4) are ``(x0, y0, x1, y1)``, ``confidence`` (A, C) the score of each class.
    The choice is made on detached values; the kept ``scores`` and ``boxes`` are the
    proposals' own, still on the autograd graph, so that a gradient CAM explains them.

    >>> found = keep_boxes(torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 9], [20, 20, 30, 30]]),
    ...                    torch.tensor([[0.9, 0.0], [0.8, 0.1], [0.1, 0.6]]),
    ...                    score_threshold=0.25, iou_threshold=0.7, max_detections=10)
    >>> found["labels"].tolist(), [round(score, 2) for score in found["scores"].tolist()]
    ([0, 1], [0.9, 0.6])
    """
    scores, labels = confidence.max(dim=1)
    plain = scores.detach().float()
    keep = (plain > score_threshold).nonzero()[:, 0]
    if iou_threshold is not None:
        keep = keep[batched_nms(boxes.detach()[keep].float(), plain[keep], labels[keep], iou_threshold)]
    else:
        keep = keep[plain[keep].argsort(descending=True, stable=True)]
    keep = keep[:max_detections]
    return {"boxes": boxes[keep], "labels": labels[keep], "scores": scores[keep]}
