"""What a model takes: images, volumes and videos, or signals (:func:`input_kind`), read from
its name (torchvision's video classifiers) or its first convolution; and a blank example
input of that kind for the checks a run makes before it reads any file."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..checks import model_spatial_dims
from ..options import VIDEO_MODELS

__all__ = ["EXAMPLE_SIDES", "INPUT_KIND_NAMES", "blank_example", "input_kind", "scaled_frames"]

#: The kinds of input, by spatial dimensions.
INPUT_KIND_NAMES = {1: "signals", 2: "images", 3: "volumes"}
#: The sides of the blank example of a model file of volumes or signals: even, so that
#: U-Nets and strided layers divide them, and small, so that the checks are quick.
EXAMPLE_SIDES = {"volumes": (16, 64, 64), "signals": (256,)}
#: The frames of a video model's blank example.
EXAMPLE_FRAMES = 8


def input_kind(model: nn.Module, name: str = "") -> str:
    """``"volumes"`` for torchvision's video models (by ``name``) and models whose first
    convolution is 3-D, ``"signals"`` where it is 1-D, ``"images"`` otherwise."""
    if name in VIDEO_MODELS:
        return "volumes"
    return INPUT_KIND_NAMES.get(model_spatial_dims(model) or 2, "images")


def blank_example(model: nn.Module, kind: str, preprocess, device: torch.device) -> Tensor:
    """A batch of one blank input of ``kind`` for ``model``: a grey clip of
    :data:`EXAMPLE_FRAMES` frames through ``preprocess`` for a torchvision video model
    (``preprocess`` not None), else zeros of :data:`EXAMPLE_SIDES` with the channels its first
    convolution takes."""
    if preprocess is not None:
        frames = torch.full((EXAMPLE_FRAMES, 3, 128, 171), 120, dtype=torch.uint8)
        return preprocess(frames).unsqueeze(0).to(device)
    first = next(m for m in model.modules() if isinstance(m, (nn.Conv1d, nn.Conv3d)))
    return torch.zeros(1, first.in_channels, *EXAMPLE_SIDES[kind], device=device)


def scaled_frames(frames: Tensor) -> Tensor:
    """Video frames (T, C, H, W) uint8 as the (C, T, H, W) float input in [0, 1] of a model
    file, which says nothing about its normalisation."""
    return frames.permute(1, 0, 2, 3).float().div(255)
