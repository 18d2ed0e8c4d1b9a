"""Reading pictures to draw on: any common image form as float RGB (:func:`to_rgb`)."""

from __future__ import annotations

import numpy as np
from PIL import Image
from torch import Tensor

from ..images import to_rgb8

__all__ = ["to_rgb"]


def to_rgb(image) -> np.ndarray:
    """Any common image form as an (H, W, 3) float32 RGB array in [0, 1].

    Accepts a PIL image in any mode, or a numpy array / torch tensor laid out (H, W),
    (H, W, C) or (C, H, W) with C in 1, 3, 4; uint8 / uint16 or float in [0, 1]. Alpha is
    composited onto white; grey is repeated to three channels.

    >>> to_rgb(np.zeros((2, 3), dtype=np.uint8)).shape
    (2, 3, 3)
    """
    if isinstance(image, Image.Image):
        image = np.asarray(to_rgb8(image))
    if isinstance(image, Tensor):
        image = image.detach().cpu()
        image = (image.float() if image.is_floating_point() else image).numpy()
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(
            f"cannot read an image of shape {array.shape}; expected (H, W), (H, W, C) or (C, H, W) with C in 1, 3, 4"
        )
    rgb = _to_unit_float(array)
    if rgb.shape[-1] == 4:
        alpha = rgb[..., 3:]
        rgb = rgb[..., :3] * alpha + (1.0 - alpha)
    elif rgb.shape[-1] == 1:
        rgb = np.repeat(rgb, 3, axis=-1)
    return np.ascontiguousarray(rgb, dtype=np.float32)


def _to_unit_float(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.bool_:
        return array.astype(np.float32)
    if array.dtype == np.uint8:
        return array.astype(np.float32) / 255.0
    if array.dtype == np.uint16:
        return array.astype(np.float32) / 65535.0
    if np.issubdtype(array.dtype, np.integer):
        smallest, largest = int(array.min()), int(array.max())
        if smallest < 0 or largest > 65535:
            raise ValueError(
                f"integer image values must lie in 0..255 (8-bit) or 0..65535 (16-bit), got {smallest}..{largest}"
            )
        return array.astype(np.float32) / (255.0 if largest <= 255 else 65535.0)
    array = array.astype(np.float32)
    if not np.isfinite(array).all():
        raise ValueError("image contains NaN or infinite values")
    low, high = float(array.min()), float(array.max())
    if low < -1e-3 or high > 1 + 1e-3:
        hint = (
            "it looks normalised for the model: undo that with explain.denormalize(x, mean, std)"
            if low < 0
            else "divide by 255 or pass a uint8 image"
        )
        raise ValueError(f"float image values must lie in [0, 1], got {low:.3g}..{high:.3g}; {hint}")
    return array.clip(0.0, 1.0)
