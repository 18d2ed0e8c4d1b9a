"""What concept relevance returns besides its :class:`~explain.ConceptExplanation` (the
concepts of a decision, with their conditional heatmaps: the result type DFF returns too):
:class:`.AttributionGraph` (a concept decomposed into the concepts of lower layers that feed
it), and the overlays and figure of a :class:`~explain.ConceptExplanation`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..drawing import overlay, to_rgb
from ..explanation import ConceptExplanation

__all__ = ["AttributionGraph", "GraphNode", "concept_figure", "concept_overlays"]


def concept_overlays(
    result: ConceptExplanation, image, index: int = 0, *, alpha: float = 0.6, cmap=None
) -> list[np.ndarray]:
    """(H, W, 3) uint8 overlays of image ``index``'s concept maps on ``image`` (the picture
    as shown, anything :func:`~explain.to_rgb` reads), one per concept: for signed maps (CRP's
    conditional heatmaps) red where the concept speaks for the target, blue where against it."""
    rgb = to_rgb(image)
    return [overlay(rgb, heat, cmap, alpha, signed=result.signed) for heat in result.maps[index]]


def concept_figure(
    result: ConceptExplanation, image, index: int = 0, *, alpha: float = 0.6, columns: int | None = None
):
    """A matplotlib figure: the image, then each concept's map over it, titled with the
    layer and the concept (and for CRP its relevance and share of the layer's)."""
    import matplotlib.pyplot as plt

    panels = [("image", to_rgb(image))]
    labels = result.labels[index]
    notes = [""] * len(labels)
    if result.relevances is not None and result.channel_relevances is not None:
        pairs = zip(result.relevances[index].tolist(), result.shares[index].tolist(), strict=True)
        notes = [f"\nR={rel:.3g} ({share:.0%})" for rel, share in pairs]
    for label, note, picture in zip(labels, notes, concept_overlays(result, image, index, alpha=alpha), strict=True):
        panels.append((f"{result.layer}:{label}{note}", picture))
    columns = columns or min(len(panels), 5)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(2.6 * columns, 2.9 * rows), squeeze=False, layout="constrained")
    for axis in axes.flat:
        axis.axis("off")
    for axis, (title, picture) in zip(axes.flat, panels, strict=False):
        axis.imshow(picture)
        axis.set_title(title, fontsize=8)
    names = result.target_names[index]
    name = names[0] if isinstance(names, list) and len(set(names)) == 1 else result.method
    figure.suptitle(f"{name}: its concepts at {result.layer}", fontsize=9)
    return figure


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
