"""The model's normalisation, read from its preprocessing and undone for drawing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["denormalize", "normalization_of"]


def normalization_of(preprocess) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The (mean, std) a preprocessing pipeline normalises with.

    Reads torchvision's ``weights.transforms()`` and ``Normalize`` (also inside a
    ``Compose``), timm's data config dict, or anything with ``mean`` and ``std`` attributes.

    >>> from torchvision import transforms
    >>> normalization_of(transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)]))
    ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    """
    if isinstance(preprocess, Mapping) and "mean" in preprocess and "std" in preprocess:
        return tuple(map(float, preprocess["mean"])), tuple(map(float, preprocess["std"]))
    if hasattr(preprocess, "mean") and hasattr(preprocess, "std"):
        return tuple(map(float, preprocess.mean)), tuple(map(float, preprocess.std))
    for step in getattr(preprocess, "transforms", []):
        try:
            return normalization_of(step)
        except ValueError:
            continue
    raise ValueError(f"cannot find mean and std in {type(preprocess).__name__}; pass them to denormalize() yourself")


def denormalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Undo ``Normalize(mean, std)`` on (C, H, W) or (N, C, H, W) tensors, clamped to [0, 1].

    >>> denormalize(torch.zeros(3, 1, 1), [0.5] * 3, [0.5] * 3).flatten().tolist()
    [0.5, 0.5, 0.5]
    """
    mean_t = torch.as_tensor(mean, dtype=images.dtype, device=images.device).reshape(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=images.dtype, device=images.device).reshape(-1, 1, 1)
    channels = images.shape[-3]
    if mean_t.shape[0] not in (1, channels) or std_t.shape[0] not in (1, channels):
        raise ValueError(f"mean and std need 1 or {channels} values, got {len(mean_t)} and {len(std_t)}")
    return (images.detach() * std_t + mean_t).clamp(0.0, 1.0)
