"""Concept Relevance Propagation (CRP): which concepts of a layer carry a decision, and where
each of them is relevant in the image.

Achtibat et al., "From attribution maps to human-understandable explanations through
Concept Relevance Propagation", Nature Machine Intelligence 5, 2023. LRP hands the score
of class y back to layer l: relevances R_l(c, p) per channel c and position p (eq. 2-4). A
concept theta of l (a channel, a set of channels, a direction: see
:mod:`~explain.concepts.conditions`) masks them, and the backward pass goes on with the
masked relevance only: the conditional heatmap R(x | theta, y) (eq. 5-6), where in the
image concept theta is relevant for y. Its relevance, R(theta | y) = sum_p M R_l, ranks the
concepts of the decision (the "glocal" explanation, eq. 7). Since the rules are linear in
the relevance they receive, the conditional maps of all channels of l sum to the LRP map
of the relevance that passes through l, and the channels' relevances sum to the layer's.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..checks import channel_hint, check_images, positive_int
from ..concurrency import model_lock
from ..explanation import ConceptExplanation
from ..layers import resolve_layers
from ..methods import LRP, LRP_COMPOSITES, normalize_maps
from ..passes import Passes, call_settings
from ..targets import CUSTOM_TARGET, Targets, select_targets
from .conditions import Concept, channel_relevance, concept_masks, concept_relevances, parse_concepts
from .propagation import ConceptPasses, concept_context, row_chunks
from .results import AttributionGraph, GraphNode

__all__ = ["CRP", "start_relevance"]


def start_relevance(output: Tensor, ids: Tensor, custom: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """The relevance at the output: the explained logit in its place (zeros elsewhere), or
    for a callable target f, z * df/dz (which sums to f(z) for a linear f).

    >>> start_relevance(torch.tensor([[1.0, 3.0]]), torch.tensor([1]))
    tensor([[0., 3.]])
    """
    if custom is not None:
        with torch.enable_grad():
            z = output.detach().requires_grad_()
            (gradient,) = torch.autograd.grad(custom(z).sum(), z)
        return (output * gradient).detach()
    return torch.zeros_like(output).scatter(1, ids[:, None], output.gather(1, ids[:, None])).detach()


class CRP:
    """Concept Relevance Propagation at ``layer``: the concepts of a decision, ranked by
    relevance, with their conditional heatmaps (see :mod:`explain.concepts.crp`).

    Parameters
    ----------
    model:
        A CNN classifier returning (N, num_classes) logits. Models with attention layers
        raise :class:`~explain.NotApplicable`, as for :class:`~explain.LRP`.
    layer:
        The layer whose channels are the concepts (a dotted name or a module).
    composite, epsilon, gamma, first_rule, normalization:
        The rules, as :class:`~explain.LRP` takes them.
    batch_size:
        Rows (an image under one condition) per inner batch; by default as many as the memory
        budget allows, at the fastest size measured on these passes
        (:func:`~explain.concepts.propagation.row_chunks`).

    Examples
    --------
    >>> from explain.data import load_shortcut_model, shortcut_dataset
    >>> model = load_shortcut_model()                   # a small CNN (the shortcut benchmark's)
    >>> images = shortcut_dataset(4, seed=0).inputs     # (4, 3, 64, 64), one of each class
    >>> result = CRP(model, "block3")(images, k=3)      # the 3 most relevant channels of each
    >>> result.maps.shape, result.concept_ids.shape, result.raw.shape
    (torch.Size([4, 3, 64, 64]), torch.Size([4, 3]), torch.Size([4, 3, 64, 64]))
    >>> bool(torch.allclose(result.raw.sum(dim=(2, 3)), result.relevances, rtol=1e-3, atol=1e-4))
    True
    """

    name = "crp"

    def __init__(
        self,
        model: nn.Module,
        layer: str | nn.Module,
        *,
        composite: str = LRP_COMPOSITES[0],
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        first_rule: str | None = None,
        normalization=None,
        class_names: Sequence[str] | None = None,
        batch_size: int | None = None,
    ):
        self.lrp = LRP(
            model, composite=composite, epsilon=epsilon, gamma=gamma, first_rule=first_rule, normalization=normalization
        )
        self.passes = ConceptPasses(self.lrp)
        self.model = model
        ((self.layer, self.module),) = resolve_layers(model, layer).items()
        self.class_names = list(class_names) if class_names is not None else getattr(model, "class_names", None)
        self.batch_size = None if batch_size is None else positive_int("batch_size", batch_size)

    def __call__(
        self, images: Tensor, targets: Targets = None, *, k: int = 8, concepts=None, max_memory=None, progress=None
    ) -> ConceptExplanation:
        """The concepts of each image's decision for ``targets`` (default: its top class), as a
        :class:`~explain.ConceptExplanation`: ``maps`` the conditional heatmaps scaled to
        [-1, 1], ``raw`` the unscaled ones (N, K, H, W), ``concept_ids``, ``relevances`` and
        ``channel_relevances``.

        By default the ``k`` most relevant channels of the layer (at most its channel count),
        each with its conditional heatmap; with ``concepts`` (a channel id, a list of them,
        ``[[0, 1], 5]`` for a set and a channel, a direction, a :class:`.Concept`), those
        concepts for every image, in that order. All conditional maps of a call run as rows
        of a few batched passes (the forward pass to the layer, the backward from it).
        """
        images = self._checked(images)
        with model_lock(self.model), call_settings(max_memory, progress), concept_context(self.model):
            logits, ids, custom = self._targets(images, targets)
            given = None if concepts is None else parse_concepts(concepts)
            width = len(given) if given is not None else positive_int("k", k)
            with Passes(self.name, len(images) * (1 + width)) as passes:
                start = lambda output: start_relevance(output, ids, custom)  # noqa: E731
                layer_pass = self.passes.layer_pass(images, {self.layer: self.module}, start, reference=logits)
                passes.advance(len(images))
                relevance, activation = layer_pass.relevances[self.layer], layer_pass.activations[self.layer]
                channels = channel_relevance(relevance)
                picked = given_concepts(given, len(images)) if given else top_concepts(channels, width)
                masks = torch.stack([concept_masks(row, activation[i : i + 1]) for i, row in enumerate(picked)])
                maps = self._conditional_maps(images, relevance, masks, passes)
        return ConceptExplanation(
            normalize_maps(maps),
            {self.layer: maps},
            logits,
            ids[:, None].expand(-1, maps.shape[1]).clone(),
            self.name,
            self.class_names,
            signed=True,
            concept_ids=torch.tensor([[c.channel for c in row] for row in picked], device=images.device),
            concept_labels=tuple(tuple(c.label for c in row) for row in picked),
            relevances=concept_relevances(relevance, masks),
            channel_relevances=channels,
        )

    def _checked(self, images: Tensor) -> Tensor:
        images = check_images(images, self.model)
        if images.dim() != 4:
            raise ValueError(f"concept relevance explains images (N, C, H, W), got shape {tuple(images.shape)}")
        return images.clone() if images.is_inference() else images

    def _targets(self, images: Tensor, targets: Targets) -> tuple[Tensor, Tensor, Callable | None]:
        """The model's logits of ``images`` (no graph), the explained class ids, and the
        callable target (None for classes)."""
        with torch.no_grad(), channel_hint(images):
            logits = self.model(images)
        if not isinstance(logits, Tensor):
            raise TypeError(f"concept relevance needs a model that returns logits, got {type(logits).__name__}")
        _, ids = select_targets(logits, targets, class_names=self.class_names)
        if ids.dim() != 1:
            raise ValueError("concept relevance explains one target per image; call it once per target")
        custom = targets if callable(targets) and not isinstance(targets, Tensor) else None
        return logits.detach(), ids if custom is None else torch.full_like(ids, CUSTOM_TARGET), custom

    def _conditional_maps(self, images: Tensor, relevance: Tensor, masks: Tensor, passes: Passes) -> Tensor:
        """(N, K, H, W): image i's relevance at the layer under mask (i, j), back to the pixels,
        summed over the input's channels; the (image, concept) rows in inner batches."""
        n, width = masks.shape[:2]
        maps = images.new_zeros(n, width, *images.shape[2:])
        pairs = [(i, j) for i in range(n) for j in range(width)]
        for rows in row_chunks(self.model, images, len(pairs), self.batch_size, ("maps", self.layer)):
            chunk = torch.tensor(pairs[rows], device=images.device)
            i, j = chunk[:, 0], chunk[:, 1]
            conditioned = relevance[i] * masks[i, j]
            pixels, _ = self.passes.from_layer(images[i], (self.layer, self.module), _constant(conditioned))
            maps[i, j] = pixels.sum(dim=1)
            passes.advance(len(chunk))
        return maps

    def graph(
        self,
        image: Tensor,
        concept: int,
        layers: Sequence[str],
        *,
        width: int | Sequence[int] = 3,
        target: Targets = None,
        max_memory=None,
        progress=None,
    ) -> AttributionGraph:
        """Channel ``concept`` of the layer decomposed into the channels of ``layers`` (lower
        layers, from the top down) that feed it for ``target`` on one ``image`` (1, C, H, W):
        the ``width`` most relevant channels of the first lower layer, each of those into the
        ``width`` (or ``width[i]``) most relevant of the next, each edge the relevance that
        flows through the whole path (every concept of it conditioned). One batched pass per
        level."""
        image = self._checked(image)
        if len(image) != 1:
            raise ValueError(f"an attribution graph explains one image, got a batch of {len(image)}")
        lower = resolve_layers(self.model, list(layers))
        widths = [int(width)] * len(lower) if isinstance(width, numbers.Integral) else [int(w) for w in width]  # type: ignore[union-attr]
        if len(widths) != len(lower) or not all(positive_int("width", w) for w in widths):
            raise ValueError(f"width is an int or one int per lower layer ({len(lower)}), got {width!r}")
        with model_lock(self.model), call_settings(max_memory, progress), concept_context(self.model):
            logits, ids, custom = self._targets(image, target)
            layer_pass = self.passes.layer_pass(
                image, {self.layer: self.module}, lambda out: start_relevance(out, ids, custom), reference=logits
            )
            relevance = layer_pass.relevances[self.layer]
            Concept.parse(concept).check(relevance.shape[1])
            root = GraphNode(self.layer, int(concept), float(relevance[0, concept].sum()), None)
            nodes = grow_graph(self, image, relevance, [root], lower, widths)
        return AttributionGraph(tuple(nodes), int(ids[0]))


def _constant(relevance: Tensor) -> Callable[[Tensor], Tensor]:
    """The relevance at a layer that does not depend on the layer's activation."""
    return lambda activation: relevance


def top_concepts(channels: Tensor, k: int) -> list[list[Concept]]:
    """Each image's ``k`` most relevant channels (at most all), most relevant first."""
    ids = channels.topk(min(k, channels.shape[1]), dim=1).indices.tolist()
    return [[Concept(channels=(c,)) for c in row] for row in ids]


def given_concepts(concepts: list[Concept], n: int) -> list[list[Concept]]:
    return [list(concepts) for _ in range(n)]


def grow_graph(
    crp: CRP, image: Tensor, relevance: Tensor, nodes: list[GraphNode], lower: dict[str, nn.Module], widths: list[int]
) -> list[GraphNode]:
    """The graph's levels below the root ``nodes[0]``: per lower layer, batched passes whose
    rows are the frontier's nodes, each row's relevance at the root's layer masked to the
    root and at the lower layers passed to its ancestors' channels."""
    root = relevance * _one_hots([nodes[0].channel], relevance)
    frontier = [0]
    passed: dict[str, nn.Module] = {}
    shapes: dict[str, Tensor] = {}
    planned = sum(math.prod(widths[:level]) for level in range(len(widths)))
    with Passes("crp-graph", planned) as passes:
        for (name, module), width in zip(lower.items(), widths, strict=True):
            paths = [_path(nodes, index) for index in frontier]
            recorded = []
            for rows in row_chunks(crp.model, image, len(paths), crp.batch_size, ("graph", crp.layer, name)):
                chunk = paths[rows]
                masks = {layer: _one_hots([path[layer] for path in chunk], shapes[layer]) for layer in passed}
                found, _ = crp.passes.from_layer(
                    image.expand(len(chunk), *image.shape[1:]),
                    (crp.layer, crp.module),
                    _constant(root.expand(len(chunk), *root.shape[1:])),
                    lower={**passed, name: module},
                    masks=masks,
                    record=name,
                )
                recorded.append(channel_relevance(found))
                shapes[name] = found[:1]
                passes.advance(len(chunk))
            channels = torch.cat(recorded)
            frontier = _add_children(nodes, frontier, channels, name, width)
            passed[name] = module
    return nodes


def _path(nodes: list[GraphNode], index: int) -> dict[str, int]:
    """{layer: channel} of node ``index`` and its ancestors, the root left out."""
    path = {}
    while nodes[index].parent is not None:
        path[nodes[index].layer] = nodes[index].channel
        index = nodes[index].parent  # type: ignore[assignment]  # not None: checked by the loop
    return path


def _one_hots(channels: list[int], like: Tensor) -> Tensor:
    """(len(channels), C, 1, ...) masks of one channel each, for a layer whose relevance of
    one row is ``like`` (1, C, ...)."""
    masks = torch.zeros(len(channels), like.shape[1], *(1,) * (like.dim() - 2), dtype=like.dtype, device=like.device)
    masks[torch.arange(len(channels)), channels] = 1
    return masks


def _add_children(nodes: list[GraphNode], frontier: list[int], channels: Tensor, layer: str, width: int) -> list[int]:
    """Each frontier node's ``width`` most relevant channels of ``layer`` added as its children."""
    added = []
    for row, parent in enumerate(frontier):
        for channel in channels[row].topk(min(width, channels.shape[1])).indices.tolist():
            nodes.append(GraphNode(layer, channel, float(channels[row, channel]), parent))
            added.append(len(nodes) - 1)
    return added
