"""What one batch of images adds to a concept atlas: per chosen layer and channel, its
activation and its relevance for the explained class, reduced over positions, with where
each peaks, and the image's most relevant channels.

One forward pass of the batch and one LRP backward pass from the output down to the lowest
chosen layer (:meth:`~explain.concepts.ConceptPasses.layer_pass`), in inner
batches within the memory budget. An :class:`.AtlasBatch` is small (a few numbers per
channel and image), made on whichever worker ran the model, and taken by
:meth:`explain.concepts.ConceptAtlas.update` anywhere.

The reductions follow zennit-crp's ``ChannelConcept.reference_sampling``: relevance summed
over positions (``relevance="sum"``) or its maximum (``"max"``), each image's channel
relevances divided by the sum of their absolute values (``normalized=True``, zennit-crp's
``abs_norm``, so that images of large and small scores compare); activation the maximum
over positions (``activation="max"``) or the mean (``"mean"``, zennit-crp's ``"sum"``
divided by the positions: the same ranking). The position kept is that of the largest
relevance (RelMax) and of the largest activation (ActMax): the neuron whose receptive field
is the reference's region. (zennit-crp's feature visualisation divides activations by their
channels' sum too; here they are kept as they are, so that a channel's activations compare
across images.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor, nn

from ..checks import channel_hint, check_images, positive_int
from ..concurrency import model_lock
from ..layers import resolve_layers
from ..methods import LRP, LRP_COMPOSITES
from ..passes import Passes, call_settings
from ..targets import select_targets
from .conditions import channel_relevance
from .crp import start_relevance
from .propagation import ConceptPasses, concept_context, row_chunks

__all__ = ["ACTIVATION_REDUCTIONS", "RELEVANCE_REDUCTIONS", "AtlasBatch", "AtlasProbe", "LayerBatch"]

#: How a channel's activation map becomes one value per image.
ACTIVATION_REDUCTIONS = ("max", "mean")
#: How a channel's relevance map becomes one value per image.
RELEVANCE_REDUCTIONS = ("sum", "max")


@dataclass(frozen=True)
class LayerBatch:
    """One layer's values for a batch of B images and C channels: ``activation`` (B, C) and
    ``activation_at`` (B, C) its position (a flat index into ``grid``); ``relevance`` and
    ``relevance_at`` the same for the relevance; ``mean_activation`` (B, C); ``top`` (B, k)
    each image's most relevant channels; ``grid`` the layer's spatial shape."""

    activation: Tensor
    activation_at: Tensor
    relevance: Tensor
    relevance_at: Tensor
    mean_activation: Tensor
    top: Tensor
    grid: tuple[int, ...]

    def cpu(self) -> LayerBatch:
        return replace(self, **{f.name: getattr(self, f.name).cpu() for f in fields(self) if f.name != "grid"})

    @classmethod
    def cat(cls, parts: Sequence[LayerBatch]) -> LayerBatch:
        tensors = {f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields(cls) if f.name != "grid"}
        return cls(**tensors, grid=parts[0].grid)


@dataclass(frozen=True)
class AtlasBatch:
    """A batch of images' contribution to a :class:`~explain.concepts.ConceptAtlas`: their
    ``ids`` (B,), the explained ``classes`` (B,), per layer a :class:`.LayerBatch`, the input
    size, and the probe's ``settings`` (the reductions, which an atlas's batches share)."""

    ids: Tensor
    classes: Tensor
    layers: dict[str, LayerBatch]
    input_size: tuple[int, ...]
    settings: dict

    def cpu(self) -> AtlasBatch:
        """The batch with its tensors on the CPU (to send to another process)."""
        layers = {name: layer.cpu() for name, layer in self.layers.items()}
        return replace(self, ids=self.ids.cpu(), classes=self.classes.cpu(), layers=layers)


class AtlasProbe:
    """Makes each batch's :class:`.AtlasBatch` for ``layers`` of ``model``: one forward and
    one LRP backward pass per image (see :mod:`explain.concepts.probe`).

    Parameters
    ----------
    model:
        A CNN classifier (a transformer raises :class:`~explain.NotApplicable`: no LRP rule
        conserves relevance through attention).
    layers:
        The layers of the atlas (names or modules).
    top_k:
        How many of an image's most relevant channels count for the statistics.
    activation, relevance, normalized:
        The reductions (see :data:`.ACTIVATION_REDUCTIONS`, :data:`.RELEVANCE_REDUCTIONS`).
    composite, epsilon, gamma, first_rule, normalization:
        LRP's rules (see :class:`~explain.LRP`).
    batch_size:
        Images per inner batch (default: from the memory budget, at the fastest size measured
        on these passes: :func:`~explain.concepts.propagation.row_chunks`).
    """

    def __init__(
        self,
        model: nn.Module,
        layers,
        *,
        top_k: int = 5,
        activation: str = "max",
        relevance: str = "sum",
        normalized: bool = True,
        composite: str = LRP_COMPOSITES[0],
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        first_rule: str | None = None,
        normalization=None,
        batch_size: int | None = None,
    ):
        if activation not in ACTIVATION_REDUCTIONS:
            raise ValueError(f"activation is one of {', '.join(ACTIVATION_REDUCTIONS)}, got {activation!r}")
        if relevance not in RELEVANCE_REDUCTIONS:
            raise ValueError(f"relevance is one of {', '.join(RELEVANCE_REDUCTIONS)}, got {relevance!r}")
        self.model = model
        lrp = LRP(
            model, composite=composite, epsilon=epsilon, gamma=gamma, first_rule=first_rule, normalization=normalization
        )
        self.passes = ConceptPasses(lrp)
        self.layers = resolve_layers(model, layers)
        self.top_k = positive_int("top_k", top_k)
        self.batch_size = None if batch_size is None else positive_int("batch_size", batch_size)
        #: The reductions and rules: an atlas takes batches of one setting only.
        self.settings = {
            "activation": activation,
            "relevance": relevance,
            "normalized": bool(normalized),
            "top_k": self.top_k,
            "composite": composite,
            "epsilon": float(epsilon),
            "gamma": float(gamma),
            "first_rule": first_rule,
            # the z-box bounds, as LRP resolved them (plain lists: the settings are saved)
            "normalization": [lrp.mean.flatten().tolist(), lrp.std.flatten().tolist()],
        }
        self.checked = False

    def __call__(
        self, images: Tensor, ids: Tensor | None = None, targets=None, *, max_memory=None, progress=None
    ) -> AtlasBatch:
        """The batch's values: ``ids`` (default 0..N-1) name the images in the atlas;
        ``targets`` the classes to explain (default: each image's predicted class; class
        ids, such as the dataset's labels, one per image)."""
        images = check_images(images, self.model)
        ids = torch.arange(len(images)) if ids is None else torch.as_tensor(ids).long().flatten().cpu()
        if len(ids) != len(images):
            raise ValueError(f"got {len(ids)} ids for {len(images)} images; give one id per image")
        with model_lock(self.model), call_settings(max_memory, progress), concept_context(self.model):
            parts, classes = [], []
            key = ("atlas", *self.layers)
            with Passes("atlas", len(images)) as passes:
                for chunk in row_chunks(self.model, images, len(images), self.batch_size, key):
                    picked, layers = self._probe(images[chunk], None if targets is None else _rows(targets, chunk))
                    parts.append(layers)
                    classes.append(picked)
                    passes.advance(len(picked))
        return AtlasBatch(
            ids,
            torch.cat(classes).cpu(),
            {name: LayerBatch.cat([part[name] for part in parts]) for name in self.layers},
            tuple(images.shape[2:]),
            dict(self.settings),
        )

    def _probe(self, images: Tensor, targets) -> tuple[Tensor, dict[str, LayerBatch]]:
        reference = None
        if not self.checked:  # the canonical model against the model, once per probe
            with torch.no_grad(), channel_hint(images):
                reference = self.model(images)
        picked: list[Tensor] = []

        def start(output: Tensor) -> Tensor:
            _, ids = select_targets(output, targets)
            picked.append(ids)
            return start_relevance(output, ids)

        layer_pass = self.passes.layer_pass(images, self.layers, start, reference=reference)
        self.checked = True
        return picked[0], {
            name: self._reduced(layer_pass.activations[name], layer_pass.relevances[name]) for name in self.layers
        }

    def _reduced(self, activation: Tensor, relevance: Tensor) -> LayerBatch:
        grid = tuple(activation.shape[2:])
        flat_activation = activation.reshape(*activation.shape[:2], -1)
        flat_relevance = relevance.reshape(*relevance.shape[:2], -1)
        peak, activation_at = flat_activation.max(dim=2)
        most, relevance_at = flat_relevance.max(dim=2)
        mean = flat_activation.mean(dim=2)
        summed = channel_relevance(flat_relevance)
        values = summed if self.settings["relevance"] == "sum" else most
        if self.settings["normalized"]:
            values = values / (values.abs().sum(dim=1, keepdim=True) + 1e-10)
        top = summed.topk(min(self.top_k, summed.shape[1]), dim=1).indices
        return LayerBatch(
            peak if self.settings["activation"] == "max" else mean, activation_at, values, relevance_at, mean, top, grid
        )


def _rows(targets, rows: slice):
    """The targets of ``rows`` of the batch: one target for all stays as it is."""
    if isinstance(targets, (int, str)):
        return targets
    return targets[rows]
