"""Perturbation attributions over segments the caller gives (``segments=``): masks of a
segmentation model, SAM's (overlapping) masks, a label image, instead of a sliding window or
SLIC superpixels; as captum 0.9's ``ImageMaskInput`` does for its perturbation methods.

Each segment is one player of a cooperative game (Shapley 1953): a coalition of present
segments is the image with every pixel of an absent segment replaced by the baseline (a pixel
that several segments cover is replaced where any of them is absent; one that no segment
covers is never replaced), and its value the explained score. captum's perturbation methods
run on the coalitions, one image at a time: a (1, K) vector of ones, the segments all present,
with a baseline of zeros, all absent. Each segment gets one score, and each pixel the sum of
the scores of the segments that cover it: its segment's score where segments do not overlap;
``ImageMaskInput.format_pixel_attr``'s pixel map.

The coalitions run through the model in inner batches from the memory budget (captum's
``ImageMaskInput`` runs one per pass), forward only, each a pass the progress counts and
Ctrl-C stops after; the coalition of all the segments is the image, whose score the call
found with its targets, so it is not run again (captum's methods ask for it once per image,
Shapley value sampling once per permutation).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from ..base import NotApplicable
from ..baselines import seeded
from ..checks import check_images, spatial_dims
from ..explanation import Explanation
from ..passes import advance
from ..segments import segment_masks
from ..targets import Targets
from .attribution_base import Attribution, ScoredModel, WithBaseline

__all__ = ["Coalitions", "SegmentAttribution", "TakesSegments", "seeded_scores"]


class Coalitions:
    """The explained score of target ``k`` on image ``i`` with only a coalition's segments
    present: called with coalitions (B, K) of 0 and 1, it returns the B scores.

    ``image`` (1, C, H, W) and ``baseline`` (1, C, H, W); ``masks`` (K, H, W) bool."""

    def __init__(self, scored: ScoredModel, image: Tensor, baseline: Tensor, masks: Tensor, k: int, i: int):
        self.scored, self.image, self.baseline, self.k, self.i = scored, image, baseline, k, i
        #: (K, H x W): a coalition's absent segments over each pixel are one product with it
        self.flat = masks.flatten(1).float()
        #: The scores' dtype (float64 for float64 images, else float32), captum's coalitions' too.
        self.dtype = torch.float64 if image.dtype == torch.float64 else torch.float32

    def __call__(self, present: Tensor) -> Tensor:
        present = present.to(self.flat.device) != 0
        scores = torch.empty(len(present), dtype=self.dtype, device=self.flat.device)
        advance(len(present))
        whole = present.all(dim=1)  # every segment present: the image, whose score the call has
        if bool(whole.any()):
            assert self.scored.output is not None  # recorded with the targets
            scores[whole] = self.scored.explained_scores(self.scored.output, self.k)[self.i].to(self.dtype)
            present = present[~whole]
        if len(present):
            absent = (~present).float() @ self.flat  # the absent segments over each pixel
            kept = (absent == 0).view(len(present), 1, *self.image.shape[2:])
            batch = torch.where(kept, self.image, self.baseline).to(self.image.dtype)
            with torch.no_grad():
                output = self.scored.model(batch)
            rows = torch.full((len(batch),), self.i, device=batch.device)
            scores[~whole] = self.scored.explained_scores(output, self.k, rows).to(self.dtype)
        return scores


class TakesSegments(Attribution):
    """An attribution method whose calls also take ``segments=``: the caller's segments of
    each image, which the method scores instead of its own features; one score per segment
    (``Explanation.segment_scores``) and the pixel map the method makes of them. Subclasses
    leave the segments' scores in the call's memo (``"segment_scores"``: per target, a list
    of per-image tensors (K_i,)) and read the segments there (``"segments"``: per image,
    (K_i, H, W) bool)."""

    takes_segments = True

    def _explain_segments(self, images: Tensor, targets: Targets, topk: int | None, segments: object) -> Explanation:
        """A call with ``segments=`` (see :meth:`Explainer.__call__ <explain.Explainer.__call__>`):
        the segments checked against the images, for the call's memo."""
        images = check_images(images, self.model)
        if spatial_dims(images) != 2:
            raise NotApplicable(
                f"segments= are masks of images (N, C, H, W), not of inputs of shape {tuple(images.shape)}; "
                "leave segments out"
            )
        size = (int(images.shape[2]), int(images.shape[3]))
        return self.explained(
            images, targets, topk, {"segments": segment_masks(segments, len(images), size, images.device)}
        )

    def explanation(self, raw: Tensor, scored: ScoredModel) -> Explanation:
        result = super().explanation(raw, scored)
        scores = scored.memo.get("segment_scores")
        if scores is None:
            return result
        per_image = [torch.stack(image) for image in zip(*scores, strict=True)]  # (targets, K_i)
        if scored.resolved_ids.dim() == 1:
            per_image = [image[0] for image in per_image]
        return replace(result, segment_scores=tuple(s.detach() for s in per_image))


class SegmentAttribution(TakesSegments, WithBaseline):
    """A perturbation method that takes ``segments=`` (see :class:`TakesSegments`): captum's
    method on the segments (see the module), each pixel the sum of the scores of the
    segments that cover it (``maps``; ``raw``: that map in every channel). Without
    segments, the method's own features (a window, superpixels).

    Subclasses give :meth:`segment_passes` and :meth:`score_segments`."""

    def call_passes(self, images: Tensor, memo: dict) -> int:
        if "segments" not in memo:
            return self.planned_passes(images)
        return sum(self.segment_passes(len(masks)) for masks in memo["segments"])

    def segment_passes(self, segments: int) -> int:
        """The passes of one image with ``segments`` segments, one target."""
        raise NotImplementedError

    def score_segments(self, coalitions: Coalitions, segments: int, rows: int) -> Tensor:
        """(K,) scores of the ``segments`` segments of one image, from its ``coalitions``, in
        passes of at most ``rows`` rows."""
        raise NotImplementedError

    def attribute_targets(self, scored: ScoredModel, images: Tensor) -> list[Tensor]:
        if "segments" not in scored.memo:
            return super().attribute_targets(scored, images)
        masks = scored.memo["segments"]
        baselines = self.baselines(scored, images)
        longest = max(self.segment_passes(len(m)) for m in masks)
        rows = self.rows(images, longest, self.call_passes(images, scored.memo) * scored.num_targets)
        dtype = torch.float64 if images.dtype == torch.float64 else torch.float32
        columns, scores = [], []
        for k in range(scored.num_targets):
            per_image = []
            for i, mine in enumerate(masks):
                coalitions = Coalitions(scored, images[i : i + 1], baselines[i : i + 1], mine, k, i)
                per_image.append(self.score_segments(coalitions, len(mine), rows).to(dtype).flatten())
            scores.append(per_image)
            maps = [(s @ m.flatten(1).to(dtype)).view(images.shape[2:]) for s, m in zip(per_image, masks, strict=True)]
            columns.append(torch.stack(maps)[:, None].expand_as(images).to(images.dtype).contiguous())
        scored.memo["segment_scores"] = scores
        return columns


def seeded_scores(method, coalitions: Coalitions, segments: int, rows: int, seed: int | None, **options) -> Tensor:
    """captum's ``method`` (a class taking the forward function) on one image's segments, all
    present against all absent, its draws on a stream seeded with ``seed``."""
    device = coalitions.image.device
    with seeded(seed, device):
        return method(coalitions).attribute(
            torch.ones(1, segments, dtype=coalitions.dtype, device=device), perturbations_per_eval=rows, **options
        )
