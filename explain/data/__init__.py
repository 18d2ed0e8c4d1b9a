"""Data that installs with the package: generated benchmarks with a known answer.

- :mod:`~explain.data.shortcuts`: a synthetic image set of four drawn shapes in which one
  class carries a planted shortcut (a small checkerboard mark) in most training images,
  with a mask of the mark per image, and a small CNN trained on it (its weights ship with
  the package): the ground truth that concept methods are tested against.
"""

from .shortcuts import (
    CLASSES,
    MEAN,
    SHORTCUT_CLASS,
    STD,
    ShortcutCNN,
    ShortcutSet,
    load_shortcut_model,
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
    "shortcut_dataset",
]
