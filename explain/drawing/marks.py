"""What is drawn on top of an overlay: boxes with captions, and a region's outline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import matplotlib
import numpy as np
from matplotlib.colors import ListedColormap
from PIL import Image
from torch import Tensor

from .pictures import to_rgb

__all__ = ["BOX_COLOURS", "draw_boxes", "draw_outline"]

#: Colours of boxes, one per box in turn (matplotlib's tab10, as uint8 RGB).
BOX_COLOURS = tuple(
    tuple(round(255 * c) for c in colour.tolist())
    for colour in np.asarray(cast(ListedColormap, matplotlib.colormaps["tab10"]).colors)
)


def draw_boxes(
    image,
    boxes,
    labels: Sequence[str] | None = None,
    *,
    colours: Sequence[tuple[int, int, int]] | None = None,
    width: int = 2,
) -> np.ndarray:
    """Draw boxes, and a caption above each one, on a copy of an image; returns (H, W, 3) uint8.

    ``boxes`` is (K, 4) as ``(x0, y0, x1, y1)`` in pixels (pixel edges, as torchvision's
    detectors give them): the outline runs along the pixels just inside, ``width`` pixels
    wide. ``labels`` are K captions (or ``None`` for none), written on a band of the box's
    colour above it (inside it at the top of the image). Box k takes ``colours[k]``, by
    default the tab10 colours in turn.

    >>> out = draw_boxes(np.zeros((6, 8, 3), np.uint8), [[1, 1, 5, 4]], colours=[(255, 0, 0)], width=1)
    >>> out[1, 1:5, 0].tolist(), out[2, 2:4, 0].tolist()   # the top edge, and the inside
    ([255, 255, 255, 255], [0, 0])
    """
    from PIL import ImageDraw, ImageFont

    picture = Image.fromarray(np.round(to_rgb(image) * 255).astype(np.uint8))
    boxes = np.asarray(boxes.detach().cpu() if isinstance(boxes, Tensor) else boxes, dtype=np.float64).reshape(-1, 4)
    if labels is not None and len(labels) != len(boxes):
        raise ValueError(f"got {len(labels)} labels for {len(boxes)} boxes; give one label per box, or none")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}")
    colours = list(colours) if colours is not None else [BOX_COLOURS[k % len(BOX_COLOURS)] for k in range(len(boxes))]
    if len(colours) < len(boxes):
        raise ValueError(f"got {len(colours)} colours for {len(boxes)} boxes")
    draw = ImageDraw.Draw(picture)
    size = max(10, round(min(picture.size) / 28))
    try:
        font = ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow without FreeType: the small bitmap font
        font = ImageFont.load_default()
    for k, (x0, y0, x1, y1) in enumerate(boxes):
        colour = tuple(int(c) for c in colours[k])
        corners = [round(x0), round(y0), max(round(x0), round(x1) - 1), max(round(y0), round(y1) - 1)]
        draw.rectangle(corners, outline=colour, width=width)
        if labels is not None and labels[k]:
            left, top, right, bottom = draw.textbbox((0, 0), str(labels[k]), font=font)
            band = bottom - top + 2
            y = corners[1] - band if corners[1] >= band else corners[1]
            draw.rectangle([corners[0], y, corners[0] + right - left + 3, y + band - 1], fill=colour)
            light = sum(colour) > 3 * 150
            draw.text(
                (corners[0] + 2 - left, y + 1 - top),
                str(labels[k]),
                fill=(0, 0, 0) if light else (255, 255, 255),
                font=font,
            )
    return np.asarray(picture).copy()


def draw_outline(image, mask, colour: tuple[int, int, int] = (255, 255, 255)) -> np.ndarray:
    """Draw the border of a region on a copy of an image: the pixels of the boolean ``mask``
    (H, W) with a 4-neighbour outside it (or on the image's edge). A mask of another size is
    resized to the image (nearest). Returns (H, W, 3) uint8.

    >>> mask = np.zeros((4, 4), bool); mask[1:4, 1:4] = True
    >>> draw_outline(np.zeros((4, 4, 3), np.uint8), mask)[..., 0].tolist()
    [[0, 0, 0, 0], [0, 255, 255, 255], [0, 255, 0, 255], [0, 255, 255, 255]]
    """
    out = np.round(to_rgb(image) * 255).astype(np.uint8)
    mask = np.asarray(mask.detach().cpu() if isinstance(mask, Tensor) else mask)
    while mask.ndim > 2 and mask.shape[0] == 1:
        mask = mask[0]
    if mask.ndim != 2 or mask.dtype != np.bool_:
        raise ValueError(f"the outline is a boolean (H, W) mask, got {mask.dtype} of shape {mask.shape}")
    if mask.shape != out.shape[:2]:
        mask = np.asarray(Image.fromarray(mask).resize(out.shape[1::-1], Image.Resampling.NEAREST))
    padded = np.pad(mask, 1, constant_values=False)
    inside = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    out[mask & ~inside] = colour
    return out
