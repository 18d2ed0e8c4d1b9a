"""Focus: explained on a mosaic of four images, two of the explained class and two of
others, how much of the map's positive relevance falls on the two of the class? The
mosaics are built from the images of the call and explained again."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import Explainer
from ..explanation import Explanation
from ..passes import Passes, with_pass_options
from .base import Score, chunks, explanation_batch, pairs_of, top_classes

__all__ = ["focus", "mosaics"]


def _plan(labels: Tensor, image_of: Tensor, targets: Tensor, seed: int) -> tuple[Tensor, Tensor]:
    """For each (image, target): the images of its mosaic's four quadrants (top left, top
    right, bottom left, bottom right), (M, 4), -1 where no mosaic can be made; and which
    quadrants hold an image of the target class, (M, 4)."""
    m = len(targets)
    quadrants = torch.full((m, 4), -1, dtype=torch.long)
    flags = torch.zeros(m, 4, dtype=torch.bool)
    labels, image_of, targets = labels.cpu(), image_of.cpu(), targets.cpu()
    everyone = torch.arange(len(labels))
    generator = torch.Generator()
    for i in range(m):
        n, target = int(image_of[i]), int(targets[i])
        same = everyone[(labels == target) & (everyone != n)]
        others = everyone[labels != target]
        if int(labels[n]) != target or len(same) < 1 or len(others) < 2:
            continue
        generator.manual_seed(seed * 1_000_003 + i)
        partner = same[torch.randint(len(same), (1,), generator=generator)]
        strangers = others[torch.randperm(len(others), generator=generator)[:2]]
        order = torch.randperm(4, generator=generator)
        chosen = torch.cat([torch.tensor([n]), partner, strangers])
        quadrants[i, order] = chosen
        flags[i, order[:2]] = True
    return quadrants, flags


def _assemble(images: Tensor, quadrants: Tensor) -> Tensor:
    """The mosaics of the (B, 4) quadrant images: each image resized (bilinear, antialiased)
    into its quarter of an image of the same size; the bottom and right quarters take the
    odd pixel."""
    height, width = images.shape[-2:]
    top, left = height // 2, width // 2
    boxes = ((0, top, 0, left), (0, top, left, width), (top, height, 0, left), (top, height, left, width))
    out = images.new_empty(len(quadrants), *images.shape[1:])
    for q, (y0, y1, x0, x1) in enumerate(boxes):
        chosen = images[quadrants[:, q].to(images.device)]
        out[..., y0:y1, x0:x1] = F.interpolate(
            chosen.float(), size=(y1 - y0, x1 - x0), mode="bilinear", antialias=True, align_corners=False
        ).to(images.dtype)
    return out


def mosaics(images: Tensor, labels: Tensor, targets: Tensor, *, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Focus's mosaics for ``images`` (N, C, H, W) of classes ``labels`` (N,), one per
    image and its target class ``targets`` (N,): the image, another image of the class
    and two images of other classes, each shrunk to a quarter and placed at random
    (seeded by ``seed`` and the image's position). Returns the mosaics (N, C, H, W), which
    quadrants show the class (N, 4: top left, top right, bottom left, bottom right, as
    Quantus's Focus reads them) and whether a mosaic could be made (N,): an image not of
    its target class, or without another image of the class and two of other classes,
    has none (its mosaic is left at zero).

    >>> x = torch.rand(4, 3, 8, 8)
    >>> made, shows, valid = mosaics(x, torch.tensor([0, 0, 1, 2]), torch.tensor([0, 0, 1, 2]))
    >>> made.shape, shows.sum(1).tolist(), valid.tolist()
    (torch.Size([4, 3, 8, 8]), [2, 2, 0, 0], [True, True, False, False])
    """
    n = len(images)
    quadrants, flags = _plan(torch.as_tensor(labels), torch.arange(n), torch.as_tensor(targets), seed)
    valid = (quadrants >= 0).all(1)
    out = torch.zeros_like(images)
    if valid.any():
        out[valid.to(images.device)] = _assemble(images, quadrants[valid])
    return out, flags.to(images.device), valid.to(images.device)


@with_pass_options
def focus(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    labels: Tensor | None = None,
    seed: int = 0,
    batch_size: int | None = None,
) -> Score:
    """Focus: the share of a mosaic's positive relevance that falls on its two images of the
    explained class (higher is better; 0.5 is what a map blind to the class gives).

    Arias-Duart, Pares, Garcia-Gasulla & Gimenez-Abalos, "Focus! Rating XAI Methods and
    Finding Biases", FUZZ-IEEE 2022: for each image and target, a mosaic of four images,
    the image and another of its class, and two of other classes, each shrunk to a
    quarter and placed at random (:func:`mosaics`), explained again by ``explainer`` for
    the class (``batch_size`` mosaics a call); Focus = R+(class quadrants) / R+(mosaic), as
    Quantus's Focus scores a given mosaic.

    ``labels`` are the images' classes (N,), by default the model's top classes (one
    forward pass per image). The mosaics are built from the images of the call, so an
    image's value depends on the others (in ``explain evaluate``, those of its batch); an
    image not of the explained class, or without another image of it and two images of
    other classes, scores NaN. ``explanation`` gives the targets (computed when not
    given); its maps are not used.
    """
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    k, m = pairs.per_image, len(pairs.targets)
    originals = pairs.images[::k]
    if labels is None:
        labels = top_classes(explainer.model, originals, batch_size=None)
    labels = torch.as_tensor(labels).reshape(-1)
    if len(labels) != len(originals):
        raise ValueError(f"labels must give one class per image, ({len(originals)},); got {tuple(labels.shape)}")
    image_of = torch.arange(m) // k
    quadrants, flags = _plan(labels.long(), image_of, pairs.targets, int(seed))
    valid = torch.nonzero((quadrants >= 0).all(1)).flatten()
    shares = torch.full((m,), float("nan"), device=pairs.maps.device)
    height, width = pairs.maps.shape[-2:]
    top, left = height // 2, width // 2
    with Passes(None, len(valid)) as passes:
        for part in chunks(len(valid), explanation_batch(batch_size, pairs.images.device)):
            rows = valid[part]
            made = _assemble(originals, quadrants[rows])
            positive = explainer(made, pairs.targets[rows.to(pairs.targets.device)]).maps.float().clamp_min(0)
            quarter = flags[rows].to(positive.device)
            weights = torch.zeros_like(positive)
            weights[:, :top, :left] = quarter[:, 0, None, None].float()
            weights[:, :top, left:] = quarter[:, 1, None, None].float()
            weights[:, top:, :left] = quarter[:, 2, None, None].float()
            weights[:, top:, left:] = quarter[:, 3, None, None].float()
            total = positive.flatten(1).sum(1)
            inside = (positive * weights).flatten(1).sum(1)
            shares[rows.to(shares.device)] = torch.where(total > 0, inside / total.clamp_min(1e-30), 0.0)
            passes.advance(len(rows))
    return Score(metric="focus", values=pairs.unflatten(shares), higher_is_better=True)
