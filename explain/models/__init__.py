"""Models to explain, loaded by name or from a file, with their preprocessing and class names.

- ``classifiers``: the bundled offline EfficientNet-Lite0, torchvision and
  timm classifiers, and Hugging Face image classifiers saved in a local folder (:func:`load`);
- ``dense``: torchvision's segmentation and detection models
  (:func:`load_task_model`);
- ``files``: state dicts, ``torch.export`` programs and pickled modules;
- ``loaded``: what the command line loads from ``--model`` and
  ``--weights`` (:func:`load_model`, a :class:`LoadedModel`).

>>> from explain import models
>>> model, preprocess, class_names = models.load("efficientnet_lite0")  # doctest: +SKIP
>>> vit, preprocess, class_names = models.load("timm:vit_small_patch16_224", "vit.safetensors")  # doctest: +SKIP
"""

from ..imagenet import IMAGENET_MEAN, IMAGENET_STD
from .classifiers import (
    BUNDLED,
    TIMM_PREFIX,
    Preprocess,
    huggingface_preprocess,
    imagenet_classes,
    imagenet_preprocess,
    is_bundled,
    is_huggingface_folder,
    load,
)
from .dense import load_task_model, preprocess_for
from .files import MODEL_FILE_SUFFIXES, read_model_file, read_state_dict
from .loaded import LoadedModel, load_model, pick_device, warn_if_random

__all__ = [
    "BUNDLED",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MODEL_FILE_SUFFIXES",
    "TIMM_PREFIX",
    "LoadedModel",
    "Preprocess",
    "huggingface_preprocess",
    "imagenet_classes",
    "imagenet_preprocess",
    "is_bundled",
    "is_huggingface_folder",
    "load",
    "load_model",
    "load_task_model",
    "pick_device",
    "preprocess_for",
    "read_model_file",
    "read_state_dict",
    "warn_if_random",
]
