"""Crops of images, and a layer's output for them: the first step of CRAFT
(:mod:`explain.concepts.craft`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GRID_STEP", "crop_boxes", "cut_crops", "layer_output"]

#: The step of grid crops, as a share of their side (xplique's CRAFT: 80 %).
GRID_STEP = 0.8


class _Stop(Exception):
    """Ends a forward pass once the target layer has run."""


def crop_boxes(height: int, width: int, size: int, crops: int | str, generator: torch.Generator) -> Tensor:
    """(m, 4) long: top, left, height, width of the square crops of side ``size`` of an image:
    ``crops="grid"`` a grid spanning the image whose step is at most
    :data:`~explain.concepts.crops.GRID_STEP` of
    the side, or ``crops`` random places (drawn from ``generator``)."""
    size = min(size, height, width)
    if crops == "grid":

        def starts(extent: int) -> Tensor:
            count = math.ceil((extent - size) / (GRID_STEP * size)) + 1 if extent > size else 1
            return torch.linspace(0, extent - size, count).round().long()

        tops, lefts = torch.meshgrid(starts(height), starts(width), indexing="ij")
        tops, lefts = tops.flatten(), lefts.flatten()
    else:
        tops = torch.randint(height - size + 1, (int(crops),), generator=generator)
        lefts = torch.randint(width - size + 1, (int(crops),), generator=generator)
    sides = torch.full_like(tops, size)
    return torch.stack([tops, lefts, sides, sides], dim=1)


def layer_output(model: nn.Module, module: nn.Module, images: Tensor, whole: bool) -> tuple[Tensor, object]:
    """The layer's output for ``images`` and the model's output (None unless ``whole``: the
    pass then stops after the layer)."""
    found: list[Tensor] = []

    def hook(_module, _args, output):
        if not isinstance(output, Tensor):
            raise TypeError(f"the layer returns {type(output).__name__}; pick a layer whose output is a tensor")
        if not found:
            found.append(output.detach().clone())
        if not whole:
            raise _Stop

    handle = module.register_forward_hook(hook)
    try:
        logits = model(images)
    except _Stop:
        logits = None
    finally:
        handle.remove()
    if not found:
        raise ValueError("the layer did not run in the model's forward pass: pick a layer the forward uses")
    return found[0], logits


def cut_crops(images: Tensor, boxes: Tensor, owners: Tensor, size: tuple[int, int]) -> Tensor:
    """The crops ``boxes`` of images ``owners``, each resized to ``size`` (bilinear, antialiased;
    in float32, which every device's antialiased resize takes, then in the images' dtype)."""
    pieces = [
        images[i, :, t : t + h, x : x + w] for i, (t, x, h, w) in zip(owners.tolist(), boxes.tolist(), strict=True)
    ]
    crops = torch.stack(pieces).float()
    return F.interpolate(crops, size=size, mode="bilinear", align_corners=False, antialias=True).to(images.dtype)
