"""SLIC superpixels of a batch of images: the segments that LIME, KernelSHAP and Feature
Ablation switch on and off, and that IROF removes."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .checks import positive_int

__all__ = ["superpixels"]


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
