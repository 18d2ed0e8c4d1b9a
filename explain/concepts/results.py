"""What concept relevance returns: :class:`.ConceptExplanation` (the concepts of a decision,
with their conditional heatmaps) and :class:`.AttributionGraph` (a concept decomposed into
the concepts of lower layers that feed it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..drawing import overlay, to_rgb
from ..methods.attribution_base import normalize_maps

__all__ = ["AttributionGraph", "ConceptExplanation", "GraphNode"]


@dataclass(frozen=True, repr=False)
class ConceptExplanation:
    """The concepts of a layer that carry each image's decision, and where each is relevant.

    Attributes
    ----------
    layer:
        The layer's name.
    ids:
        (N, K) the concepts' channel ids (-1 for a set of channels or a direction).
    labels:
        N tuples of K names: the channel id, ids joined by ``+``, or ``direction``.
    relevances:
        (N, K) each concept's relevance for the target: the layer's relevance under the
        concept's mask, summed (the sum of its conditional map, where the rules conserve).
    maps:
        (N, K, H, W) the conditional heatmaps R(x | layer, concept, target): the pixels'
        relevance, signed, summed over the input's channels, not scaled.
    channel_relevances:
        (N, C) the relevance of every channel of the layer: the "glocal" ranking.
    targets:
        (N,) the explained class ids (-1 where a callable picked the score).
    logits:
        The model output, detached.
    class_names:
        The model's class names, where known.
    """

    layer: str
    ids: Tensor
    labels: tuple[tuple[str, ...], ...]
    relevances: Tensor
    maps: Tensor
    channel_relevances: Tensor
    targets: Tensor
    logits: Tensor
    class_names: Sequence[str] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return self.maps.shape[0]

    @property
    def shares(self) -> Tensor:
        """(N, K) each concept's relevance over the sum of the channels' absolute relevances
        (zennit-crp's ``abs_norm``): comparable across images."""
        total = self.channel_relevances.abs().sum(dim=1, keepdim=True)
        return self.relevances / (total + 1e-10)

    @property
    def target_names(self) -> list[str]:
        """The explained classes' names (their ids as text where unnamed)."""
        names = self.class_names
        return [("custom" if i < 0 else names[i] if names else str(i)) for i in self.targets.tolist()]

    def scaled_maps(self, clip_percentile: float = 99.0) -> Tensor:
        """(N, K, H, W) the maps in [-1, 1], each divided by a high percentile of its
        magnitude (as the attribution methods' maps are)."""
        return normalize_maps(self.maps, clip_percentile)

    def overlays(self, image, index: int = 0, *, alpha: float = 0.6, cmap=None) -> list[np.ndarray]:
        """(H, W, 3) uint8 overlays of image ``index``'s conditional maps on ``image`` (the
        picture as shown, anything :func:`~explain.to_rgb` reads), one per concept:
        red where the concept speaks for the target, blue where against it."""
        rgb = to_rgb(image)
        return [overlay(rgb, heat, cmap, alpha, signed=True) for heat in self.scaled_maps()[index]]

    def figure(self, image, index: int = 0, *, alpha: float = 0.6, columns: int | None = None):
        """A matplotlib figure: the image, then each concept's conditional map over it,
        titled with the concept, its relevance and its share."""
        import matplotlib.pyplot as plt

        panels = [("image", to_rgb(image))]
        shares = self.shares[index].tolist()
        for label, rel, share, picture in zip(
            self.labels[index],
            self.relevances[index].tolist(),
            shares,
            self.overlays(image, index, alpha=alpha),
            strict=True,
        ):
            panels.append((f"{self.layer}:{label}\nR={rel:.3g} ({share:.0%})", picture))
        columns = columns or min(len(panels), 5)
        rows = -(-len(panels) // columns)
        figure, axes = plt.subplots(
            rows, columns, figsize=(2.6 * columns, 2.9 * rows), squeeze=False, layout="constrained"
        )
        for axis in axes.flat:
            axis.axis("off")
        for axis, (title, picture) in zip(axes.flat, panels, strict=False):
            axis.imshow(picture)
            axis.set_title(title, fontsize=8)
        figure.suptitle(f"{self.target_names[index]}: its concepts at {self.layer}", fontsize=9)
        return figure

    def to(self, device: torch.device | str) -> ConceptExplanation:
        """The same explanation with every tensor on ``device``."""
        return replace(
            self,
            **{
                name: getattr(self, name).to(device)
                for name in ("ids", "relevances", "maps", "channel_relevances", "targets", "logits")
            },
        )

    def __repr__(self) -> str:
        """One line: the layer, the shapes and the first image's concepts.

        >>> ConceptExplanation("layer4", torch.tensor([[3, 1]]), (("3", "1"),), torch.tensor([[0.5, 0.25]]),
        ...                    torch.zeros(1, 2, 8, 8), torch.zeros(1, 4), torch.tensor([7]), torch.zeros(1, 10))
        ConceptExplanation(layer='layer4', maps=(1, 2, 8, 8), targets=[7], concepts of image 0: 3 (0.5), 1 (0.25))
        """
        first = ", ".join(
            f"{label} ({rel:.3g})" for label, rel in zip(self.labels[0], self.relevances[0].tolist(), strict=True)
        )
        targets = self.targets.tolist() if self.targets.numel() <= 8 else f"shape {tuple(self.targets.shape)}"
        return (
            f"ConceptExplanation(layer={self.layer!r}, maps={tuple(self.maps.shape)}, targets={targets}, "
            f"concepts of image 0: {first})"
        )


class GraphNode(NamedTuple):
    """A concept in an :class:`.AttributionGraph`: its layer and channel, the relevance that
    flows through it along its path from the root, and its parent's index (None: the root)."""

    layer: str
    channel: int
    relevance: float
    parent: int | None


@dataclass(frozen=True)
class AttributionGraph:
    """A concept (the root, ``nodes[0]``) decomposed into the concepts of lower layers that
    feed it: each node's relevance is the relevance that reaches its channel with the
    relevance conditioned on every concept of its path (its ancestors); where the rules
    conserve and the lower layer lies on every path into the upper one, a node's children
    over *all* channels sum to the node's relevance."""

    nodes: tuple[GraphNode, ...]
    target: int

    def children(self, index: int) -> list[int]:
        """The indices of node ``index``'s children, most relevant first."""
        return [i for i, node in enumerate(self.nodes) if node.parent == index]

    @property
    def edges(self) -> list[tuple[int, int, float]]:
        """(parent, child, relevance) of every edge."""
        return [(node.parent, i, node.relevance) for i, node in enumerate(self.nodes) if node.parent is not None]

    def __str__(self) -> str:
        """The tree, one node a line.

        >>> print(AttributionGraph((GraphNode("layer4", 3, 1.5, None), GraphNode("layer3", 7, 0.75, 0)), 2))
        layer4:3 R=1.5
          layer3:7 R=0.75
        """
        lines: list[str] = []

        def walk(index: int, depth: int) -> None:
            node = self.nodes[index]
            lines.append(f"{'  ' * depth}{node.layer}:{node.channel} R={node.relevance:.4g}")
            for child in self.children(index):
                walk(child, depth + 1)

        walk(0, 0)
        return "\n".join(lines)
