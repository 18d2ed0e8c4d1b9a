"""Mask optimisation: the smooth mask of a given area that keeps (or removes) the most of
the explained score, found by gradient descent on the mask.

:class:`ExtremalPerturbation` follows Fong, Patrick and Vedaldi (ICCV 2019) as their
TorchRay implements it (the tests check it against TorchRay): masks built from a coarse
parameter grid by a smooth max-convolution (:class:`SmoothMasks`), the image blurred where
the mask is off (:class:`BlurPyramid`), the area held by a ranking constraint whose weight
grows at each step. The masks of all images and areas run together, one pass of their rows
per step, in inner batches of rows from the memory budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..base import register
from ..baselines import gaussian_filter
from ..checks import positive_int
from ..passes import advance
from .attribution_base import Batched, ScoredModel

__all__ = ["BlurPyramid", "ExtremalPerturbation", "SmoothMasks", "SoftmaxPooling", "ranked_reference"]

#: TorchRay's optimiser: SGD with momentum (and as much dampening), learning rate 0.01.
LEARNING_RATE, MOMENTUM = 0.01, 0.9
#: The area constraint's weight: 300 at first, times 1.0035 after every step (TorchRay's).
REGUL_WEIGHT, REGUL_GROWTH = 300.0, 1.0035
#: The smooth max's coldness (the softmax's inverse temperature).
COLDNESS = 20.0
#: On an accelerator, :class:`SoftmaxPooling` takes kernel positions together up to about
#: this many elements a tensor (fewer, larger kernels); on the CPU one at a time, which
#: keeps its tensors in cache (measured fastest).
GROUP_ELEMENTS = 2**24


class SoftmaxPooling(torch.autograd.Function):
    """The smooth max of :class:`SmoothMasks`: f = sum_k v_k softmax_k(COLDNESS v) over
    the n kernel positions k, where v_k = w_k p_k, for ``columns`` (n, N) of parameters p
    (the n parameters within reach of each of N cells) and ``kernel`` (n, R) weights w
    (one for each of the R pixels of a cell); f is (R, N).

    The exponentials are powers of two (``exp2``, faster than ``exp`` on CPUs) of
    a_k = log2(e) COLDNESS v_k - b, b a bound of the exponents per cell (the largest
    parameter, as the weights are at most 1: no overflow), summed one kernel position
    (or ``group`` of them) at a time, so that nothing of size n x R x N is kept; the backward
    computes them again. With s = sum_k 2^a_k and T = sum_k a_k 2^a_k / s,
    f = (T + b) / (log2(e) COLDNESS) and df/dv_k = softmax_k (1 + ln 2 (a_k - T)).
    """

    @staticmethod
    def forward(ctx, columns: Tensor, kernel: Tensor, group: int) -> Tensor:
        scaled = (kernel * (COLDNESS / math.log(2)))[:, :, None]
        bound = (columns.amax(dim=0) - 1).clamp_min(0) * (COLDNESS / math.log(2))
        shape = (group, kernel.shape[1], columns.shape[1])
        total, moment = columns.new_zeros(shape), columns.new_zeros(shape)
        exponents, powers = columns.new_empty(shape), columns.new_empty(shape)
        for first in range(0, len(columns), group):
            size = min(group, len(columns) - first)  # preallocated buffers: allocations cost as much as the sums
            chosen, a, e = slice(first, first + size), exponents[:size], powers[:size]
            torch.addcmul(-bound, scaled[chosen], columns[chosen, None], out=a)
            torch.exp2(a, out=e)
            total[:size] += e
            moment[:size].addcmul_(a, e)
        total, mean = total.sum(dim=0), moment.sum(dim=0)
        mean /= total
        ctx.save_for_backward(columns, kernel, bound, total, mean)
        ctx.group = group
        return (mean + bound).div_(COLDNESS / math.log(2))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        columns, kernel, bound, total, mean = ctx.saved_tensors
        scaled = (kernel * (COLDNESS / math.log(2)))[:, :, None]
        scale = grad * math.log(2) / total
        offset = (1 / math.log(2) - mean) * scale
        out = torch.empty_like(columns)
        shape = (ctx.group, *scale.shape)
        exponents, terms = columns.new_empty(shape), columns.new_empty(shape)
        for first in range(0, len(columns), ctx.group):
            size = min(ctx.group, len(columns) - first)
            chosen, a, z = slice(first, first + size), exponents[:size], terms[:size]
            torch.addcmul(-bound, scaled[chosen], columns[chosen, None], out=a)
            torch.addcmul(offset, a, scale, out=z).mul_(a.exp2_())
            torch.bmm(kernel[chosen, None], z, out=out[chosen, None])
        return out, None, None


class SmoothMasks:
    """Fong et al.'s smooth masks (sec. 3.2, eq. 6): each pixel the smooth max, over the
    parameters of a coarse grid (one every ``step`` pixels) within reach, of the parameter
    times a radial kernel of its distance (scale ``sigma``), clamped to [0, 1]. As TorchRay's
    ``MaskGenerator`` (softmax pooling, coldness 20, a margin of ``sigma`` pixels), whose
    parameters come from a 2 ``radius`` + 1 square window of the grid around each cell and
    whose kernel weights depend only on the pixel's place in its cell (``kernel``, one row a
    window position, one column a pixel of the cell): :class:`SoftmaxPooling` computes it
    without TorchRay's tensor of every parameter at every pixel. Parameters lie in [0, 1]
    (the optimiser clamps them; far outside, the exponentials underflow)."""

    def __init__(self, shape: tuple[int, int], step: int, sigma: float, device: torch.device):
        self.shape, self.step, self.sigma = shape, step, sigma
        self.margin = sigma
        self.padding = 1 + math.ceil((self.margin + sigma) / step)
        self.radius = 1 + math.ceil(sigma / step)
        self.shape_in = [math.ceil(z / step) for z in shape]
        self.shape_mid = [z + 2 * self.padding - (2 * self.radius + 1) + 1 for z in self.shape_in]
        self.shape_out = [step * z - step + 1 for z in self.shape_mid]
        self.kernel = self._kernel_weights().to(device)

    def _kernel_weights(self) -> Tensor:
        """(window positions, step^2): the weight of the parameter at window position
        (ky, kx) for the pixel (ry, rx) of a cell, exp(-2 max(d / sigma - 1/2, 0)^2) of their
        distance d, the parameter's centre at margin + step (ky - padding) from the cell's
        corner (TorchRay's, whose nearest upsampling puts pixel u in cell u // step)."""
        size = 2 * self.radius + 1
        within = torch.arange(self.step, dtype=torch.float32)
        centres = self.margin + self.step * (torch.arange(size, dtype=torch.float32) - self.padding)
        dy = (within[None, :] - centres[:, None])[:, None, :, None]  # (ky, 1, ry, 1)
        dx = (within[None, :] - centres[:, None])[None, :, None, :]  # (1, kx, 1, rx)
        delta = torch.sqrt(dy**2 + dx**2)
        return torch.exp(-2 * ((delta / self.sigma - 0.5).clamp(min=0) ** 2)).reshape(size**2, self.step**2)

    def __call__(self, parameters: Tensor) -> tuple[Tensor, Tensor]:
        """The masks of ``parameters`` (K, 1, *shape_in): cropped to ``shape``, and whole
        (with the margin), each (K, 1, ...)."""
        size, rows, (height, width) = 2 * self.radius + 1, len(parameters), self.shape_mid
        columns = F.unfold(parameters, (size, size), padding=(self.padding, self.padding))  # (K, size^2, cells)
        columns = columns.transpose(0, 1).reshape(size**2, rows * height * width)
        per_position = self.kernel.shape[1] * columns.shape[1]
        group = 1 if columns.device.type == "cpu" else min(len(self.kernel), max(1, GROUP_ELEMENTS // per_position))
        mask = SoftmaxPooling.apply(columns, self.kernel, group)  # (ry, rx, K, cy, cx)
        mask = mask.view(self.step, self.step, rows, height, width).permute(2, 3, 0, 4, 1)
        mask = mask.reshape(rows, 1, height * self.step, width * self.step)
        mask = mask[:, :, : self.shape_out[0], : self.shape_out[1]].clamp(0, 1)
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
        # Each level's difference to the next (none above the top): level + fraction x difference.
        self.differences = torch.cat([self.pyramid.diff(dim=1), torch.zeros_like(self.pyramid[:, :1])], dim=1)

    def apply(self, masks: Tensor, owners: Tensor) -> Tensor:
        """The images ``owners`` (K,) perturbed by ``masks`` (K, 1, H, W) in [0, 1]."""
        levels = masks * (self.levels - 1)
        below = levels.detach().floor().clamp(0, self.levels - 1)
        _, _, channels, height, width = self.pyramid.shape
        pixels = torch.arange(height * width, device=masks.device).view(1, 1, height, width)
        index = (owners.view(-1, 1, 1, 1) * self.levels + below.long()) * (channels * height * width) + pixels
        index = index + (torch.arange(channels, device=masks.device) * (height * width)).view(1, -1, 1, 1)
        return torch.take(self.pyramid, index) + (levels - below) * torch.take(self.differences, index)


def ranked_reference(values: Tensor, ones: Sequence[int]) -> Tensor:
    """Fong et al.'s area reference (sec. 3.1, eq. 3) put back where the values are: 1 at
    the ``ones[i]`` largest values of row i of ``values`` (K, P), 0 elsewhere, so that
    ``(values - reference)`` is ``vecsort(values) - r_a`` reordered (the same terms, the same
    gradient). Equal values at the edge rank as a stable sort puts them (the later ones
    higher). Found by ``kthvalue``, a partial sort, one call per distinct count.

    >>> ranked_reference(torch.tensor([[0.3, 0.9, 0.1, 0.9]]), [2]).tolist()
    [[0.0, 1.0, 0.0, 1.0]]
    >>> ranked_reference(torch.tensor([[0.5, 0.5, 0.5, 0.1]]), [2]).tolist()   # ties: the later ones
    [[0.0, 1.0, 1.0, 0.0]]
    """
    values, reference = values.detach(), torch.zeros_like(values)
    for count in sorted(set(ones)):
        rows = torch.tensor([i for i, c in enumerate(ones) if c == count], device=values.device)
        chosen, zeros = values[rows], values.shape[1] - count
        if zeros <= 0:
            reference[rows] = 1
            continue
        edge = chosen.kthvalue(zeros, dim=1, keepdim=True).values
        above, tied = chosen > edge, chosen == edge
        later = tied.flip(1).cumsum(1).flip(1)  # the values equal to the edge from here on
        reference[rows] = (above | (tied & (later <= count - above.sum(1, keepdim=True)))).to(values.dtype)
    return reference


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
    formula = (
        "smooth masks of {areas:code} that keep the score, the rest blurred ({steps:code}); `raw` one "
        "mask per area, the map their sum"
    )
    runs_on = "explain (TorchRay's numbers)"
    family = "perturbation attribution"
    images_only = "its smooth masks and blur pyramid are 2-D; use occlusion, whose window has the inputs' rank"
    cost = "1 forward + {steps} x {areas:len} forward + backward"
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
        """The masks of every image and area, each row of the optimisation one (image, area)
        pair, as many rows a step as the memory budget takes."""
        total = len(images) * len(self.areas)
        rows = self.rows(images, total)
        masks = [self.optimise(scored, images, range(i, min(i + rows, total)), k) for i in range(0, total, rows)]
        return torch.cat(masks).reshape(len(images), len(self.areas), *images.shape[-2:])

    def optimise(self, scored: ScoredModel, images: Tensor, pairs: range, k: int) -> Tensor:
        """The masks (len(pairs), H, W) of the (image, area) pairs ``pairs`` (image i's area
        j is pair i len(areas) + j), optimised together."""
        device = images.device
        owners = torch.arange(pairs.start, pairs.stop, device=device) // len(self.areas)
        first = pairs.start // len(self.areas)
        pyramid = BlurPyramid(images[first : int(owners[-1]) + 1].detach())
        masks = SmoothMasks((images.shape[-2], images.shape[-1]), self.mask_step, self.sigma, device)
        parameters = torch.ones(len(owners), 1, *masks.shape_in, device=device)
        size = math.prod(masks.shape_out)
        ones = [size - int(size * (1 - self.areas[pair % len(self.areas)])) for pair in pairs]
        optimiser = torch.optim.SGD([parameters], lr=LEARNING_RATE, momentum=MOMENTUM, dampening=MOMENTUM)
        weight, dtype = REGUL_WEIGHT, scored.dtype or images.dtype
        for step in range(self.steps):
            parameters.requires_grad_(True)
            cropped, whole = masks(parameters)
            x = pyramid.apply(cropped if self.variant == "preserve" else 1 - cropped, owners - first)
            if step % 2 == 0:
                x = torch.flip(x, dims=(3,))
            advance(len(x))
            reward = scored.explained_scores(scored.model(x.to(dtype)), k, owners).float()
            reward = reward if self.variant == "preserve" else -reward
            whole = whole.reshape(len(owners), -1)
            energy = (reward - ((whole - ranked_reference(whole, ones)) ** 2).mean(dim=1) * weight).sum()
            optimiser.zero_grad()
            (-energy).backward()
            optimiser.step()
            parameters.data = parameters.data.clamp(0, 1)
            weight *= REGUL_GROWTH
        return cropped.detach()[:, 0].to(images.dtype)
