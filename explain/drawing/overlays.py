"""Heatmap overlays: a map, colour-mapped and blended over the picture it explains."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .marks import draw_boxes, draw_outline
from .pictures import to_rgb

__all__ = ["as_map", "blend", "fitted_map", "overlay"]


def as_map(heatmap, signed: bool | None = None, dims: int = 2) -> tuple[np.ndarray, bool]:
    """The map as a float32 array of ``dims`` dimensions (2: (H, W); 3: a volume's
    (D, H, W); 1: a signal's (L,)) in [0, 1], or in [-1, 1] when signed (by default: when it
    holds negative values), and whether it is signed. A volume is scaled as a whole, so
    that its slices compare."""
    # numpy, not torch: the CLI overlays from several threads at once, and torch would start
    # a thread team for each of them that competes with the model's threads.
    if isinstance(heatmap, Tensor):
        heatmap = heatmap.detach().cpu().float().numpy()
    if not isinstance(heatmap, np.ndarray):
        raise TypeError(f"the map must be a tensor or an array, got {type(heatmap).__name__}")
    heatmap = heatmap.astype(np.float32, copy=False)
    while heatmap.ndim > dims and heatmap.shape[0] == 1:
        heatmap = heatmap[0]
    if heatmap.ndim != dims:
        shape = {1: "1-D (L,)", 2: "2-D (H, W)", 3: "3-D (D, H, W)"}[dims]
        raise ValueError(f"the map must be {shape}, got shape {tuple(heatmap.shape)}; pick one map, e.g. res.maps[0]")
    if not np.isfinite(heatmap).all():
        raise ValueError("the map contains NaN or infinite values")
    low, high = heatmap.min(), heatmap.max()
    if signed is None:
        signed = bool(low < 0)
    if signed:
        peak = max(-low, high)
        return (heatmap / peak if peak > 1 else heatmap), True
    if low < 0 or high > 1:
        heatmap = (heatmap - low) / (high - low) if high > low else np.zeros_like(heatmap)
    return heatmap, False


def fitted_map(heat: np.ndarray, signed: bool, height: int, width: int) -> np.ndarray:
    """The map resized (bilinear) to the image's size where it differs, with a warning where
    the aspect ratios differ too (stacklevel: the caller of :func:`overlay`)."""
    if tuple(heat.shape) != (height, width):
        if abs(heat.shape[0] / heat.shape[1] - height / width) > 0.02 * height / width:
            warnings.warn(
                f"the map ({heat.shape[0]}x{heat.shape[1]}) and the image ({height}x{width}) have "
                "different aspect ratios, so the map is stretched; overlay it on the image the "
                "model saw (after resizing and cropping), e.g. explain.denormalize(x, mean, std)",
                stacklevel=3,
            )
        resized = F.interpolate(
            torch.from_numpy(heat)[None, None], size=(height, width), mode="bilinear", align_corners=False
        )
        heat = resized[0, 0].clamp(-1.0 if signed else 0.0, 1.0).numpy()
    return heat


def blend(rgb: np.ndarray, heat: np.ndarray, signed: bool, cmap, alpha: float) -> np.ndarray:
    """The colour-mapped map blended over the float RGB image, as (H, W, 3) uint8; a signed
    map's weight scales with each pixel's magnitude."""
    if cmap is None:
        cmap = "RdBu_r" if signed else "jet"
    colormap = matplotlib.colormaps[cmap] if isinstance(cmap, str) else cmap
    if signed:
        colours = colormap((heat + 1.0) / 2.0)[..., :3].astype(np.float32)
        weight = alpha * np.abs(heat)[..., None]
    else:
        colours = colormap(heat)[..., :3].astype(np.float32)
        weight = alpha
    blended = (1.0 - weight) * rgb + weight * colours
    return np.round(blended * 255.0).astype(np.uint8)


def overlay(
    image,
    heatmap,
    cmap: str | matplotlib.colors.Colormap | None = None,
    alpha: float = 0.5,
    *,
    signed: bool | None = None,
    boxes=None,
    labels: Sequence[str] | None = None,
    outline=None,
) -> np.ndarray:
    """Blend a colour-mapped heatmap over an image; returns (H, W, 3) uint8 RGB.

    Parameters
    ----------
    image:
        Anything :func:`to_rgb` reads (PIL, numpy, tensor; uint8 or float; grey, RGB, RGBA).
    heatmap:
        A 2-D map, e.g. ``res.maps[0]``. Values in [0, 1] are used as they are, others are
        min-max scaled. It is resized (bilinear) to the image when their sizes differ.
    cmap:
        A matplotlib colormap or its name; by default ``"jet"``, and the diverging
        ``"RdBu_r"`` for signed maps.
    alpha:
        Weight of the heatmap: 0 shows the image only, 1 the heatmap only. For signed maps
        it is scaled by each pixel's magnitude, so that where the evidence is zero the image
        shows through.
    signed:
        Show the map with its sign: values in [-1, 1] (others are divided by the largest
        magnitude), zero at the colormap's centre, positive evidence red and negative blue
        by default. ``None`` (default): signed when the map holds negative values, as
        ``Explanation.maps`` do where ``Explanation.signed``.
    boxes, labels:
        Boxes ``(x0, y0, x1, y1)`` in image pixels, and their captions, drawn on top (see
        ``explain.drawing.draw_boxes``): the detections a map explains.
    outline:
        A boolean mask whose border is drawn on top (see ``explain.drawing.draw_outline``): the
        region a segmentation map explains.

    Examples
    --------
    >>> out = overlay(np.zeros((4, 6, 3), np.uint8), torch.ones(2, 3), alpha=1.0)
    >>> out.shape, out.dtype, out[0, 0].tolist()   # jet at 1.0 is dark red
    ((4, 6, 3), dtype('uint8'), [128, 0, 0])
    >>> signed = overlay(np.zeros((1, 2, 3), np.uint8), torch.tensor([[-1.0, 0.0]]), alpha=1.0)
    >>> signed[0, 0].tolist(), signed[0, 1].tolist()   # blue where negative, the image where zero
    ([5, 48, 97], [0, 0, 0])
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    rgb = to_rgb(image)
    heat, signed = as_map(heatmap, signed)
    heat = fitted_map(heat, signed, *rgb.shape[:2])
    out = blend(rgb, heat, signed, cmap, alpha)
    if outline is not None:
        out = draw_outline(out, outline)
    if boxes is not None:
        out = draw_boxes(out, boxes, labels)
    elif labels is not None:
        raise ValueError("labels caption boxes; pass boxes= with them")
    return out
