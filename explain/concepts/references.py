"""Reference regions of a concept atlas: for each channel's reference images, the region
where the channel's own relevance lies, and crops of it.

As zennit-crp's receptive-field references (``FeatureVisualization.get_max_reference`` with
``rf=True``): the neuron of the reference (the channel at the position of its maximum) is
given relevance equal to its activation, all other units none, and LRP takes it back to
the pixels; the region is the box around the pixels where that map, blurred, exceeds
``crop_threshold`` of its maximum (zennit-crp's ``get_crop_range``). Only the atlas's few
reference images are run, after the pass over the dataset: the atlas stores (image id,
position) pairs, :func:`~explain.concepts.reference_patches` turns them into (image id, box) pairs, and
:meth:`.ReferencePatches.crops` cuts the crops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..baselines import gaussian_filter
from ..checks import positive_int
from ..concurrency import model_lock
from ..layers import resolve_layers
from ..methods import LRP, LRP_COMPOSITES
from ..passes import Passes, call_settings
from .atlas import ConceptAtlas
from .propagation import ConceptPasses, concept_context, row_chunks

__all__ = ["ReferencePatches", "fetch_images", "neuron_relevance", "reference_patches", "relevant_box"]


@dataclass(frozen=True)
class ReferencePatches:
    """The reference regions of some channels of a layer: ``channels`` (K,), per channel its
    reference images' ``ids`` and ``values`` (K, N) (id -1 where the atlas has fewer), and
    ``boxes`` (K, N, 4): (x0, y0, x1, y1) in the images' pixels, the end excluded."""

    layer: str
    mode: str
    channels: Tensor
    ids: Tensor
    values: Tensor
    boxes: Tensor

    def crops(self, images, size: int | tuple[int, int] = 64) -> Tensor:
        """(K, N, C, size, size) the regions cut from ``images`` (a tensor indexed by image
        id, a sequence, or a function of a tensor of ids) and resized (bilinear); zeros where
        there is no reference."""
        shape = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        valid = self.ids >= 0
        picked = fetch_images(images, self.ids[valid])
        crops = picked.new_zeros(*self.ids.shape, picked.shape[1], *shape)
        cut = [
            F.interpolate(image[None, :, y0:y1, x0:x1], size=shape, mode="bilinear", align_corners=False)[0]
            for image, (x0, y0, x1, y1) in zip(picked, self.boxes[valid].tolist(), strict=True)
        ]
        if cut:
            crops[valid] = torch.stack(cut)
        return crops

    def figure(
        self, images, *, size: int = 64, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
    ):
        """A matplotlib figure: a row per channel, its crops in order (``mean`` and ``std``
        undo the model's normalisation for showing them)."""
        import matplotlib.pyplot as plt

        crops = self.crops(images, size)
        if mean is not None and std is not None:
            crops = crops * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)
        rows, columns = self.ids.shape
        figure, axes = plt.subplots(
            rows, columns, figsize=(1.3 * columns, 1.4 * rows), squeeze=False, layout="constrained"
        )
        for k in range(rows):
            for n in range(columns):
                axis = axes[k, n]
                axis.axis("off")
                if self.ids[k, n] >= 0:
                    axis.imshow(crops[k, n].clamp(0, 1).permute(1, 2, 0).cpu().numpy())
                if n == 0:
                    axis.set_title(f"{self.layer}:{int(self.channels[k])}", fontsize=8, loc="left")
        return figure


def fetch_images(images, ids: Tensor) -> Tensor:
    """The images of ``ids``: rows of a tensor, items of a sequence (a dataset's items may be
    (image, label) pairs), or what a function of the ids returns."""
    if isinstance(images, Tensor):
        return images[ids.to(images.device)]
    if callable(images) and not isinstance(images, Sequence):
        return images(ids)
    items = [images[i] for i in ids.tolist()]
    return torch.stack([item[0] if isinstance(item, (tuple, list)) else item for item in items])


def relevant_box(heatmaps: Tensor, crop_threshold: float = 0.1, sigma: float | None = None) -> Tensor:
    """(B, 4) boxes (x0, y0, x1, y1) around the pixels where each map (B, H, W), blurred
    (a Gaussian of ``sigma`` pixels, default a 32nd of the smaller side) and divided by its
    maximum, exceeds ``crop_threshold``; the whole image where none does.

    >>> heat = torch.zeros(1, 32, 32); heat[0, 10:14, 20:22] = 1.0
    >>> relevant_box(heat, sigma=0.1).tolist()
    [[20, 10, 22, 14]]
    """
    height, width = heatmaps.shape[-2:]
    sigma = max(1.0, min(height, width) / 32) if sigma is None else sigma
    blurred = gaussian_filter(heatmaps[:, None].float(), sigma)[:, 0].clamp(min=0)
    peak = blurred.flatten(1).amax(dim=1).view(-1, 1, 1)
    inside = (blurred > crop_threshold * peak) & (peak > 0)
    rows, columns = inside.any(dim=2), inside.any(dim=1)
    boxes = []
    for row, column in zip(rows, columns, strict=True):
        if not row.any():
            boxes.append([0, 0, width, height])
            continue
        ys, xs = row.nonzero()[:, 0], column.nonzero()[:, 0]
        boxes.append([int(xs[0]), int(ys[0]), int(xs[-1]) + 1, int(ys[-1]) + 1])
    return torch.tensor(boxes, dtype=torch.long).reshape(-1, 4)


def reference_patches(
    model: nn.Module,
    atlas: ConceptAtlas,
    images: Tensor | Sequence | Callable[[Tensor], Tensor],
    layer: str,
    *,
    mode: str = "relevance",
    channels: Sequence[int] | None = None,
    crop_threshold: float = 0.1,
    composite: str = LRP_COMPOSITES[0],
    batch_size: int | None = None,
    max_memory=None,
    progress=None,
    **lrp_options,
) -> ReferencePatches:
    """The reference regions of ``channels`` (default: all) of ``layer`` in ``atlas``:
    each reference image's neuron (see :mod:`explain.concepts.references`) back to the
    pixels, and the box where that map is relevant. ``images`` gives the images by id (the
    tensor, sequence or function that the atlas's ids index). One batched pass (forward to
    the layer, backward from it) per inner batch of (channel, reference) rows."""
    if not 0.0 <= crop_threshold < 1.0:
        raise ValueError(f"crop_threshold lies in [0, 1), got {crop_threshold!r}")
    references = atlas.references(layer, mode)
    channels = list(range(references.ids.shape[1])) if channels is None else [int(c) for c in channels]
    picked = torch.tensor(channels, dtype=torch.long)
    ids, positions = references.ids[:, picked].T, references.positions[:, picked].T  # (K, N)
    boxes = torch.full((*ids.shape, 4), -1, dtype=torch.long)
    passes_ = ConceptPasses(LRP(model, composite=composite, **lrp_options))
    ((name, module),) = resolve_layers(model, layer).items()
    rows = (ids >= 0).nonzero().tolist()
    if not rows:  # no channel asked for, or no reference yet: nothing to run
        return ReferencePatches(layer, mode, picked, ids, references.values[:, picked].T, boxes)
    given = None if batch_size is None else positive_int("batch_size", batch_size)
    with (
        model_lock(model),
        call_settings(max_memory, progress),
        concept_context(model),
        Passes("references", len(rows)) as passes,
    ):
        example = fetch_images(images, ids[ids >= 0][:1])
        for part in row_chunks(model, example, len(rows), given, ("references", name)):
            chunk = torch.tensor(rows[part])
            k, n = chunk[:, 0], chunk[:, 1]
            batch = fetch_images(images, ids[k, n])
            pixels, _ = passes_.from_layer(batch, (name, module), neuron_relevance(picked[k], positions[k, n]))
            boxes[k, n] = relevant_box(pixels.sum(dim=1), crop_threshold).to(boxes)
            passes.advance(len(chunk))
    return ReferencePatches(layer, mode, picked, ids, references.values[:, picked].T, boxes)


def neuron_relevance(channels: Tensor, positions: Tensor) -> Callable[[Tensor], Tensor]:
    """The relevance (B, C, ...) at a layer: in row b, the activation of unit ``positions[b]``
    of channel ``channels[b]``, zero elsewhere."""

    def relevance(activation: Tensor) -> Tensor:
        flat = torch.zeros(
            activation.shape[0],
            activation.shape[1],
            activation[0, 0].numel(),
            device=activation.device,
            dtype=activation.dtype,
        )
        flat[torch.arange(len(channels)), channels.to(activation.device), positions.to(activation.device)] = 1
        return activation * flat.view_as(activation)

    return relevance
