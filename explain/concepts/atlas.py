"""The concept atlas of a dataset: per channel of chosen layers, the images that most
activate it (Activation Maximization) and those in which it is most relevant (Relevance
Maximization), with statistics, kept as a running top-N whose memory does not grow with
the dataset.

Achtibat et al., "From attribution maps to human-understandable explanations through
Concept Relevance Propagation", Nature Machine Intelligence 5, 2023, sec. "Relevance
Maximization": a concept's reference samples are the inputs that maximise its relevance
for the model's decisions, T_rel(x) = R(theta | x), rather than its activation,
T_act(x) = max_p a_theta(x, p) (or the mean over p), which favours inputs the concept
reacts to but that need not matter to any decision. What each image contributes is an
:class:`~explain.concepts.AtlasBatch` (:class:`~explain.concepts.AtlasProbe`
makes them); :class:`.ConceptAtlas` keeps, per layer and channel, the ``top_n`` best images
of each kind with the position of the maximum, and sums for the statistics.

Ordering is total (a higher value first, then a smaller image id), so the atlas of a
dataset does not depend on the batches it came in, and merging the atlases of shards
(:meth:`.ConceptAtlas.merge`) gives the atlas of the whole dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..checks import positive_int
from ..passes import Passes, call_settings
from .probe import AtlasBatch, AtlasProbe, LayerBatch

__all__ = ["ATLAS_FORMAT", "ChannelStatistics", "ConceptAtlas", "LayerAtlas", "References", "TopN", "concept_atlas"]

#: The ``format`` entry of :meth:`.ConceptAtlas.state_dict`.
ATLAS_FORMAT = "explain.concepts.atlas/1"


class References(NamedTuple):
    """A layer's reference images of one kind: (top_n, C) each, best first; ``ids`` -1 and
    ``values`` -inf where fewer images were seen."""

    values: Tensor
    ids: Tensor
    positions: Tensor
    classes: Tensor


@dataclass
class TopN:
    """The ``n`` best (value, image id, position, class) per channel, in a total order."""

    values: Tensor
    ids: Tensor
    positions: Tensor
    classes: Tensor

    @classmethod
    def empty(cls, n: int, channels: int) -> TopN:
        return cls(
            torch.full((n, channels), -torch.inf),
            torch.full((n, channels), -1, dtype=torch.long),
            torch.zeros(n, channels, dtype=torch.long),
            torch.full((n, channels), -1, dtype=torch.long),
        )

    def add(self, values: Tensor, ids: Tensor, positions: Tensor, classes: Tensor) -> None:
        """Candidates: ``values`` and ``positions`` (B, C), ``ids`` and ``classes`` (B,) or
        (B, C); each channel keeps its ``n`` best of the old and the new."""
        n, channels = self.values.shape
        values = torch.cat([self.values, torch.nan_to_num(values.float(), nan=-torch.inf)])
        ids = torch.cat([self.ids, ids if ids.dim() == 2 else ids[:, None].expand(-1, channels)])
        positions = torch.cat([self.positions, positions])
        classes = torch.cat([self.classes, classes if classes.dim() == 2 else classes[:, None].expand(-1, channels)])
        # A higher value first; between equal values, the smaller image id: sort by id, then
        # stably by value.
        by_id = ids.argsort(dim=0, stable=True)
        by_value = values.gather(0, by_id).neg().argsort(dim=0, stable=True)
        order = by_id.gather(0, by_value)[:n]
        self.values, self.ids, self.positions, self.classes = (
            t.gather(0, order) for t in (values, ids, positions, classes)
        )

    def merged(self, other: TopN) -> TopN:
        """The ``n`` best of both."""
        result = TopN(self.values, self.ids, self.positions, self.classes)
        result.add(other.values, other.ids, other.positions, other.classes)
        return result


class ChannelStatistics(NamedTuple):
    """A layer's channels over the images seen: ``mean_activation`` (C,), the mean over
    images of each channel's mean activation over positions; ``mean_relevance`` (C,), of its
    relevance for the explained class (normalised per image where the probe normalises);
    ``top_count`` (C,), how many images had the channel among their top-k concepts;
    ``top_by_class`` (num_classes, C), the same per explained class; ``images``: how many
    images were seen."""

    mean_activation: Tensor
    mean_relevance: Tensor
    top_count: Tensor
    top_by_class: Tensor
    images: int


class LayerAtlas:
    """One layer's running top-N (ActMax and RelMax) and sums."""

    def __init__(self, top_n: int, channels: int, grid: tuple[int, ...], input_size: tuple[int, ...]):
        self.top_n, self.grid, self.input_size = top_n, tuple(grid), tuple(input_size)
        self.activation = TopN.empty(top_n, channels)
        self.relevance = TopN.empty(top_n, channels)
        self.images = 0
        self.activation_sum = torch.zeros(channels, dtype=torch.float64)
        self.relevance_sum = torch.zeros(channels, dtype=torch.float64)
        self.top_count = torch.zeros(channels, dtype=torch.long)
        self.top_by_class = torch.zeros(0, channels, dtype=torch.long)

    @property
    def channels(self) -> int:
        return self.activation.values.shape[1]

    def update(self, batch: LayerBatch, ids: Tensor, classes: Tensor) -> None:
        """Take one batch's values of this layer (on the CPU)."""
        if batch.activation.shape[1] != self.channels or tuple(batch.grid) != self.grid:
            raise ValueError(
                f"a batch's layer has {batch.activation.shape[1]} channels on a {tuple(batch.grid)} grid; the atlas's "
                f"has {self.channels} on {self.grid}: give every batch the same input size"
            )
        self.activation.add(batch.activation, ids, batch.activation_at, classes)
        self.relevance.add(batch.relevance, ids, batch.relevance_at, classes)
        self.images += len(ids)
        self.activation_sum += batch.mean_activation.double().sum(dim=0)
        self.relevance_sum += batch.relevance.double().sum(dim=0)
        hits = torch.zeros(len(ids), self.channels, dtype=torch.long).scatter_(1, batch.top, 1)
        self.top_count += hits.sum(dim=0)
        known = classes >= 0
        self._grow(int(classes.max()) + 1 if known.any() else 0)
        self.top_by_class.index_add_(0, classes[known], hits[known])

    def _grow(self, classes: int) -> None:
        if classes > len(self.top_by_class):
            grown = torch.zeros(classes, self.channels, dtype=torch.long)
            grown[: len(self.top_by_class)] = self.top_by_class
            self.top_by_class = grown

    def merge(self, other: LayerAtlas) -> None:
        """Take ``other``'s images too (another shard of the dataset)."""
        if (other.channels, other.grid, other.top_n) != (self.channels, self.grid, self.top_n):
            raise ValueError("cannot merge atlases of layers with other channels, grids or top_n")
        self.activation = self.activation.merged(other.activation)
        self.relevance = self.relevance.merged(other.relevance)
        self.images += other.images
        self.activation_sum += other.activation_sum
        self.relevance_sum += other.relevance_sum
        self.top_count += other.top_count
        self._grow(len(other.top_by_class))
        self.top_by_class[: len(other.top_by_class)] += other.top_by_class

    def statistics(self) -> ChannelStatistics:
        seen = max(self.images, 1)
        return ChannelStatistics(
            (self.activation_sum / seen).float(),
            (self.relevance_sum / seen).float(),
            self.top_count.clone(),
            self.top_by_class.clone(),
            self.images,
        )

    _TENSORS = ("activation_sum", "relevance_sum", "top_count", "top_by_class")

    def state_dict(self) -> dict:
        state: dict = {"top_n": self.top_n, "grid": list(self.grid), "input_size": list(self.input_size)}
        state["images"] = self.images
        for kind in ("activation", "relevance"):
            state[kind] = {name: getattr(getattr(self, kind), name).clone() for name in References._fields}
        state.update({name: getattr(self, name).clone() for name in self._TENSORS})
        return state

    @classmethod
    def from_state_dict(cls, state: dict) -> LayerAtlas:
        layer = cls(state["top_n"], state["activation"]["values"].shape[1], state["grid"], state["input_size"])
        layer.images = int(state["images"])
        for kind in ("activation", "relevance"):
            setattr(layer, kind, TopN(*(state[kind][name].clone() for name in References._fields)))
        for name in cls._TENSORS:
            setattr(layer, name, state[name].clone())
        return layer


class ConceptAtlas:
    """The running atlas of a dataset: per layer, ``LayerAtlas``; its memory depends on
    ``top_n``, the channels and the classes, never on how many images it has seen.

    ``update`` takes each batch's :class:`~explain.concepts.AtlasBatch`; ``merge`` an
    atlas of other images (a shard); ``state_dict`` / :meth:`.from_state_dict` save and
    restore it (resume). ``settings`` are the probe's (the reductions), which batches and
    merged atlases must share.

    >>> from explain.concepts.probe import AtlasBatch, LayerBatch
    >>> atlas = ConceptAtlas(top_n=2)
    >>> values = torch.tensor([[1.0, 5.0], [3.0, 2.0], [2.0, 2.0]])       # 3 images, 2 channels
    >>> layer = LayerBatch(values, torch.zeros(3, 2, dtype=torch.long), values, torch.zeros(3, 2, dtype=torch.long),
    ...                    values, torch.tensor([[1], [0], [0]]), (1, 1))
    >>> atlas.update(AtlasBatch(torch.tensor([10, 11, 12]), torch.tensor([0, 1, 1]), {"conv": layer}, (4, 4), {}))
    >>> atlas.references("conv", "activation").ids.tolist()     # per channel, the best images first
    [[11, 10], [12, 11]]
    """

    def __init__(self, top_n: int = 8):
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise ValueError(f"top_n must be a positive int, got {top_n!r}")
        self.top_n = top_n
        self.layers: dict[str, LayerAtlas] = {}
        self.settings: dict | None = None

    @property
    def images(self) -> int:
        """How many images the atlas has seen."""
        return next(iter(self.layers.values())).images if self.layers else 0

    def update(self, batch: AtlasBatch) -> None:
        """Take one batch of images' values (from :class:`~explain.concepts.AtlasProbe`)."""
        self._check_settings(batch.settings)
        ids, classes = batch.ids.cpu().long(), batch.classes.cpu().long()
        for name, layer in batch.layers.items():
            layer = layer.cpu()
            if name not in self.layers:
                self.layers[name] = LayerAtlas(self.top_n, layer.activation.shape[1], layer.grid, batch.input_size)
            self.layers[name].update(layer, ids, classes)

    def _check_settings(self, settings: dict) -> None:
        if self.settings is None:
            self.settings = dict(settings)
        elif settings != self.settings:
            raise ValueError(f"the batch was probed with {settings}, the atlas with {self.settings}; use one probe")

    def merge(self, other: ConceptAtlas) -> ConceptAtlas:
        """Take the images of ``other`` (a shard of the same dataset, probed alike) too;
        returns self. Merged shards give the atlas of one pass over them all."""
        if other.top_n != self.top_n:
            raise ValueError(f"cannot merge an atlas of top_n={other.top_n} into one of top_n={self.top_n}")
        if other.settings is not None:
            self._check_settings(other.settings)
        for name, layer in other.layers.items():
            if name in self.layers:
                self.layers[name].merge(layer)
            else:
                self.layers[name] = LayerAtlas.from_state_dict(layer.state_dict())
        return self

    def references(self, layer: str, mode: str = "relevance") -> References:
        """The reference images of ``layer``: ``mode`` "relevance" (RelMax) or "activation"
        (ActMax); positions are flat indices into the layer's grid."""
        if mode not in ("relevance", "activation"):
            raise ValueError(f"mode is 'relevance' or 'activation', got {mode!r}")
        top = getattr(self._layer(layer), mode)
        return References(top.values.clone(), top.ids.clone(), top.positions.clone(), top.classes.clone())

    def statistics(self, layer: str) -> ChannelStatistics:
        """The channels' statistics at ``layer``."""
        return self._layer(layer).statistics()

    def _layer(self, layer: str) -> LayerAtlas:
        if layer not in self.layers:
            raise ValueError(f"the atlas has no layer {layer!r}; it has {', '.join(self.layers) or 'none yet'}")
        return self.layers[layer]

    def state_dict(self) -> dict:
        """Everything the atlas holds, as tensors and plain values (for ``torch.save``)."""
        return {
            "format": ATLAS_FORMAT,
            "top_n": self.top_n,
            "settings": dict(self.settings or {}),
            "layers": {name: layer.state_dict() for name, layer in self.layers.items()},
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> ConceptAtlas:
        """The atlas that :meth:`.state_dict` saved."""
        if not isinstance(state, dict) or state.get("format") != ATLAS_FORMAT:
            raise ValueError(f"not a saved concept atlas (format {ATLAS_FORMAT!r})")
        atlas = cls(state["top_n"])
        atlas.settings = dict(state["settings"]) or None
        atlas.layers = {name: LayerAtlas.from_state_dict(layer) for name, layer in state["layers"].items()}
        return atlas

    def __repr__(self) -> str:
        layers = ", ".join(f"{name!r}: {layer.channels} channels" for name, layer in self.layers.items())
        return f"ConceptAtlas(top_n={self.top_n}, images={self.images}, layers={{{layers}}})"


def concept_atlas(
    model: nn.Module,
    images,
    layers,
    *,
    top_n: int = 8,
    batch_size: int = 32,
    targets=None,
    atlas: ConceptAtlas | None = None,
    max_memory=None,
    progress=None,
    **probe_options,
) -> ConceptAtlas:
    """The concept atlas of ``images`` at ``layers`` of ``model``: per channel, its ``top_n``
    RelMax and ActMax reference images (with the position of each maximum) and statistics.

    ``images`` is a tensor (N, C, H, W), whose rows are the image ids, cut into batches of
    ``batch_size``; or an iterable of batches, each a tensor (ids counted on) or an
    ``(ids, tensor)`` pair (a :meth:`~explain.data.ShortcutSet.batches` iterator, a
    DataLoader yielding pairs). ``targets`` (a tensor, one class id per image of a tensor
    ``images``) explains given classes instead of the predicted ones. ``atlas`` goes on with
    an atlas (resume: one restored by :meth:`.ConceptAtlas.from_state_dict`, fed the images
    it has not seen); ids that ``images`` does not give are then counted on from the images
    it holds (:attr:`.ConceptAtlas.images`), as in one uninterrupted call.
    ``probe_options`` go to :class:`~explain.concepts.AtlasProbe`
    (``top_k``, ``activation``, ``relevance``, ``normalized``, the LRP rules, ``batch_size``
    of the inner batches is ``inner_batch_size`` here). Memory: the atlas's tensors, whose
    size does not depend on the number of images, and one batch at a time.

    Reference regions (crops) come afterwards from the few images the atlas names:
    :func:`~explain.concepts.reference_patches`.
    """
    inner = probe_options.pop("inner_batch_size", None)
    probe = AtlasProbe(model, layers, batch_size=inner, **probe_options)
    if targets is not None and not isinstance(images, Tensor):
        raise ValueError("targets go with a tensor of images (one class id per row); give the images as a tensor")
    atlas = ConceptAtlas(top_n) if atlas is None else atlas
    first = atlas.images  # an atlas gone on with numbers its new images on
    total = len(images) if isinstance(images, Tensor) else 0
    with call_settings(max_memory, progress), Passes("atlas", total) as passes:
        for ids, batch in _batches(images, positive_int("batch_size", batch_size), first):
            rows = None if targets is None else targets[ids - first]
            atlas.update(probe(batch, ids, rows))
            if not total:
                passes.total = passes.done + len(batch)
            passes.advance(len(batch))
    return atlas


def _batches(images, batch_size: int, first: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
    """(ids, images) of each batch of ``images`` (see :func:`.concept_atlas`), ids counted from
    ``first`` where ``images`` does not give them."""
    if isinstance(images, Tensor):
        for start in range(0, len(images), batch_size):
            ids = torch.arange(start, min(start + batch_size, len(images))) + first
            yield ids, images[start : start + batch_size]
        return
    counted = first
    for item in images:
        if isinstance(item, Tensor):
            ids, batch = torch.arange(counted, counted + len(item)), item
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], Tensor):
            ids, batch = torch.as_tensor(item[0]).long().flatten(), item[1]
        else:
            raise TypeError(f"each batch is a tensor (N, C, H, W) or an (ids, tensor) pair, got {type(item).__name__}")
        counted += len(batch)
        yield ids, batch
