"""The one result type every explainer returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import interpolation_mode
from .targets import CUSTOM_TARGET

__all__ = ["ConceptExplanation", "Explanation", "scale_maps"]


def scale_maps(raw: Tensor, size: tuple[int, ...]) -> Tensor:
    """Resize maps (..., h, w) to ``size`` (H, W) (bilinear) and min-max scale each one to
    [0, 1]; maps of volumes (..., d, h, w) to (D, H, W) by trilinear interpolation, of
    signals (..., l) to (L,) by linear interpolation.

    A constant map carries no information about where the evidence is and becomes all
    zeros (never NaN).

    >>> scale_maps(torch.tensor([[[0.0, 2.0]]]), (1, 2))
    tensor([[[0., 1.]]])
    >>> scale_maps(torch.full((1, 2, 2), 3.0), (2, 2)).sum().item()
    0.0
    """
    if not torch.isfinite(raw).all():
        raise ValueError(
            "the raw map holds NaN or infinite values: the model's activations or gradients "
            "overflowed (float16?); explain in float32"
        )
    spatial = len(size)
    lead = raw.shape[:-spatial]
    flat = raw.reshape(-1, 1, *raw.shape[-spatial:]).float()
    if tuple(flat.shape[2:]) != tuple(size):
        flat = F.interpolate(flat, size=size, mode=interpolation_mode(spatial), align_corners=False)
    flat = flat.flatten(1)
    low = flat.amin(dim=1, keepdim=True)
    high = flat.amax(dim=1, keepdim=True)
    span = high - low
    # Spans at float rounding level relative to the values are noise, not signal.
    informative = span > 1e-6 * torch.maximum(high.abs(), low.abs()).clamp_min(1e-30)
    scaled = torch.where(informative, (flat - low) / torch.where(informative, span, 1.0), 0.0)
    return scaled.reshape(*lead, *size)


@dataclass(frozen=True, repr=False)
class Explanation:
    """Maps that explain a batch of model decisions, with what they explain.

    Attributes
    ----------
    maps:
        float32 maps in [0, 1] (in [-1, 1] when ``signed``) at the input's resolution:
        (N, H, W), or (N, k, H, W) when ``topk=k`` was asked for; (N, D, H, W) for volumes
        and videos, (N, L) for signals. With several layers, the mean of the layers' scaled
        maps, scaled again.
    raw_layers:
        For each target layer, the unscaled maps at that layer's resolution. For attribution
        methods, ``{"input": attributions}``: signed, per channel, shaped as the input
        ((N, C, H, W), (N, C, D, H, W), (N, C, L)), with the targets' axis after N for ``topk``.
    logits:
        The model output, detached: a tensor, or the model's dict/tuple with a callable target.
    targets:
        Class ids explained, (N,) or (N, k); ``-1`` where a callable picked the score.
    method:
        The registered name of the method.
    class_names:
        Names of the model's classes, when known.
    signed:
        Whether ``maps`` carry a sign: then they lie in [-1, 1], positive where the evidence
        speaks for the target and negative where it speaks against it (attributions
        reduced with ``reduction="sum"``); shown with a diverging colormap.
    segment_scores:
        With ``segments=`` (the perturbation methods, see :mod:`explain.segments`): one score
        per segment of each image, a tensor (K_i,) per image, (k, K_i) with ``topk=k``, in
        the order of the image's masks (of a label image's values, ascending); ``maps`` and
        ``raw`` are then the pixel map the scores make (each pixel the sum of the scores of
        the segments that cover it). None otherwise.
    """

    maps: Tensor
    raw_layers: dict[str, Tensor]
    logits: Tensor | dict | tuple
    targets: Tensor
    method: str
    class_names: Sequence[str] | None = field(default=None, repr=False)
    signed: bool = False
    segment_scores: tuple[Tensor, ...] | None = field(default=None, repr=False)

    @property
    def layers(self) -> tuple[str, ...]:
        """The target layers' names."""
        return tuple(self.raw_layers)

    @property
    def raw(self) -> Tensor:
        """The unscaled maps at layer resolution, for a single target layer (for attribution
        methods, the signed attributions per input channel)."""
        if len(self.raw_layers) != 1:
            raise ValueError(f"this explanation has {len(self.raw_layers)} layers {self.layers}; use raw_layers[name]")
        return next(iter(self.raw_layers.values()))

    @property
    def probabilities(self) -> Tensor:
        """Softmax probability of each explained class (NaN for callable targets)."""
        if not isinstance(self.logits, Tensor) or self.logits.dim() != 2:
            return torch.full(self.targets.shape, float("nan"), device=self.targets.device)
        probs = self.logits.float().softmax(dim=1)
        ids = self.targets.clamp_min(0)
        rows = torch.arange(len(ids), device=ids.device)
        picked = probs[rows[:, None], ids] if ids.dim() == 2 else probs[rows, ids]
        return torch.where(self.targets == CUSTOM_TARGET, float("nan"), picked)

    @property
    def target_names(self) -> list:
        """Class names of ``targets`` (nested per image with ``topk``); ids as text when unnamed."""

        def name(i: int) -> str:
            if i == CUSTOM_TARGET:
                return "custom"
            return self.class_names[i] if self.class_names else str(i)

        ids = self.targets.tolist()
        return [[name(i) for i in row] if isinstance(row, list) else name(row) for row in ids]

    def __repr__(self) -> str:
        """One line: the method, the shapes of the tensors, the layers and the targets.

        >>> Explanation(torch.zeros(2, 4, 4), {"layer4": torch.zeros(2, 1, 2, 2)}, torch.zeros(2, 10),
        ...             torch.tensor([3, 5]), "gradcam", class_names=[f"class{i}" for i in range(10)])
        Explanation(method='gradcam', maps=(2, 4, 4), raw_layers={'layer4': (2, 1, 2, 2)}, targets=[3, 5] ['class3', 'class5'], logits=(2, 10))
        """  # noqa: E501 -- the doctest's expected output is one line

        def shape(value) -> str:
            return str(tuple(value.shape)) if isinstance(value, Tensor) else type(value).__name__

        targets = str(self.targets.tolist()) if self.targets.numel() <= 8 else f"shape {tuple(self.targets.shape)}"
        if self.class_names and self.targets.numel() <= 8:
            targets += f" {self.target_names}"
        layers = ", ".join(f"{name!r}: {shape(raw)}" for name, raw in self.raw_layers.items())
        extra = "".join(
            [
                ", signed=True" if self.signed else "",
                f", device='{self.maps.device}'" if self.maps.device.type != "cpu" else "",
                f", segments={[s.shape[-1] for s in self.segment_scores]}" if self.segment_scores is not None else "",
            ]
        )
        return (
            f"{type(self).__name__}(method={self.method!r}, maps={shape(self.maps)}, raw_layers={{{layers}}}, "
            f"targets={targets}, logits={shape(self.logits)}{extra})"
        )

    def __len__(self) -> int:
        return self.maps.shape[0]

    def to(self, device: torch.device | str) -> Explanation:
        """The same explanation with every tensor on ``device``."""
        return replace(
            self,
            maps=self.maps.to(device),
            raw_layers={k: v.to(device) for k, v in self.raw_layers.items()},
            logits=self.logits.to(device) if isinstance(self.logits, Tensor) else self.logits,
            targets=self.targets.to(device),
            segment_scores=None if self.segment_scores is None else tuple(s.to(device) for s in self.segment_scores),
        )

    def cpu(self) -> Explanation:
        return self.to("cpu")


@dataclass(frozen=True, repr=False)
class ConceptExplanation(Explanation):
    """An :class:`Explanation` whose maps are per concept, not per target: Deep Feature
    Factorization's (:class:`~explain.DeepFeatureFactorization`) and Concept Relevance
    Propagation's (:class:`~explain.concepts.CRP`).

    ``maps`` are (N, k, H, W), concept j's map of each image (as ``topk=k`` lays out
    targets): in [0, 1] for DFF; for CRP the conditional heatmaps, signed, in [-1, 1]
    (``signed``). ``raw_layers`` holds, under the concepts' layer (:attr:`layer`), the
    concepts' unscaled maps (N, k, ...): DFF's at the layer's resolution, CRP's the pixels'
    conditional relevance (summed over the input's channels) at the input's. ``targets``
    (N, k): the class each concept drives most (DFF, the same for every image; ``-1`` where
    the model has no classifier head for the concepts), or the class whose relevance each
    map explains (CRP, the same for every concept of an image).

    Attributes
    ----------
    concepts:
        DFF: (C, k) the concepts' embeddings, each concept's activation of the layer's C
        channels.
    concept_scores:
        DFF: (k, num_classes) the classifier head's scores of the concept embeddings
        (logits; ``softmax(dim=1)`` for probabilities), or None without a head.
    concept_ids:
        CRP: (N, k) the concepts' channel ids (-1 for a set of channels or a direction).
    concept_labels:
        CRP: N tuples of k names: the channel id, ids joined by ``+``, or ``direction``.
    relevances:
        CRP: (N, k) each concept's relevance for the target, R(theta | y): the layer's
        relevance under the concept's mask, summed (the sum of its conditional map, where
        the rules conserve).
    channel_relevances:
        CRP: (N, C) the relevance of every channel of the layer: the "glocal" ranking.
    """

    concepts: Tensor | None = field(default=None, repr=False)
    concept_scores: Tensor | None = field(default=None, repr=False)
    concept_ids: Tensor | None = field(default=None, repr=False)
    concept_labels: tuple[tuple[str, ...], ...] | None = field(default=None, repr=False)
    relevances: Tensor | None = field(default=None, repr=False)
    channel_relevances: Tensor | None = field(default=None, repr=False)

    @property
    def layer(self) -> str:
        """The name of the layer whose concepts these are."""
        return self.layers[0]

    @property
    def labels(self) -> tuple[tuple[str, ...], ...]:
        """Each image's concepts' names: ``concept_labels``, else the concepts' indices."""
        if self.concept_labels is not None:
            return self.concept_labels
        return tuple(tuple(str(j) for j in range(self.maps.shape[1])) for _ in range(len(self)))

    @property
    def shares(self) -> Tensor:
        """(N, k) each concept's relevance over the sum of the channels' absolute relevances
        (zennit-crp's ``abs_norm``): comparable across images (CRP's results only)."""
        if self.relevances is None or self.channel_relevances is None:
            raise ValueError(f"{self.method}'s concepts carry no relevances; shares are CRP's (explain.concepts.CRP)")
        total = self.channel_relevances.abs().sum(dim=1, keepdim=True)
        return self.relevances / (total + 1e-10)

    def to(self, device: torch.device | str) -> ConceptExplanation:
        moved = cast(ConceptExplanation, super().to(device))

        def moved_to(value: Tensor | None) -> Tensor | None:
            return None if value is None else value.to(device)

        return replace(
            moved,
            concepts=moved_to(self.concepts),
            concept_scores=moved_to(self.concept_scores),
            concept_ids=moved_to(self.concept_ids),
            relevances=moved_to(self.relevances),
            channel_relevances=moved_to(self.channel_relevances),
        )
