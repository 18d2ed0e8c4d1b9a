"""Sample photos installed with the package (``photos/`` beside this module), so that every
example runs from any folder.

Two photos from scikit-image's sample data, re-encoded as JPEG (quality 90) to keep the
package small: ``coffee`` (a cup of espresso; Rachel Michetti, courtesy of Pikolo Espresso
Bar, CC0) and ``chelsea`` (Chelsea the cat; Stefan van der Walt, CC0). ``photos/README.md``
says where they come from; the repository's ``data/images/`` holds the originals and two
more photos.

>>> sample_names()
['chelsea', 'coffee']
>>> sample_image("coffee").size
(600, 400)
>>> sample_path("chelsea").name
'chelsea.jpg'

The folder is a command-line input too: ``explain run "$(explain samples)" --out out``.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from ..options import SAMPLE_PHOTOS

__all__ = ["sample_folder", "sample_image", "sample_names", "sample_path"]

_FOLDER = Path(__file__).resolve().parents[1].joinpath(*SAMPLE_PHOTOS)
_SUFFIX = ".jpg"


def sample_folder() -> Path:
    """The folder that holds the sample photos (inside the installed package)."""
    return _FOLDER


def sample_names() -> list[str]:
    """The names :func:`sample_image` takes, sorted."""
    return sorted(path.stem for path in _FOLDER.glob(f"*{_SUFFIX}"))


def sample_path(name: str = "coffee") -> Path:
    """The file of the sample photo called ``name`` (see :func:`sample_names`)."""
    key = Path(str(name)).stem.strip().lower()
    path = _FOLDER / f"{key}{_SUFFIX}"
    if not path.is_file():
        raise ValueError(f"no sample image {name!r}; the samples are: {', '.join(sample_names())}")
    return path


def sample_image(name: str = "coffee") -> Image.Image:
    """The sample photo called ``name`` as an RGB PIL image, ready for a model's
    ``preprocess``.

    >>> import explain
    >>> model, preprocess, class_names = explain.models.load()  # doctest: +SKIP
    >>> x = preprocess(sample_image("coffee")).unsqueeze(0)  # doctest: +SKIP
    """
    with Image.open(sample_path(name)) as image:
        return image.convert("RGB")
