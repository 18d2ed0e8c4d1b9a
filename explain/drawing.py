"""Showing maps: heatmap overlays, a comparison figure, and undoing the model's normalisation."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import cast

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.colors import ListedColormap
from PIL import Image
from torch import Tensor

from .images import to_rgb8

__all__ = ["denormalize", "draw_boxes", "draw_outline", "normalization_of", "overlay", "plot_explanations", "to_rgb"]

#: Colours of boxes, one per box in turn (matplotlib's tab10, as uint8 RGB).
BOX_COLOURS = tuple(
    tuple(round(255 * c) for c in colour.tolist())
    for colour in np.asarray(cast(ListedColormap, matplotlib.colormaps["tab10"]).colors)
)


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


def _to_map(heatmap, signed: bool | None = None) -> tuple[np.ndarray, bool]:
    """The map as a 2-D float32 array in [0, 1], or in [-1, 1] when signed (by default:
    when it holds negative values), and whether it is signed."""
    # numpy, not torch: the CLI overlays from several threads at once, and torch would start
    # a thread team for each of them that competes with the model's threads.
    if isinstance(heatmap, Tensor):
        heatmap = heatmap.detach().cpu().float().numpy()
    if not isinstance(heatmap, np.ndarray):
        raise TypeError(f"the map must be a tensor or an array, got {type(heatmap).__name__}")
    heatmap = heatmap.astype(np.float32, copy=False)
    while heatmap.ndim > 2 and heatmap.shape[0] == 1:
        heatmap = heatmap[0]
    if heatmap.ndim != 2:
        raise ValueError(
            f"the map must be 2-D (H, W), got shape {tuple(heatmap.shape)}; pick one map, e.g. res.maps[0]"
        )
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


def _fitted_map(heat: np.ndarray, signed: bool, height: int, width: int) -> np.ndarray:
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


def _blend(rgb: np.ndarray, heat: np.ndarray, signed: bool, cmap, alpha: float) -> np.ndarray:
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
    heat, signed = _to_map(heatmap, signed)
    heat = _fitted_map(heat, signed, *rgb.shape[:2])
    out = _blend(rgb, heat, signed, cmap, alpha)
    if outline is not None:
        out = draw_outline(out, outline)
    if boxes is not None:
        out = draw_boxes(out, boxes, labels)
    elif labels is not None:
        raise ValueError("labels caption boxes; pass boxes= with them")
    return out


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


def normalization_of(preprocess) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The (mean, std) a preprocessing pipeline normalises with.

    Reads torchvision's ``weights.transforms()`` and ``Normalize`` (also inside a
    ``Compose``), timm's data config dict, or anything with ``mean`` and ``std`` attributes.

    >>> from torchvision import transforms
    >>> normalization_of(transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)]))
    ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    """
    if isinstance(preprocess, Mapping) and "mean" in preprocess and "std" in preprocess:
        return tuple(map(float, preprocess["mean"])), tuple(map(float, preprocess["std"]))
    if hasattr(preprocess, "mean") and hasattr(preprocess, "std"):
        return tuple(map(float, preprocess.mean)), tuple(map(float, preprocess.std))
    for step in getattr(preprocess, "transforms", []):
        try:
            return normalization_of(step)
        except ValueError:
            continue
    raise ValueError(f"cannot find mean and std in {type(preprocess).__name__}; pass them to denormalize() yourself")


def denormalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Undo ``Normalize(mean, std)`` on (C, H, W) or (N, C, H, W) tensors, clamped to [0, 1].

    >>> denormalize(torch.zeros(3, 1, 1), [0.5] * 3, [0.5] * 3).flatten().tolist()
    [0.5, 0.5, 0.5]
    """
    mean_t = torch.as_tensor(mean, dtype=images.dtype, device=images.device).reshape(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=images.dtype, device=images.device).reshape(-1, 1, 1)
    channels = images.shape[-3]
    if mean_t.shape[0] not in (1, channels) or std_t.shape[0] not in (1, channels):
        raise ValueError(f"mean and std need 1 or {channels} values, got {len(mean_t)} and {len(std_t)}")
    return (images.detach() * std_t + mean_t).clamp(0.0, 1.0)


def _target_panels(title: str, explanation, index: int) -> list[tuple[str, Tensor, bool]]:
    """(title, map, signed) of each target an explanation explains for image ``index``: the
    method (and the target's rank, with ``topk``), the class and its probability."""
    heat, names, probs = explanation.maps[index], explanation.target_names[index], explanation.probabilities[index]
    if heat.dim() == 2:
        heat, names, probs = heat[None], [names], probs[None]
    panels = []
    for rank, (target_map, name, prob) in enumerate(zip(heat, names, probs, strict=True), start=1):
        method = f"{title} top{rank}" if len(names) > 1 else title
        label = f"{method}\n{name}" + ("" if torch.isnan(prob) else f" ({float(prob):.0%})")
        panels.append((label, target_map, explanation.signed))
    return panels


def plot_explanations(
    image,
    explanations: Sequence | Mapping,
    index: int = 0,
    *,
    cmap: str | None = None,
    alpha: float = 0.5,
    columns: int | None = None,
):
    """A matplotlib figure: the image, then one overlay per explanation and target, titled
    with the method, the explained class and its probability.

    ``explanations`` is a list of :class:`~explain.Explanation` (titled by method) or a
    mapping of title to Explanation or to a 2-D map, so CAMs and attributions sit side by
    side in one grid. ``index`` picks the image in the batch. With ``topk``, each target has
    its panel, titled with its rank. Signed maps are drawn with a diverging colormap (see
    :func:`overlay`).

    >>> import explain, torchvision
    >>> model = torchvision.models.resnet18(num_classes=4).eval()
    >>> image = torch.rand(1, 3, 64, 64)
    >>> figure = plot_explanations(image[0], [explain.explainer("gradcam", model)(image, topk=2)])
    >>> [axis.get_title().splitlines()[0] for axis in figure.axes]   # the titles' first lines
    ['image', 'gradcam top1', 'gradcam top2']
    """
    import matplotlib.pyplot as plt

    from .explanation import Explanation

    items = explanations.items() if isinstance(explanations, Mapping) else ((e.method, e) for e in explanations)
    panels: list[tuple[str, Tensor | None, bool | None]] = [("image", None, False)]
    for title, item in items:
        panels += _target_panels(title, item, index) if isinstance(item, Explanation) else [(title, item, None)]
    columns = columns or min(len(panels), 4)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3 * columns, 3.4 * rows), squeeze=False, layout="constrained")
    rgb = to_rgb(image)
    for axis in axes.flat:
        axis.axis("off")
    for axis, (title, heat, signed) in zip(axes.flat, panels, strict=False):
        axis.imshow(rgb if heat is None else overlay(rgb, heat, cmap=cmap, alpha=alpha, signed=signed))
        axis.set_title(title, fontsize=9)
    return figure
