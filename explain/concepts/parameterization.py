"""Image parameterisations and views for feature visualisation.

- :class:`.FourierImage`: Olah et al., "Feature Visualization", Distill 2017 (and Mordvintsev
  et al., "Differentiable Image Parameterizations", Distill 2018): the image is the inverse
  real FFT of a spectrum whose frequency f is scaled by 1 / max(f, 1 / max(h, w))^decay (so
  that the optimiser sees every frequency alike: a whitened, "preconditioned" space), then
  divided by 4, its colours recorrelated by the square root of ImageNet's colour covariance
  (:data:`.COLOR_CORRELATION_NORMALIZED`) and squashed into [0, 1] by a sigmoid. The frequencies,
  scale, magic 4 and colour matrix are torch-lucent's (``lucent/optvis/param/spatial.py``
  ``fft_image``, ``color.py``), which are lucid's.
- :class:`.MagnitudeImage`: MaCo, Fel et al., "Unlocking Feature Visualization for Deeper
  Networks with MAgnitude Constrained Optimization", NeurIPS 2023: only the phase phi is
  optimised; the magnitude m of the spectrum is fixed (natural images' average, or the
  1 / f power law where none is given). Image: standardise phi, irfft2(m e^{i phi}),
  standardise, recorrelate colours, sigmoid (xplique's ``maco_image_parametrization``).
- :func:`.robust_views`: transformation robustness (Olah et al. 2017): each copy of an image
  padded with grey, jittered, scaled, rotated and jittered again (lucent's
  ``standard_transforms``), all copies sampled in one ``grid_sample``;
  :func:`.random_crops`: MaCo's random crops, resized to the model's input, with noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "COLOR_CORRELATION_NORMALIZED",
    "COLOR_CORRELATION_SVD_SQRT",
    "FourierImage",
    "MagnitudeImage",
    "fft_frequencies",
    "natural_magnitude",
    "random_crops",
    "recorrelate_colours",
    "robust_views",
    "spectrum_scale",
]

#: The square root of ImageNet's colour covariance (lucid's ``color_correlation_svd_sqrt``).
COLOR_CORRELATION_SVD_SQRT = ((0.26, 0.09, 0.02), (0.27, 0.00, -0.05), (0.27, -0.09, 0.03))
_SVD_SQRT = torch.tensor(COLOR_CORRELATION_SVD_SQRT)
#: The same, divided by its largest column norm (lucid's ``color_correlation_normalized``).
COLOR_CORRELATION_NORMALIZED = _SVD_SQRT / torch.linalg.vector_norm(_SVD_SQRT, dim=0).max()
#: lucid's constant that the Fourier image is divided by ("increasing this seems to reduce saturation").
MAGIC = 4.0
#: lucent's scales and angles (degrees) of transformation robustness.
SCALES = tuple(1 + (i - 5) / 50 for i in range(11))
ANGLES = (*range(-10, 11), 0, 0, 0, 0, 0)


def fft_frequencies(height: int, width: int) -> Tensor:
    """(height, width // 2 + 1 + width % 2) the magnitude of each frequency of a real 2-D
    FFT, sqrt(fx^2 + fy^2) (lucent's ``rfft2d_freqs``: one more column for an odd width,
    which the inverse FFT drops).

    >>> fft_frequencies(4, 4)[:, 0].tolist()
    [0.0, 0.25, 0.5, 0.25]
    """
    fy = torch.fft.fftfreq(height, dtype=torch.float64)[:, None]
    columns = width // 2 + 2 if width % 2 else width // 2 + 1
    fx = torch.fft.fftfreq(width, dtype=torch.float64)[:columns]
    return torch.sqrt(fx * fx + fy * fy)


def spectrum_scale(height: int, width: int, decay: float = 1.0) -> Tensor:
    """1 / max(f, 1 / max(height, width))^decay for each frequency f (float32)."""
    return (1.0 / fft_frequencies(height, width).clamp(min=1.0 / max(height, width)) ** decay).float()


def recorrelate_colours(images: Tensor) -> Tensor:
    """``images`` (N, 3, H, W) with each pixel's colour multiplied by
    :data:`.COLOR_CORRELATION_NORMALIZED` (lucent's ``_linear_decorrelate_color``)."""
    matrix = COLOR_CORRELATION_NORMALIZED.to(images)
    return torch.einsum("nchw,dc->ndhw", images, matrix)


class FourierImage:
    """``batch`` images (3, height, width) in the decorrelated Fourier parameterisation of
    lucent's ``image(w, h, fft=True, decorrelate=True)``; ``sd`` the spread of the initial
    spectrum. Call it for the images (N, 3, H, W) in [0, 1]."""

    def __init__(
        self,
        batch: int,
        height: int,
        width: int,
        *,
        decay: float = 1.0,
        sd: float = 0.01,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ):
        self.size = (height, width)
        frequencies = fft_frequencies(height, width)
        shape = (batch, 3, *frequencies.shape, 2)
        self.spectrum = (torch.randn(shape, generator=generator, device=device) * sd).requires_grad_()
        self.scale = spectrum_scale(height, width, decay).to(device)[None, None, ..., None]

    def parameters(self) -> list[Tensor]:
        return [self.spectrum]

    def __call__(self) -> Tensor:
        spectrum = torch.view_as_complex((self.scale * self.spectrum).contiguous())
        image = torch.fft.irfftn(spectrum, s=self.size, norm="ortho") / MAGIC
        return torch.sigmoid(recorrelate_colours(image))


class MagnitudeImage:
    """MaCo's ``batch`` images (3, height, width): a fixed magnitude spectrum (3, height,
    width // 2 + 1), ``magnitude`` or by default the power law 1 / max(f, 1 / max(h, w)),
    and an optimised phase (initialised N(0, ``std``)). Call it for the images in [0, 1]."""

    def __init__(
        self,
        batch: int,
        height: int,
        width: int,
        *,
        magnitude: Tensor | None = None,
        std: float = 1.0,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ):
        self.size = (height, width)
        columns = width // 2 + 1
        if magnitude is None:
            magnitude = spectrum_scale(height, width)[:, :columns].expand(3, -1, -1)
        if tuple(magnitude.shape) != (3, height, columns):
            raise ValueError(
                f"magnitude must be (3, {height}, {columns}) for {height} x {width} images, "
                f"got {tuple(magnitude.shape)}"
            )
        self.magnitude = magnitude.to(device=device, dtype=torch.float32)
        self.phase = (torch.randn(batch, 3, height, columns, generator=generator, device=device) * std).requires_grad_()

    def parameters(self) -> list[Tensor]:
        return [self.phase]

    def __call__(self) -> Tensor:
        phase = _standardised(self.phase)
        spectrum = torch.complex(torch.cos(phase) * self.magnitude, torch.sin(phase) * self.magnitude)
        image = _standardised(torch.fft.irfft2(spectrum, s=self.size))
        return torch.sigmoid(recorrelate_colours(image))


def _standardised(x: Tensor) -> Tensor:
    """Each image of ``x`` (N, ...) minus its mean, over its standard deviation (+ 1e-5)."""
    flat = x.flatten(1)
    mean, std = flat.mean(dim=1), flat.std(dim=1, unbiased=False)
    shape = (-1,) + (1,) * (x.dim() - 1)
    return (x - mean.view(shape)) / (std.view(shape) + 1e-5)


def natural_magnitude(images: Tensor, height: int, width: int) -> Tensor:
    """MaCo's magnitude from ``images`` (N, 3, H, W) pixels in [0, 1]: the mean magnitude of
    their real 2-D spectra, in the colour space that :func:`.recorrelate_colours` maps back
    from, resized to (3, height, width // 2 + 1)."""
    inverse = torch.linalg.inv(COLOR_CORRELATION_NORMALIZED.double()).to(images)
    decorrelated = torch.einsum("nchw,dc->ndhw", images - images.mean(dim=(2, 3), keepdim=True), inverse)
    magnitude = torch.fft.rfft2(decorrelated).abs().mean(dim=0)
    return F.interpolate(magnitude[None], size=(height, width // 2 + 1), mode="bilinear", align_corners=False)[0]


def robust_views(
    images: Tensor,
    copies: int,
    size: Sequence[int],
    generator: torch.Generator,
    *,
    pad: int = 12,
    jitter: int = 8,
    scales: Sequence[float] = SCALES,
    angles: Sequence[float] = ANGLES,
    jitter_after: int = 4,
) -> Tensor:
    """``(N * copies, 3, *size)`` views of ``images`` (N, 3, H, W): each padded by ``pad`` grey
    pixels, shifted by up to ``jitter`` // 2 pixels, scaled by one of ``scales``, rotated by
    one of ``angles`` (degrees) and shifted by up to ``jitter_after`` // 2 pixels, read out
    at ``size`` (one bilinear ``grid_sample`` for all; grey beyond the image)."""
    n, _, height, width = images.shape
    rows = n * copies
    device = images.device

    def pick(values: Sequence[float]) -> Tensor:
        table = torch.tensor(list(values), dtype=torch.float32, device=device)
        return table[torch.randint(len(table), (rows,), generator=generator, device=device)]

    def shift(most: int) -> Tensor:
        return torch.randint(-(most // 2), most // 2 + 1, (rows, 2), generator=generator, device=device).float()

    scale, angle = pick(scales), pick(angles) * math.pi / 180
    first, second = shift(jitter), shift(jitter_after)
    window = torch.tensor([(width + 2 * pad) / 2, (height + 2 * pad) / 2], device=device)
    to_unit = torch.tensor([2 / width, 2 / height], device=device)
    cos, sin = torch.cos(angle), torch.sin(angle)
    rotation = torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)  # R(-angle)
    # output (normalised) -> window pixels -> undo the second shift, rotation, scale, first shift -> input units
    linear = to_unit[None, :, None] * rotation * (window / scale[:, None])[:, None, :]
    offset = -to_unit * ((rotation @ second[..., None])[..., 0] / scale[:, None] + first)
    grid = F.affine_grid(torch.cat([linear, offset[..., None]], dim=2), [rows, 3, *size], align_corners=False)
    source = images.repeat_interleave(copies, dim=0) - 0.5
    return F.grid_sample(source, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + 0.5


def random_crops(
    images: Tensor, copies: int, size: Sequence[int], generator: torch.Generator, *, box: float, noise: float
) -> Tensor:
    """MaCo's views: ``(N * copies, 3, *size)`` square crops of ``images`` (N, 3, H, W), centres
    0.5 + N(0, 0.15) and sides ``box`` + N(0, 0.05) (clipped to [0.05, 1]) of the image,
    resized (bilinear), plus noise N(0, ``noise``) and U(-noise / 2, noise / 2)."""
    rows, device = images.shape[0] * copies, images.device
    centre = 0.5 + 0.15 * torch.randn(rows, 2, generator=generator, device=device)
    side = (box + 0.05 * torch.randn(rows, generator=generator, device=device)).clamp(0.05, 1.0)
    zero = torch.zeros_like(side)
    linear = torch.stack([torch.stack([side, zero], -1), torch.stack([zero, side], -1)], -2)
    grid = F.affine_grid(torch.cat([linear, (2 * centre - 1)[..., None]], dim=2), [rows, 3, *size], align_corners=False)
    crops = F.grid_sample(
        images.repeat_interleave(copies, dim=0), grid, mode="bilinear", padding_mode="reflection", align_corners=False
    )
    jitter = noise * torch.randn(crops.shape, generator=generator, device=device)
    return crops + jitter + noise * (torch.rand(crops.shape, generator=generator, device=device) - 0.5)
