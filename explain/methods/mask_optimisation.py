"""Mask optimisation: the smooth mask of a given area that keeps (or removes) the most of
the explained score, found by gradient descent on the mask.

:class:`ExtremalPerturbation` follows Fong, Patrick and Vedaldi (ICCV 2019) as their
TorchRay implements it (the tests check it against TorchRay): masks built from a coarse
parameter grid by a smooth max-convolution (:class:`SmoothMasks`), the image blurred where
the mask is off (:class:`BlurPyramid`), the area held by a ranking constraint whose weight
grows at each step. All images and areas of a batch are optimised together, one pass of
their rows per step, in inner batches from the memory budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import register
from ..baselines import gaussian_filter
from ..checks import positive_int
from ..passes import advance
from .attribution_base import Batched, ScoredModel

__all__ = ["BlurPyramid", "ExtremalPerturbation", "SmoothMasks"]

#: TorchRay's optimiser: SGD with momentum (and as much dampening), learning rate 0.01.
LEARNING_RATE, MOMENTUM = 0.01, 0.9
#: The area constraint's weight: 300 at first, times 1.0035 after every step (TorchRay's).
REGUL_WEIGHT, REGUL_GROWTH = 300.0, 1.0035
#: The smooth max's coldness (the softmax's inverse temperature).
COLDNESS = 20.0


class SmoothMasks:
    """Fong et al.'s smooth masks (sec. 3.2, eq. 6): each pixel the smooth max, over the
    parameters of a coarse grid (one every ``step`` pixels) within reach, of the parameter
    times a radial kernel of its distance (scale ``sigma``), clamped to [0, 1]. As TorchRay's
    ``MaskGenerator`` (softmax pooling, coldness 20, a margin of ``sigma`` pixels)."""

    def __init__(self, shape: tuple[int, int], step: int, sigma: float, device: torch.device):
        self.shape, self.step, self.sigma = shape, step, sigma
        self.margin = sigma
        self.padding = 1 + math.ceil((self.margin + sigma) / step)
        self.radius = 1 + math.ceil(sigma / step)
        self.shape_in = [math.ceil(z / step) for z in shape]
        self.shape_mid = [z + 2 * self.padding - (2 * self.radius + 1) + 1 for z in self.shape_in]
        self.shape_up = [step * z for z in self.shape_mid]
        self.shape_out = [z - step + 1 for z in self.shape_up]
        self.weight = self._kernel_weights().to(device)

    def _kernel_weights(self) -> Tensor:
        size = 2 * self.radius + 1
        weight = torch.zeros((1, size**2, *self.shape_out))
        ratios = [
            torch.tensor(mid, dtype=torch.float32) / torch.tensor(up, dtype=torch.float32)
            for mid, up in zip(self.shape_mid, self.shape_up, strict=True)
        ]
        uy, ux = torch.meshgrid(
            torch.arange(self.shape_out[0], dtype=torch.float32),
            torch.arange(self.shape_out[1], dtype=torch.float32),
            indexing="ij",
        )
        for ky in range(size):
            for kx in range(size):
                iy = torch.floor(ratios[0] * uy) + ky - self.padding
                ix = torch.floor(ratios[1] * ux) + kx - self.padding
                dy, dx = uy - (self.margin + self.step * iy), ux - (self.margin + self.step * ix)
                delta = torch.sqrt(dy**2 + dx**2)
                weight[0, ky * size + kx] = torch.exp(-2 * ((delta / self.sigma - 0.5).clamp(min=0) ** 2))
        return weight

    def __call__(self, parameters: Tensor) -> tuple[Tensor, Tensor]:
        """The masks of ``parameters`` (K, 1, *shape_in): cropped to ``shape``, and whole
        (with the margin), each (K, 1, ...)."""
        size = 2 * self.radius + 1
        mask = F.unfold(parameters, (size, size), padding=(self.padding, self.padding))
        mask = mask.reshape(len(parameters), -1, *self.shape_mid)
        mask = F.interpolate(mask, size=self.shape_up, mode="nearest")
        mask = F.pad(mask, (0, -self.step + 1, 0, -self.step + 1))
        mask = self.weight * mask
        mask = (mask * F.softmax(COLDNESS * mask, dim=1)).sum(dim=1, keepdim=True).clamp(0, 1)
        m = round(self.margin)
        return mask[:, :, m : m + self.shape[0], m : m + self.shape[1]], mask


class BlurPyramid:
    """An image under ``levels`` Gaussian blurs, sigma from ``max_blur`` down to 0 (the
    image), and masked images drawn from it: where the mask is m, the level m (levels - 1),
    interpolated linearly (Fong et al. sec. 3.1; TorchRay's ``Perturbation``)."""

    def __init__(self, images: Tensor, levels: int = 8, max_blur: float = 20.0):
        self.levels = levels
        sigmas = [float((1 - s) * max_blur) for s in torch.linspace(0, 1, levels)]
        self.pyramid = torch.stack(
            [gaussian_filter(images, sigma, math.ceil(4 * sigma)) for sigma in sigmas], dim=1
        )  # (N, L, C, H, W)

    def apply(self, masks: Tensor, owners: Tensor) -> Tensor:
        """The images ``owners`` (K,) perturbed by ``masks`` (K, 1, H, W) in [0, 1]."""
        w = masks.reshape(len(masks), 1, *masks.shape[1:]) * (self.levels - 1)
        k = w.floor()
        w = w - k
        y = self.pyramid[owners]
        k = k.long().expand(len(masks), 1, *y.shape[2:])
        y0 = torch.gather(y, 1, k)
        y1 = torch.gather(y, 1, torch.clamp(k + 1, max=self.levels - 1))
        return ((1 - w) * y0 + w * y1).squeeze(1)


@register
class ExtremalPerturbation(Batched):
    """Extremal perturbations: the smooth mask of each given area that keeps the most of
    the score, the image blurred outside it.

    A mask of area a maximises the score of the image blurred where the mask is off
    (``variant="preserve"``; ``"delete"``: minimises it with the masked part blurred), under
    a constraint that its sorted values equal those of a mask with a fraction a of ones,
    whose weight (300) grows by 1.0035 at each of ``steps`` steps of SGD with momentum.

    Fong, Patrick and Vedaldi, "Understanding Deep Networks via Extremal Perturbations and
    Smooth Masks", ICCV 2019, sec. 3 (eq. 3 and 6); masks (``mask_step`` 7, ``sigma`` 21),
    blur pyramid (8 levels, sigma up to 20), schedule, optimiser and the image flipped
    every other step as the authors' TorchRay, which the default ``steps`` (800) follows.
    ``raw`` holds one mask per area, (N, len(areas), H, W); the map is their sum (the
    ``"abs-sum"`` reduction), as the paper's figures sum the masks of several areas.
    """

    name = "extremal"
    family = "perturbation attribution"
    images_only = "its smooth masks and blur pyramid are 2-D; use occlusion, whose window has the inputs' rank"
    cost = "1 forward + steps (800) x len(areas) (3) forward + backward"
    nonnegative = True

    def __init__(
        self,
        model: nn.Module,
        *,
        areas: float | Sequence[float] = (0.05, 0.1, 0.2),
        steps: int = 800,
        variant: str = "preserve",
        mask_step: int = 7,
        sigma: float = 21.0,
        **options,
    ):
        super().__init__(model, **options)
        self.areas = (float(areas),) if isinstance(areas, (int, float)) else tuple(float(a) for a in areas)
        if not self.areas or not all(0 < a < 1 for a in self.areas):
            raise ValueError(f"areas must be fractions of the image in (0, 1), such as (0.05, 0.1, 0.2); got {areas!r}")
        if variant not in ("preserve", "delete"):
            raise ValueError(f"unknown variant {variant!r}; use 'preserve' or 'delete'")
        self.steps, self.variant = positive_int("steps", steps), variant
        self.mask_step, self.sigma = positive_int("mask_step", mask_step), float(sigma)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.steps * len(self.areas))

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        per_image = max(1, self.rows(images, len(images) * len(self.areas)) // len(self.areas))
        groups = [range(i, min(i + per_image, len(images))) for i in range(0, len(images), per_image)]
        return torch.cat([self.optimise(scored, images, group, k) for group in groups])

    def optimise(self, scored: ScoredModel, images: Tensor, chosen: range, k: int) -> Tensor:
        """The masks (n, len(areas), H, W) of ``images[chosen]``, optimised together."""
        areas, device = len(self.areas), images.device
        owners = torch.arange(chosen.start, chosen.stop, device=device).repeat_interleave(areas)
        pyramid = BlurPyramid(images[chosen.start : chosen.stop].detach())
        masks = SmoothMasks((images.shape[-2], images.shape[-1]), self.mask_step, self.sigma, device)
        parameters = torch.ones(len(owners), 1, *masks.shape_in, device=device)
        reference = self._reference(int(math.prod(masks.shape_out)), device).repeat(len(chosen), 1)
        optimiser = torch.optim.SGD([parameters], lr=LEARNING_RATE, momentum=MOMENTUM, dampening=MOMENTUM)
        weight, dtype = REGUL_WEIGHT, scored.dtype or images.dtype
        for step in range(self.steps):
            parameters.requires_grad_(True)
            cropped, whole = masks(parameters)
            x = pyramid.apply(cropped if self.variant == "preserve" else 1 - cropped, owners - chosen.start)
            if step % 2 == 0:
                x = torch.flip(x, dims=(3,))
            advance(len(x))
            reward = scored.explained_scores(scored.model(x.to(dtype)), k, owners).float()
            reward = reward if self.variant == "preserve" else -reward
            ranked = whole.reshape(len(owners), -1).sort(dim=1)[0]
            energy = (reward - ((ranked - reference) ** 2).mean(dim=1) * weight).sum()
            optimiser.zero_grad()
            (-energy).backward()
            optimiser.step()
            parameters.data = parameters.data.clamp(0, 1)
            weight *= REGUL_GROWTH
        return cropped.detach().reshape(len(chosen), areas, *images.shape[-2:]).to(images.dtype)

    def _reference(self, size: int, device: torch.device) -> Tensor:
        """The sorted values of a mask of each area: zeros, then a fraction ``area`` of ones."""
        reference = torch.ones(len(self.areas), size, device=device)
        for i, area in enumerate(self.areas):
            reference[i, : int(size * (1 - area))] = 0
        return reference
