"""Where the objects are, for the localisation metrics: boxes from a CSV file or masks from
a folder of images, as one boolean mask per image at the model input's size."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from ..images import READABLE_EXTENSIONS, ImageError, load_rgb
from ..regions import region_masks
from ..text_files import csv_records

__all__ = ["BOX_FIELDS", "read_regions"]

#: Columns of a regions CSV: the image, then a box in pixels of the model input.
BOX_FIELDS = ("image", "x0", "y0", "x1", "y1")


def read_regions(
    source: str | os.PathLike,
    images: Sequence[str],
    size: tuple[int, int],
    resize: Callable[[Image.Image], Image.Image] | None = None,
) -> list[Tensor | None]:
    """One boolean mask (H, W) = ``size`` per image in ``images`` (paths), ``None`` where
    ``source`` has no region for it.

    ``source`` is either a CSV file with the header ``image,x0,y0,x1,y1``, one box per row
    in pixels of the model input (after resizing and cropping: the H x W the maps have),
    several rows of one image united; ``image`` is the image's path as given, its file
    name, or its stem. Or a folder of masks named by the images' stems (``cat.png`` for
    ``photos/cat.jpg``), any non-zero pixel inside the object: a mask of size H x W is used
    as it is, any other goes through ``resize`` (the images' own resizing and cropping).
    A malformed file raises ``ValueError`` naming the file and line.
    """
    path = Path(source)
    if path.is_dir():
        masks: dict[str, Path] = {}
        for candidate in sorted(path.iterdir()):
            if candidate.suffix.lower() in READABLE_EXTENSIONS and candidate.is_file():
                masks.setdefault(candidate.stem, candidate)
        return [_mask_of(masks.get(Path(image).stem), size, resize) for image in images]
    boxes = _read_boxes(path)
    out = []
    for image in images:
        keys = (image, Path(image).name, Path(image).stem)
        found = next((boxes[key] for key in keys if key in boxes), None)
        out.append(None if found is None else region_masks(torch.tensor(found), size).any(0))
    return out


def _read_boxes(path: Path) -> dict[str, list[list[float]]]:
    what, hint = f"regions file {path}", f"give a CSV file with the header {','.join(BOX_FIELDS)}"
    boxes: dict[str, list[list[float]]] = {}
    try:
        records = csv_records(path, what, hint)
        first = next(records, None)
        if first is None or [cell.strip().lower() for cell in first[1]] != list(BOX_FIELDS):
            raise ValueError(f"{path}: the first line must be the header {','.join(BOX_FIELDS)}")
        for number, line in records:
            if any(cell.strip() for cell in line):
                boxes.setdefault(line[0].strip(), []).append(_box(path, number, line))
    except OSError as error:
        raise ValueError(f"cannot read regions file {path}: {error.strerror or error}") from None
    return boxes


def _box(path: Path, number: int, line: list[str]) -> list[float]:
    """The box of one line of a regions file."""
    try:
        if len(line) != len(BOX_FIELDS):
            raise ValueError
        x0, y0, x1, y1 = (float(cell) for cell in line[1:])
        if not (x0 <= x1 and y0 <= y1) or not np.isfinite([x0, y0, x1, y1]).all():
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{path}, line {number}: expected image,x0,y0,x1,y1 with x0 <= x1 and y0 <= y1 in pixels, "
            f"got {','.join(line)!r}"
        ) from None
    return [x0, y0, x1, y1]


def _mask_of(path: Path | None, size: tuple[int, int], resize) -> Tensor | None:
    if path is None:
        return None
    try:
        mask = load_rgb(path).convert("L")
    except ImageError as error:
        raise ValueError(f"mask {path}: {error}") from None
    mask = mask.point(lambda value: 255 if value else 0)
    if mask.size != (size[1], size[0]):
        if resize is None:
            raise ValueError(
                f"mask {path} is {mask.size[0]}x{mask.size[1]}; make it {size[1]}x{size[0]} (the model input's size)"
            )
        mask = resize(mask)
        if mask.size != (size[1], size[0]):
            raise ValueError(
                f"mask {path} is {mask.size[0]}x{mask.size[1]} after resizing and cropping "
                f"like the images, not {size[1]}x{size[0]}"
            )
    return torch.from_numpy(np.asarray(mask) > 127)
