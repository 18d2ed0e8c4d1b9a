"""Checks of arguments and inputs whose errors say how to fix them: a batch of images for a
model, the channels a model's first convolution expects, counts and numbers of options."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = ["channel_hint", "check_images", "checked_number", "positive_int"]


def positive_int(name: str, value) -> int:
    """``value``, checked to be a positive int (a count such as ``n_samples``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def checked_number(name: str, value, *, positive: bool) -> float:
    """``value`` as a float, checked to be a positive (or non-negative) number.

    >>> checked_number("gamma", 0, positive=False)
    0.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 if positive else value >= 0):
        raise ValueError(f"{name} must be a {'positive' if positive else 'non-negative'} number, got {value!r}")
    return float(value)


def check_images(images: Tensor, model: nn.Module) -> Tensor:
    """Validate a batch for ``model`` and return it detached; errors say how to fix it."""
    if not isinstance(images, Tensor):
        raise TypeError(
            f"images must be a torch.Tensor of shape (N, C, H, W), got {type(images).__name__}; "
            "turn a PIL image into a batch with preprocess(image).unsqueeze(0)"
        )
    if images.dim() == 3:
        raise ValueError(
            f"images has shape {tuple(images.shape)}, a single image; add the batch dimension with images.unsqueeze(0)"
        )
    if images.dim() != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}")
    if images.shape[0] == 0:
        raise ValueError("images is an empty batch")
    if not images.is_floating_point():
        raise TypeError(
            f"images have dtype {images.dtype}; the model expects preprocessed float input "
            "(e.g. the preprocess returned by explain.models.load)"
        )
    reference: Tensor | None = next(iter(model.parameters()), None)
    if reference is None:
        reference = next(iter(model.buffers()), None)
    if reference is not None:
        if reference.device != images.device:
            raise ValueError(
                f"images are on {images.device} but the model is on {reference.device}; "
                f"move them with images.to('{reference.device}')"
            )
        if reference.is_floating_point() and reference.dtype != images.dtype:
            raise ValueError(
                f"images are {images.dtype} but the model's weights are {reference.dtype}; "
                f"cast them with images.to({reference.dtype})"
            )
    if not torch.isfinite(images).all():
        raise ValueError("images contain NaN or infinite values")
    return images.detach()


_CHANNEL_ERROR = re.compile(r"expected input\[[^\]]*\] to have (\d+) channels, but got (\d+) channels")


@contextmanager
def channel_hint(images: Tensor) -> Iterator[None]:
    """Around a forward pass: the model's own error for images with the wrong number of
    channels becomes a ``ValueError`` that names the fix.

    (The first convolution to run is what counts, which need not be the first registered,
    so this is not checked before the forward pass.)

    >>> import torchvision
    >>> images = torch.zeros(1, 1, 32, 32)
    >>> with channel_hint(images):
    ...     torchvision.models.resnet18()(images)
    Traceback (most recent call last):
    ValueError: images have 1 channel(s) but the model's first convolution expects 3; convert the images (PIL: image.convert('RGB')) before preprocessing
    """  # noqa: E501 -- the doctest's expected output is one line
    try:
        yield
    except RuntimeError as error:
        match = _CHANNEL_ERROR.search(str(error))
        if match is None or int(match[2]) != images.shape[1]:
            raise
        raise ValueError(
            f"images have {match[2]} channel(s) but the model's first convolution expects "
            f"{match[1]}; convert the images (PIL: image.convert('RGB')) before preprocessing"
        ) from error
