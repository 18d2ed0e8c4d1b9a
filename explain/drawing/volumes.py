"""Volumes and videos: a grid of overlaid slices (axial: along D; for a video, its frames),
overlaid frames, and an animated GIF of them (imageio's Pillow writer, no external binary)."""

from __future__ import annotations

import math

import numpy as np

from .overlays import as_map, blend, fitted_map
from .pictures import to_rgb

__all__ = ["encode_gif", "overlay_frames", "overlay_slices", "slice_pictures"]

#: The most slices a grid shows by default: evenly spaced through the volume.
MAX_SLICES = 16
#: White between the tiles of a grid, in pixels.
GAP = 2


def slice_pictures(volume) -> np.ndarray:
    """A volume or video as (D, H, W, 3) float32 RGB slices in [0, 1].

    Reads (D, H, W) grey, (D, H, W, C) channels-last (video frames as imageio decodes them)
    and (C, D, H, W) channels-first (the model's layout) with C in 1, 3, 4; each slice as
    :func:`~explain.drawing.to_rgb` reads images (uint8, or float in [0, 1]).

    >>> slice_pictures(np.zeros((3, 5, 4, 6), np.uint8)).shape   # (C, D, H, W)
    (5, 4, 6, 3)
    """
    array = np.asarray(volume.detach().cpu() if hasattr(volume, "detach") else volume)
    if array.ndim == 4 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)
    if array.ndim not in (3, 4):
        raise ValueError(
            f"a volume is (D, H, W), (D, H, W, C) or (C, D, H, W) with C in 1, 3, 4; got shape {array.shape}"
        )
    return np.stack([to_rgb(picture) for picture in array])


def overlay_frames(volume, heatmap, cmap=None, alpha: float = 0.5, *, signed: bool | None = None) -> np.ndarray:
    """Each slice (or frame) of ``volume`` with its slice of ``heatmap`` (D, H, W) blended
    over it: (D, H, W, 3) uint8. The map is scaled as a whole (slices compare) and resized
    to the frames where its (H, W) differ; its D must be the volume's.

    >>> frames = overlay_frames(np.zeros((2, 4, 4), np.uint8), np.ones((2, 4, 4)), alpha=1.0)
    >>> frames.shape, frames[0, 0, 0].tolist()   # jet at 1.0 is dark red
    ((2, 4, 4, 3), [128, 0, 0])
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    pictures = slice_pictures(volume)
    heat, signed = as_map(heatmap, signed, dims=3)
    if heat.shape[0] != len(pictures):
        raise ValueError(f"the map has {heat.shape[0]} slices and the volume {len(pictures)}; give one map per slice")
    height, width = pictures.shape[1:3]
    return np.stack(
        [
            blend(picture, fitted_map(slice_, signed, height, width), signed, cmap, alpha)
            for picture, slice_ in zip(pictures, heat, strict=True)
        ]
    )


def overlay_slices(
    volume,
    heatmap,
    cmap=None,
    alpha: float = 0.5,
    *,
    signed: bool | None = None,
    slices: int | None = MAX_SLICES,
    columns: int | None = None,
) -> np.ndarray:
    """A grid of overlaid slices of a volume (axial: along its first axis D) or frames of a
    video, row by row: (H', W', 3) uint8, tiles apart by a white gap.

    ``slices`` is the most tiles shown (evenly spaced, the first and last included; ``None``:
    all); ``columns`` defaults to a square-ish grid. See :func:`overlay_frames` for
    ``volume``, ``heatmap`` and the colours.

    >>> grid = overlay_slices(np.zeros((4, 8, 8), np.uint8), np.ones((4, 8, 8)))
    >>> grid.shape   # 2 x 2 tiles of 8 x 8, 2 pixels apart
    (18, 18, 3)
    """
    frames = overlay_frames(volume, heatmap, cmap, alpha, signed=signed)
    if slices is not None and len(frames) > slices:
        frames = frames[np.linspace(0, len(frames) - 1, slices).round().astype(int)]
    columns = columns or math.ceil(math.sqrt(len(frames)))
    rows = math.ceil(len(frames) / columns)
    height, width = frames.shape[1:3]
    grid = np.full((rows * (height + GAP) - GAP, columns * (width + GAP) - GAP, 3), 255, np.uint8)
    for k, frame in enumerate(frames):
        top, left = (k // columns) * (height + GAP), (k % columns) * (width + GAP)
        grid[top : top + height, left : left + width] = frame
    return grid


def encode_gif(frames: np.ndarray, fps: float = 8.0) -> bytes:
    """(T, H, W, 3) uint8 frames as an animated GIF that loops, ``fps`` frames a second.

    >>> data = encode_gif(np.zeros((2, 4, 4, 3), np.uint8))
    >>> data[:6]
    b'GIF89a'
    """
    import imageio.v3 as iio

    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    return iio.imwrite("<bytes>", np.asarray(frames, np.uint8), extension=".gif", duration=1000 / fps, loop=0)
