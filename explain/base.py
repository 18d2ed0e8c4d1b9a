"""What every explainer shares: the :class:`Explainer` base class, :class:`NotApplicable`,
and the method registry that :func:`register` fills (:func:`registered` reads it).

The registry holds what has been registered so far; :mod:`explain.catalogue` lists and
makes the methods by name, with the built-in ones registered."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

import torch
from torch import Tensor, nn

from .explanation import Explanation
from .targets import Targets

__all__ = ["Explainer", "NotApplicable", "check_images", "channel_hint", "method_key", "register", "registered", "registered_class"]

_REGISTRY: dict[str, type[Explainer]] = {}


class NotApplicable(ValueError):
    """The method's definition does not apply to this model (CAM without a linear head over
    a pooled map, attention methods on a model without global self-attention). ``explain run
    --method all`` leaves such methods out instead of failing."""


def method_key(name: str) -> str:
    """The registry's key of a method name: names ignore case, dashes, underscores and spaces.

    >>> method_key("Grad-CAM++")
    'gradcam++'
    """
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


class Explainer:
    """Base class: an explainer is made once per model and called on batches of images.

    Subclasses set ``name`` (the registered method name) and implement ``__call__``, which
    returns an :class:`~explain.Explanation`.
    """

    name: ClassVar[str] = ""
    #: The kind of method, as ``explain methods`` groups them.
    family: ClassVar[str] = ""
    #: Passes through the model per image and target, with the default settings.
    cost: ClassVar[str] = ""
    #: Whether the method explains through a target layer (``target_layer=``).
    needs_layer: ClassVar[bool] = False

    def __init__(self, model: nn.Module, *, class_names: Sequence[str] | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.class_names = list(class_names) if class_names is not None else getattr(model, "class_names", None)

    def __call__(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        raise NotImplementedError

    def check(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> None:
        """Raise now what a call on such images would raise for a mistake in the setup (the
        model, layer or targets); methods whose calls are costly check more cheaply."""
        self(images, targets, topk=topk)

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        """Names of the layers the maps of ``images`` come from (``Explanation.layers``)."""
        return self(images[:1]).layers

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"


def register(cls: type[Explainer]) -> type[Explainer]:
    """Class decorator that makes a method available to :func:`explain.explainer` by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name` to be registered")
    _REGISTRY[method_key(cls.name)] = cls
    return cls


def registered() -> dict[str, type[Explainer]]:
    """The methods registered so far, by name, in the order they were registered. The
    built-in ones register when :mod:`explain.methods` is imported (see
    :mod:`explain.catalogue`, which imports it)."""
    return {cls.name: cls for cls in _REGISTRY.values()}


def registered_class(method: str) -> type[Explainer]:
    """The class registered so far as ``method`` (see :func:`method_key`); a ``ValueError``
    names the closest registered names otherwise."""
    cls = _REGISTRY.get(method_key(method))
    if cls is None:
        close = difflib.get_close_matches(method_key(method), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(_REGISTRY[c].name for c in close)}? " if close else ""
        raise ValueError(f"unknown method {method!r}; {hint}known methods: {', '.join(registered())}")
    return cls


def check_images(images: Tensor, model: nn.Module) -> Tensor:
    """Validate a batch for ``model`` and return it detached; errors say how to fix it."""
    if not isinstance(images, Tensor):
        raise TypeError(
            f"images must be a torch.Tensor of shape (N, C, H, W), got {type(images).__name__}; "
            "turn a PIL image into a batch with preprocess(image).unsqueeze(0)"
        )
    if images.dim() == 3:
        raise ValueError(
            f"images has shape {tuple(images.shape)}, a single image; add the batch dimension "
            "with images.unsqueeze(0)"
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
    reference = next(iter(model.parameters()), None)
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
    """
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
