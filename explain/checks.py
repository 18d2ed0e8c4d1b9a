"""Checks of arguments and inputs whose errors say how to fix them: a batch of images (or
volumes, videos, signals) for a model, the channels a model's first convolution expects,
counts and numbers of options; and the shape helpers that let the methods work on any
number of spatial dimensions (:func:`spatial_dims`, :func:`spatial_axes`,
:func:`interpolation_mode`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = [
    "INPUT_KINDS",
    "channel_hint",
    "check_images",
    "checked_number",
    "interpolation_mode",
    "model_spatial_dims",
    "positive_int",
    "spatial_axes",
    "spatial_dims",
]

#: What an input with 1, 2 or 3 spatial dimensions is, and its shape.
INPUT_KINDS = {1: ("signals", "(N, C, L)"), 2: ("images", "(N, C, H, W)"), 3: ("volumes", "(N, C, D, H, W)")}
_CONVOLUTIONS = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}
_INTERPOLATION = {1: "linear", 2: "bilinear", 3: "trilinear"}


def spatial_dims(images: Tensor) -> int:
    """The spatial dimensions of a batch: 1 for signals (N, C, L), 2 for images
    (N, C, H, W), 3 for volumes and videos (N, C, D, H, W).

    >>> spatial_dims(torch.zeros(2, 3, 8, 32, 32))
    3
    """
    return images.dim() - 2


def spatial_axes(tensor: Tensor) -> tuple[int, ...]:
    """The axes after (N, C) of an (N, C, ...) tensor: what a CAM averages or sums over.

    >>> spatial_axes(torch.zeros(1, 4, 7, 7))
    (2, 3)
    """
    return tuple(range(2, tensor.dim()))


def interpolation_mode(spatial: int) -> str:
    """``F.interpolate``'s mode for maps of ``spatial`` dimensions: linear, bilinear, trilinear."""
    return _INTERPOLATION[spatial]


def model_spatial_dims(model: nn.Module) -> int | None:
    """The spatial dimensions the model's first convolution works on (1, 2 or 3), or None
    for a model without one."""
    return next((spatial for module in model.modules() if (spatial := _convolution_dims(module))), None)


def _convolution_dims(module: nn.Module) -> int | None:
    return next((spatial for kind, spatial in _CONVOLUTIONS.items() if isinstance(module, kind)), None)


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
    """Validate a batch for ``model`` and return it detached; errors say how to fix it.

    A batch is (N, C, H, W) images, (N, C, D, H, W) volumes or videos, or (N, C, L)
    signals; where the model's first convolution is 1-, 2- or 3-D, the batch must match it.
    """
    if not isinstance(images, Tensor):
        raise TypeError(
            f"images must be a torch.Tensor of shape (N, C, H, W), got {type(images).__name__}; "
            "turn a PIL image into a batch with preprocess(image).unsqueeze(0)"
        )
    _check_rank(images, model)
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


def check_finite_output(output, method: str) -> None:
    """``ValueError`` where the model's ``output`` (a tensor, or the tensors of a dict, tuple,
    list or Hugging Face output) holds NaN or infinite values: there is no score to explain,
    and what compares outputs (LRP's check of its canonical form, Ablation-CAM's replay)
    would fail on NaN tolerances instead of saying so.

    >>> check_finite_output(torch.full((2, 3), float("nan")), "LRP")
    Traceback (most recent call last):
    ...
    ValueError: LRP: the model's output is NaN or infinite for every image, so there is no score to explain; check the model's weights and the images (a float16 model that overflowed explains in float32)
    """  # noqa: E501 -- the doctest's expected output is one line
    from torch.utils._pytree import tree_flatten

    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, Tensor) and t.is_floating_point() and t.numel()]
    bad = [~torch.isfinite(t.detach()) for t in tensors]
    if not any(b.any() for b in bad):
        return
    rows = [b.reshape(len(b), -1).any(dim=1) if b.dim() else b.reshape(1) for b in bad]
    every = all(r.all() for r in rows) and len({len(r) for r in rows}) == 1
    which = "for every image" if every else f"for {int(max(r.sum() for r in rows))} of the images"
    raise ValueError(
        f"{method}: the model's output is NaN or infinite {which}, so there is no score to explain; "
        "check the model's weights and the images (a float16 model that overflowed explains in float32)"
    )


def _check_rank(images: Tensor, model: nn.Module) -> None:
    """The batch's rank against the model's first convolution, each mistake with its fix. A
    model without convolutions takes images and volumes (a 3-D batch is a single image)."""
    shape, rank = tuple(images.shape), images.dim()
    expected = model_spatial_dims(model)
    if expected is None:
        expected = 3 if rank == 5 else 2
    if rank == expected + 2 or any(_convolution_dims(m) == rank - 2 for m in model.modules()):
        return  # (a model with convolutions of several ranks is trusted with any of them)
    layout = INPUT_KINDS[expected][1]
    if rank == expected + 1 and expected == 1:
        raise ValueError(
            f"images has shape {shape}, signals without a channel dimension (the model's first convolution is "
            "1-D and takes (N, C, L)); add the channel dimension with x.unsqueeze(1)"
        )
    if rank == expected + 1 and expected == 2:
        raise ValueError(f"images has shape {shape}, a single image; add the batch dimension with images.unsqueeze(0)")
    if rank == expected + 1:
        raise ValueError(
            f"images has shape {shape}, a single volume or video (C, D, H, W) for a model whose first "
            "convolution is 3-D; add the batch dimension with x.unsqueeze(0) (or, for a batch without "
            "channels, the channel dimension with x.unsqueeze(1))"
        )
    raise ValueError(
        f"images must have shape {layout} for this model ({INPUT_KINDS[expected][0]}), got {shape}"
        + (f"; its first convolution is {expected}-D" if model_spatial_dims(model) else "")
    )


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
        fix = (
            "convert the images (PIL: image.convert('RGB')) before preprocessing"
            if images.dim() == 4
            else f"give inputs with {match[1]} channel(s) (C, the axis after N)"
        )
        raise ValueError(
            f"images have {match[2]} channel(s) but the model's first convolution expects {match[1]}; {fix}"
        ) from error
