"""Regions of images as boolean masks: box-to-mask geometry for the localisation metrics,
segmentation targets and regions files."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["region_masks"]


def region_masks(regions: Tensor, size: tuple[int, int]) -> Tensor:
    """Boolean masks (N, H, W) from masks or from ``(x0, y0, x1, y1)`` boxes (N, 4).

    >>> region_masks(torch.tensor([[1, 0, 3, 1]]), (2, 4)).int().tolist()
    [[[0, 1, 1, 0], [0, 0, 0, 0]]]
    """
    regions = torch.as_tensor(regions)
    height, width = size
    if regions.dim() == 2 and regions.shape[1] == 4:
        boxes = regions.float()
        ys = torch.arange(height, device=boxes.device) + 0.5
        xs = torch.arange(width, device=boxes.device) + 0.5
        inside_y = (ys >= boxes[:, 1:2]) & (ys <= boxes[:, 3:4])
        inside_x = (xs >= boxes[:, 0:1]) & (xs <= boxes[:, 2:3])
        return inside_y[:, :, None] & inside_x[:, None, :]
    if regions.dim() == 4 and regions.shape[1] == 1:
        regions = regions[:, 0]
    if regions.dim() != 3 or tuple(regions.shape[-2:]) != tuple(size):
        raise ValueError(
            f"regions have shape {tuple(regions.shape)}; pass masks (N, {height}, {width}) at the maps' size "
            "or boxes (N, 4) as (x0, y0, x1, y1) in pixels"
        )
    return regions.bool()
