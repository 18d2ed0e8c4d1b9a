"""Data that installs with the package.

- :mod:`~explain.data.samples`: two sample photos (a cup of espresso, a cat), so that the
  quickstart, the docstrings and the tutorials run from any folder.
- :mod:`~explain.data.shortcuts`: a synthetic image set of four drawn shapes in which one
  class carries a planted shortcut (a small checkerboard mark) in most training images,
  with a mask of the mark per image, and a small CNN trained on it (its weights ship with
  the package): the ground truth that concept methods are tested against.

>>> from explain import data
>>> data.sample_names()
['chelsea', 'coffee']
>>> x = data.sample_image("coffee")  # a PIL image, for a model's preprocess
"""

from .samples import sample_folder, sample_image, sample_names, sample_path
from .shortcuts import (
    CLASSES,
    MEAN,
    SHORTCUT_CLASS,
    STD,
    ShortcutCNN,
    ShortcutSet,
    load_shortcut_model,
    mark_images,
    shortcut_dataset,
)

__all__ = [
    "CLASSES",
    "MEAN",
    "SHORTCUT_CLASS",
    "STD",
    "ShortcutCNN",
    "ShortcutSet",
    "load_shortcut_model",
    "mark_images",
    "sample_folder",
    "sample_image",
    "sample_names",
    "sample_path",
    "shortcut_dataset",
]
