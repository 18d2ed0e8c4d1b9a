"""Data that installs with the package.

- :mod:`~explain.data.samples`: two sample photos (a cup of espresso, a cat), so that the
  quickstart, the docstrings and the tutorials run from any folder.

>>> from explain import data
>>> data.sample_names()
['chelsea', 'coffee']
>>> x = data.sample_image("coffee")  # a PIL image, for a model's preprocess
"""

from .samples import sample_folder, sample_image, sample_names, sample_path

__all__ = ["sample_folder", "sample_image", "sample_names", "sample_path"]
