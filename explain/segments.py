"""Segments of images given by the user: boolean masks, overlapping or not (a SAM's masks, a
segmentation model's classes), or a label image, as one (K, H, W) boolean mask stack per
image. The perturbation methods score such segments (``segments=``), as captum 0.9's
``ImageMaskInput`` does with its ``mask_list`` (masks) and ``mask`` (a label image).

- **Masks** (K, H, W): booleans (or 0/1 values of any dtype), one mask per segment; masks
  may overlap, and pixels that no mask covers belong to no segment (never perturbed).
- **A label image** (H, W) of integers: one segment per distinct value, in ascending order
  of the values, 0 included (every value is a segment, as captum's ``mask`` and
  ``feature_mask`` take them); negative values mark pixels that belong to no segment.
  :func:`label_masks` gives its masks and their values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["label_masks", "segment_masks"]


def label_masks(labels: Tensor | np.ndarray) -> tuple[Tensor, Tensor]:
    """The boolean masks (K, H, W) of a label image (H, W) of integers and the value of each
    (K,), ascending; negative values belong to no segment.

    >>> masks, ids = label_masks(torch.tensor([[0, 0, 7], [-1, 7, 7]]))
    >>> ids.tolist(), masks.int().tolist()
    ([0, 7], [[[1, 1, 0], [0, 0, 0]], [[0, 0, 1], [0, 1, 1]]])
    """
    labels = torch.as_tensor(labels)
    if labels.dim() != 2 or labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(
            f"a label image is (H, W) integers, got {_described(labels)}; cast it with .long() "
            "(numpy: .astype(int)), or pass boolean masks (K, H, W)"
        )
    ids = torch.unique(labels[labels >= 0])
    if not len(ids):
        raise ValueError("the label image has no segment (every value is negative); label its pixels 0, 1, 2, ...")
    return labels[None] == ids.view(-1, 1, 1), ids


def segment_masks(segments, count: int, size: tuple[int, int], device: torch.device | str = "cpu") -> list[Tensor]:
    """Each of ``count`` images' segments as boolean masks (K_i, H, W) on ``device``, from
    ``segments``: a sequence with one entry per image, each masks (K, H, W) (booleans or 0/1
    values) or a label image (H, W) of integers (see the module); or one array of label
    images (N, H, W), or of masks (N, K, H, W) (booleans), for every image. Masks may
    overlap; each must cover a pixel. Mistakes raise ``ValueError`` naming the fix.

    >>> labels = torch.tensor([[0, 1], [1, 1]])
    >>> [m.shape for m in segment_masks([labels, labels[None] == 1], 2, (2, 2))]
    [torch.Size([2, 2, 2]), torch.Size([1, 2, 2])]
    """
    height, width = size
    if isinstance(segments, (Tensor, np.ndarray)):
        whole = torch.as_tensor(segments)
        if not (whole.dim() == 3 and _is_integer(whole)) and not (whole.dim() == 4 and whole.dtype == torch.bool):
            raise ValueError(
                f"segments as one array are label images (N, H, W) of integers or masks (N, K, H, W) of "
                f"booleans, got {_described(whole)}; for masks of another shape per image pass a list with "
                "one (K, H, W) mask array per image"
            )
        segments = list(whole)
    if isinstance(segments, (str, bytes)) or not isinstance(segments, Sequence):
        raise ValueError(
            f"segments must be a list with one entry per image (masks (K, H, W) or a label image (H, W)), "
            f"got {type(segments).__name__}"
        )
    if len(segments) != count:
        raise ValueError(
            f"segments has {len(segments)} entries for {count} images; give one per image (masks (K, H, W) "
            "or a label image (H, W))"
        )
    return [_masks_of(entry, i, (height, width)).to(device) for i, entry in enumerate(segments)]


def _masks_of(entry, i: int, size: tuple[int, int]) -> Tensor:
    """Image ``i``'s masks (K, H, W) from its entry, checked."""
    if not isinstance(entry, (Tensor, np.ndarray)):
        raise ValueError(
            f"segments[{i}] is a {type(entry).__name__}; give a tensor or numpy array: masks (K, H, W) or a "
            "label image (H, W)"
        )
    entry = torch.as_tensor(entry)
    if entry.dim() == 2:
        if entry.dtype == torch.bool:
            raise ValueError(
                f"segments[{i}] is one (H, W) boolean mask; a mask stack is (K, H, W): pass mask[None] for one "
                "segment, or a label image of integers"
            )
        if not _is_integer(entry):
            raise ValueError(
                f"segments[{i}] is a label image of {entry.dtype}; label images hold integers: cast it with "
                ".long() (numpy: .astype(int)), or pass boolean masks (K, H, W)"
            )
        _check_size(entry, i, size)
        masks, _ = label_masks(entry)
        return masks
    if entry.dim() != 3:
        raise ValueError(
            f"segments[{i}] has shape {tuple(entry.shape)}; give masks (K, H, W) or a label image (H, W) at the "
            f"images' size {size[0]} x {size[1]}"
        )
    _check_size(entry, i, size)
    if entry.dtype != torch.bool:
        if entry.is_complex() or bool(((entry != 0) & (entry != 1)).any()):
            raise ValueError(
                f"segments[{i}] is a (K, H, W) stack of {entry.dtype} with values other than 0 and 1; masks "
                "hold booleans (pass masks > 0.5, or a label image (H, W) of integers)"
            )
        entry = entry != 0
    if not len(entry):
        raise ValueError(f"segments[{i}] holds no mask (K = 0); give at least one segment")
    empty = (~entry.flatten(1).any(dim=1)).nonzero().flatten().tolist()
    if empty:
        shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
        raise ValueError(f"segments[{i}]: mask(s) {shown} cover no pixel; drop them (masks[masks.any((1, 2))])")
    return entry


def _check_size(entry: Tensor, i: int, size: tuple[int, int]) -> None:
    if tuple(entry.shape[-2:]) != tuple(size):
        raise ValueError(
            f"segments[{i}] is {entry.shape[-2]} x {entry.shape[-1]}, the images {size[0]} x {size[1]}; resize "
            "the masks to the model's input as the images were (nearest-neighbour, the same crop)"
        )


def _is_integer(tensor: Tensor) -> bool:
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def _described(tensor: Tensor) -> str:
    return f"shape {tuple(tensor.shape)} of {tensor.dtype}"
