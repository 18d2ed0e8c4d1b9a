"""Concept Relevance Propagation as a method of the registry (``crp``), so that ``explain run
--method crp`` and :func:`~explain.explainer` make it as any method: each target's most
relevant channels of a layer, each with its conditional heatmap
(:class:`~explain.concepts.CRP` computes them), laid out as :class:`~explain.ConceptExplanation` s are."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..base import Explainer, register
from ..checks import positive_int
from ..explanation import ConceptExplanation
from ..layers import LayerSpec, find_target_layer
from ..methods import LRP_COMPOSITES
from ..targets import Targets, select_targets
from .crp import CRP

__all__ = ["ConceptRelevance"]


@register
class ConceptRelevance(Explainer):
    """Concept Relevance Propagation (CRP): each target's ``concepts`` most relevant channels
    of a layer, each with its conditional heatmap, where in the image that channel is
    relevant for the target.

    Achtibat et al., "From attribution maps to human-understandable explanations through
    Concept Relevance Propagation", Nature Machine Intelligence 5, 2023; see
    :class:`explain.concepts.CRP`, which this method runs. LRP hands the target's score back
    to ``layer``; the channels are ranked by their relevance R(c | y) (the layer's relevance
    summed over the channel), and for each of the top ``concepts`` the backward pass goes on
    with the relevance masked to that channel: R(x | c, y). The maps are (N, T * concepts,
    H, W) for T targets per image (``topk``), target t's concepts at ``t * concepts + j``,
    signed and scaled to [-1, 1]; the result (a :class:`~explain.ConceptExplanation`) holds
    the channels (``concept_ids``) and their relevances. ``explain run --method crp``
    writes one overlay per concept, its layer and channel (``concept``, ``layer:channel``)
    and relevance (``concept_relevance``) in the manifest.

    Models with attention layers (transformers) raise :class:`~explain.NotApplicable`: no
    LRP rule here conserves relevance through attention.

    ``layer`` (or ``target_layer``, as ``--layer`` gives it): the layer whose channels are
    the concepts; by default the layer Grad-CAM would take (the last spatial one).
    ``composite``, ``epsilon``, ``gamma``, ``first_rule`` and ``normalization``: LRP's
    rules (:class:`~explain.LRP`); ``batch_size``: CRP's rows per inner batch.

    >>> import torchvision
    >>> model = torchvision.models.resnet18(num_classes=5).eval()
    >>> result = ConceptRelevance(model, layer="layer3", concepts=3)(torch.randn(2, 3, 64, 64))
    >>> result.maps.shape, result.concept_ids.shape
    (torch.Size([2, 3, 64, 64]), torch.Size([2, 3]))
    """

    name = "crp"
    formula = (
        "R(x | c, y): the LRP relevance of the target y at the layer masked to channel c, passed "
        "back to the pixels; one map for each of the {concepts:code} channels c with the largest "
        "R(c | y) (on the command line `-M crp:concepts=8`, `-M crp:layer=layer3`)"
    )
    runs_on = "zennit, with canonizers"
    family = "relevance"
    needs_layer = True
    images_only = "its rules and canonizers are written for 2-D convolutions"
    cost = "3 forward + 1 backward to the layer, then {concepts} backward from it, per target"
    per_image_concepts = True

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        layer: LayerSpec = None,
        concepts: int = 4,
        composite: str = LRP_COMPOSITES[0],
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        first_rule: str | None = None,
        normalization=None,
        batch_size: int | None = None,
        class_names: Sequence[str] | None = None,
    ):
        super().__init__(model, class_names=class_names)
        if layer is not None and target_layer is not None and layer != target_layer:
            raise ValueError(f"give the layer once: layer={layer!r} or target_layer={target_layer!r}")
        self.layer = layer if layer is not None else target_layer
        if isinstance(self.layer, (list, tuple)):
            if len(self.layer) != 1:
                raise ValueError(f"crp explains the concepts of one layer, got {list(self.layer)}; name one")
            self.layer = self.layer[0]
        self.concepts = positive_int("concepts", concepts)
        self.rules = {
            "composite": composite,
            "epsilon": epsilon,
            "gamma": gamma,
            "first_rule": first_rule,
            "normalization": normalization,
            "batch_size": batch_size,
        }
        self.crp: CRP | None = None
        if self.layer is not None:
            self.crp = self._make(self.layer)

    def _make(self, layer) -> CRP:
        return CRP(self.model, layer, class_names=self.class_names, **self.rules)

    def concept_method(self, images: Tensor) -> CRP:
        """The :class:`.CRP` at the method's layer (by default found on ``images``)."""
        if self.crp is None:
            self.crp = self._make(find_target_layer(self.model, images[:1]))
        return self.crp

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> ConceptExplanation:
        self.check_applies(images)
        crp = self.concept_method(images)
        if topk is None:
            return self._checked(crp(images, targets, k=self.concepts))
        with torch.no_grad():
            logits = self.model(images)
        _, ids = select_targets(logits, targets, topk=topk, class_names=self.class_names)
        parts = [self._checked(crp(images, ids[:, rank], k=self.concepts)) for rank in range(ids.shape[1])]
        return _joined(parts)

    def _checked(self, result: ConceptExplanation) -> ConceptExplanation:
        """``result``, where it has a map per concept asked for (a layer of fewer channels
        than ``concepts`` gives fewer: a mistake in the options)."""
        found = result.maps.shape[1]
        if found < self.concepts:
            raise ValueError(
                f"crp: layer {result.layer} has {found} channels, fewer than concepts={self.concepts}; "
                f"give concepts={found} or less"
            )
        return result

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return (self.concept_method(images).layer,)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.concepts)


def _joined(parts: list[ConceptExplanation]) -> ConceptExplanation:
    """One explanation of several targets' concepts, target by target along the concept axis
    (their maps and relevances); without the layer's channel relevances, which are per target."""
    first = parts[0]
    cat = lambda name: torch.cat([getattr(part, name) for part in parts], dim=1)  # noqa: E731
    return ConceptExplanation(
        cat("maps"),
        {first.layer: torch.cat([part.raw_layers[part.layer] for part in parts], dim=1)},
        first.logits,
        cat("targets"),
        first.method,
        first.class_names,
        signed=True,
        concept_ids=cat("concept_ids"),
        concept_labels=tuple(sum((part.labels[i] for part in parts), ()) for i in range(len(first))),
        relevances=cat("relevances"),
    )
