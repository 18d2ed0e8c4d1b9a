"""Segments of images: SLIC superpixels of a batch (the segments that LIME, KernelSHAP and
Feature Ablation switch on and off, and that IROF removes) and XRAI's overlapping
Felzenszwalb regions of one image."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .checks import positive_int

__all__ = ["FELZENSZWALB_SCALES", "felzenszwalb_regions", "superpixels"]

#: XRAI's Felzenszwalb scales (Kapishnikov et al. 2019, sec. 3.2, as PAIR's ``saliency``
#: package): segmentations from fine to coarse, whose segments overlap.
FELZENSZWALB_SCALES = (50, 100, 150, 250, 500, 1200)


def superpixels(images: Tensor, n_segments: int = 50, compactness: float = 10.0) -> Tensor:
    """SLIC superpixels of each image: (N, 1, H, W) integer ids 0..M-1 on the images' device.

    Each image is min-max scaled to [0, 1] first (model inputs are normalised, SLIC expects
    pixel values); colour images are segmented in Lab space, as scikit-image does.
    Achanta et al., "SLIC Superpixels Compared to State-of-the-Art Superpixel Methods",
    IEEE TPAMI 2012, through :func:`skimage.segmentation.slic`.

    >>> image = torch.zeros(1, 3, 16, 16); image[..., 8:] = 1.0   # two flat halves
    >>> segments = superpixels(image, n_segments=4)
    >>> segments.shape, segments.unique().tolist()
    (torch.Size([1, 1, 16, 16]), [0, 1, 2, 3])
    >>> set(segments[..., :8].unique().tolist()) & set(segments[..., 8:].unique().tolist())   # none crosses the edge
    set()
    """
    from skimage.segmentation import slic

    positive_int("n_segments", n_segments)
    pixels = images.detach().float().cpu()
    low = pixels.amin(dim=(1, 2, 3), keepdim=True)
    span = (pixels.amax(dim=(1, 2, 3), keepdim=True) - low).clamp_min(1e-12)
    scaled = ((pixels - low) / span).permute(0, 2, 3, 1).numpy()
    masks = []
    for image in scaled:
        labels = slic(image, n_segments=n_segments, compactness=compactness, start_label=0, channel_axis=-1)
        _, contiguous = np.unique(labels, return_inverse=True)
        masks.append(contiguous.reshape(labels.shape))
    return torch.from_numpy(np.stack(masks)).long()[:, None].to(images.device)


def felzenszwalb_regions(image: Tensor, dilation_radius: int = 5) -> Tensor:
    """XRAI's candidate regions of one image (C, H, W): the segments of Felzenszwalb's
    graph segmentation at each of :data:`FELZENSZWALB_SCALES` (sigma 0.8, segments of at
    least 150 pixels), each dilated by a disk of ``dilation_radius`` pixels; (M, H, W) bool
    on the CPU. As PAIR's ``saliency`` package: the image is scaled to [-1, 1] and resized
    to 224 x 224 (bicubic) for the segmentation, the segments resized back (nearest).

    Felzenszwalb and Huttenlocher, "Efficient Graph-Based Image Segmentation", IJCV 2004,
    through :func:`skimage.segmentation.felzenszwalb`.

    >>> image = torch.zeros(3, 32, 32); image[:, :, 16:] = 1.0
    >>> regions = felzenszwalb_regions(image, dilation_radius=0)
    >>> left, right = regions[:, :, :16].any(dim=(1, 2)), regions[:, :, 16:].any(dim=(1, 2))
    >>> regions.shape[1:], bool((left & right).any())   # no region crosses the edge
    (torch.Size([32, 32]), False)
    """
    from skimage.morphology import dilation, disk
    from skimage.segmentation import felzenszwalb
    from skimage.transform import resize

    pixels = image.detach().double().cpu().permute(1, 2, 0).numpy()
    low, high = pixels.min(), pixels.max()
    pixels = (pixels - low) / (high - low) * 2.0 - 1.0 if high > low else np.zeros_like(pixels)
    size = pixels.shape[:2]
    pixels = resize(pixels, (224, 224), order=3, mode="constant", preserve_range=True, anti_aliasing=True)
    masks: list[np.ndarray] = []
    for scale in FELZENSZWALB_SCALES:
        labels = felzenszwalb(pixels, scale=scale, sigma=0.8, min_size=150)
        labels = resize(labels, size, order=0, preserve_range=True, mode="constant", anti_aliasing=False).astype(int)
        masks.extend(labels == label for label in range(labels.min(), labels.max() + 1))
    if dilation_radius:
        footprint = disk(dilation_radius)
        masks = [_dilated(mask, footprint, dilation_radius, dilation) for mask in masks]
    return torch.from_numpy(np.stack(masks))


def _dilated(mask: np.ndarray, footprint: np.ndarray, radius: int, dilation) -> np.ndarray:
    """``dilation(mask, footprint)``, computed on the mask's bounding box grown by ``radius``
    (nothing beyond it changes): most segments are small, and dilating each whole image
    took most of XRAI's segmentation time."""
    rows, columns = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not len(rows):
        return mask
    top, bottom = max(rows[0] - radius, 0), min(rows[-1] + radius + 1, mask.shape[0])
    left, right = max(columns[0] - radius, 0), min(columns[-1] + radius + 1, mask.shape[1])
    grown = np.zeros_like(mask)
    grown[top:bottom, left:right] = dilation(mask[top:bottom, left:right], footprint=footprint)
    return grown
