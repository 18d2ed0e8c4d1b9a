"""Concepts of a layer, and the masks that condition relevance on them.

A concept of a layer with C channels is a channel, a set of channels, or a direction
v in R^C of its activation space. Concept Relevance Propagation conditions the relevance
R(c, p) that LRP hands to the layer (channel c, position p) on a concept by a mask
M(c, p) before the backward pass goes on to the input (Achtibat et al., "From attribution
maps to human-understandable explanations through Concept Relevance Propagation", Nature
Machine Intelligence 5, 2023, eq. 5: R(x | theta) with theta the channels kept):

- a channel c: M = 1 on channel c, 0 elsewhere (zennit-crp's ``ChannelConcept.mask``);
- a set S of channels: M = 1 on the channels of S;
- a direction v: the activation a(p) split into its part along v, ``(v . a(p)) v / |v|^2``,
  and the rest; each unit keeps the share of its relevance that its part along v holds:
  ``M(c, p) = v_c (v . a(p)) / (|v|^2 a_c(p))``, and ``v_c^2 / |v|^2`` where a_c(p) = 0 (the
  proportional split of Vielhaben et al., "Multi-dimensional concept discovery (MCD): A
  unifying framework with completeness guarantees", TMLR 2023). For an orthonormal basis
  v_1..v_C the masks sum to one at every unit, so the directions' relevances sum to the
  layer's, as the channels' do; v = e_c is channel c.

>>> masks = concept_masks([Concept.parse(2), Concept.parse([0, 1])], torch.zeros(1, 3, 1, 1))
>>> masks[:, :, 0, 0]
tensor([[0., 0., 1.],
        [1., 1., 0.]])
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Concept", "ConceptSpec", "channel_relevance", "concept_masks", "concept_relevances", "parse_concepts"]


@dataclass(frozen=True, eq=False)
class Concept:
    """A channel, a set of channels (``channels``) or a direction (``direction``, one value
    per channel) of a layer."""

    channels: tuple[int, ...] = ()
    direction: Tensor | None = None

    @staticmethod
    def parse(spec) -> Concept:
        """A concept from a channel id, a sequence of channel ids, a direction or a Concept.

        >>> Concept.parse(3).label, Concept.parse([1, 4]).label, Concept.parse(torch.ones(2)).label
        ('3', '1+4', 'direction')
        """
        if isinstance(spec, Concept):
            return spec
        if isinstance(spec, Tensor) and spec.is_floating_point():
            if spec.dim() != 1 or not spec.numel() or not bool(torch.isfinite(spec).all()) or not spec.abs().sum() > 0:
                raise ValueError(
                    f"a direction is a non-zero 1-D float tensor with one value per channel, got shape "
                    f"{tuple(spec.shape)}"
                )
            return Concept(direction=spec.detach())
        if isinstance(spec, Tensor):
            spec = spec.tolist()
        if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
            return Concept(channels=(int(spec),))
        if (
            isinstance(spec, Sequence)
            and not isinstance(spec, str)
            and spec
            and all(isinstance(c, numbers.Integral) and not isinstance(c, bool) for c in spec)
        ):
            return Concept(channels=tuple(sorted({int(c) for c in spec})))
        raise ValueError(
            f"a concept is a channel id, a list of channel ids, a direction (a 1-D float tensor) or a Concept; "
            f"got {spec!r}"
        )

    @property
    def channel(self) -> int:
        """The channel id of a one-channel concept; -1 for a set or a direction."""
        return self.channels[0] if len(self.channels) == 1 and self.direction is None else -1

    @property
    def label(self) -> str:
        """A short name: the channel id, ids joined by ``+``, or ``direction``."""
        if self.direction is not None:
            return "direction"
        return "+".join(str(c) for c in self.channels)

    def check(self, channels: int) -> None:
        """ValueError unless the concept fits a layer of ``channels`` channels."""
        if self.direction is not None and self.direction.numel() != channels:
            raise ValueError(f"the direction has {self.direction.numel()} values; the layer has {channels} channels")
        wrong = [c for c in self.channels if not 0 <= c < channels]
        if wrong:
            raise ValueError(f"channel(s) {wrong} out of range: the layer has channels 0 to {channels - 1}")


#: What names a concept: a channel id, a list of channel ids, a direction (a 1-D float
#: tensor with one value per channel), or a :class:`.Concept`.
ConceptSpec = int | Sequence[int] | Tensor | Concept


def parse_concepts(specs) -> list[Concept]:
    """Concepts from one spec or a list of them (a list of ints is a list of channels; nest
    a list to make a set: ``[[0, 1], 5]``)."""
    if isinstance(specs, (Concept, numbers.Integral)) or (isinstance(specs, Tensor) and specs.is_floating_point()):
        return [Concept.parse(specs)]
    if isinstance(specs, Tensor):
        specs = specs.tolist()
    if not isinstance(specs, Sequence) or isinstance(specs, str) or not specs:
        raise ValueError(f"concepts is a concept or a non-empty list of them, got {specs!r}")
    return [Concept.parse(spec) for spec in specs]


def concept_masks(concepts: Sequence[Concept], activations: Tensor) -> Tensor:
    """The masks (K, C, 1, 1), or (K, C, h, w) where a concept is a direction, of
    ``concepts`` on a layer whose activations of one image are ``activations`` (1, C, h, w),
    with the layer's spatial axes (one or more) after C."""
    channels, spatial = activations.shape[1], activations.shape[2:]
    ones = (1,) * len(spatial)
    masks = []
    for concept in concepts:
        concept.check(channels)
        if concept.direction is None:
            mask = torch.zeros(channels, *ones, device=activations.device, dtype=activations.dtype)
            mask[list(concept.channels)] = 1
        else:
            mask = direction_mask(concept.direction.to(activations), activations[0])
        masks.append(mask)
    shape = torch.broadcast_shapes(*(mask.shape for mask in masks))
    return torch.stack([mask.expand(shape) for mask in masks])


def direction_mask(direction: Tensor, activation: Tensor) -> Tensor:
    """``M(c, p) = v_c (v . a(p)) / (|v|^2 a_c(p))`` for ``activation`` (C, ...) and direction v
    (C,); ``v_c^2 / |v|^2`` where a_c(p) is zero (below 1e-12 of the largest ``|a|``).

    >>> a = torch.tensor([[[2.0]], [[1.0]]])                  # C = 2, one position
    >>> basis = torch.tensor([[1.0, 1.0], [1.0, -1.0]]) / 2**0.5
    >>> sum(direction_mask(v, a) for v in basis)[:, 0, 0]     # an orthonormal basis: masks sum to 1
    tensor([1., 1.])
    """
    shape = (-1,) + (1,) * (activation.dim() - 1)
    v = direction.reshape(shape)
    squared = (direction**2).sum()
    along = (v * activation).sum(dim=0, keepdim=True)  # v . a(p)
    tiny = activation.abs().amax() * 1e-12
    zero = activation.abs() <= tiny
    ratio = v * along / (squared * torch.where(zero, torch.ones_like(activation), activation))
    return torch.where(zero, (v**2 / squared).expand_as(activation), ratio)


def channel_relevance(relevance: Tensor, *, normalized: bool = False) -> Tensor:
    """The relevance of each channel, (N, C), from a layer's relevance (N, C, ...): summed
    over the positions; with ``normalized``, divided by the sum of the channels' absolute
    relevances (zennit-crp's ``ChannelConcept.attribute(abs_norm=True)``: each image's
    shares, whose absolute values sum to one).

    >>> channel_relevance(torch.tensor([[[1.0, 2.0], [-1.0, 0.0]]]), normalized=True)
    tensor([[ 0.7500, -0.2500]])
    """
    summed = relevance.flatten(2).sum(dim=2)
    if normalized:
        summed = summed / (summed.abs().sum(dim=1, keepdim=True) + 1e-10)
    return summed


def concept_relevances(relevance: Tensor, masks: Tensor) -> Tensor:
    """(N, K) the relevance of each of K concepts, sum_{c,p} M_k(c, p) R(c, p), from a layer's
    relevance (N, C, ...) and masks (N, K, C, ...) whose positions may be of size one.

    >>> concept_relevances(torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]), torch.tensor([[[[1.0], [0.0]], [[1.0], [1.0]]]]))
    tensor([[ 3., 10.]])
    """
    if all(size == 1 for size in masks.shape[3:]):
        return (masks.flatten(2) * channel_relevance(relevance)[:, None]).sum(dim=2)
    return torch.stack([(relevance[i] * masks[i]).flatten(1).sum(dim=1) for i in range(len(relevance))])
