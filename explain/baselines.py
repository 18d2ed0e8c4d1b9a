"""Reference inputs and seeded randomness, shared by the attribution methods and the metrics:
baselines chosen by name (:func:`make_baselines`) and a block run on its own seeded random
streams (:func:`seeded`)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor

from .concurrency import process_lock

__all__ = ["BASELINES", "gaussian_filter", "make_baselines", "seeded"]

#: The baselines selectable by name (a number or a tensor is taken as it is).
BASELINES = ("zeros", "blur", "noise")


@contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Run a block on its own random streams, torch's and numpy's global one (captum's
    GradientShap draws from numpy), seeded with ``seed``; the caller's streams are left as
    they were. ``None``: the caller's streams, unseeded.

    The streams are the process's, so seeded blocks of different threads take turns
    (:data:`~explain.concurrency.process_lock`)."""
    if seed is None:
        yield
        return
    with process_lock:
        numpy_state = np.random.get_state()
        # manual_seed reseeds every CUDA device, so every one is forked, not just the input's.
        devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                np.random.seed(seed)
                yield
        finally:
            np.random.set_state(numpy_state)


def _gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    import torchvision.transforms.v2.functional as TF

    height, width = images.shape[-2:]
    # torchvision pads by reflection, which needs the kernel's half-width below the side.
    size = min(2 * math.ceil(3 * sigma) + 1, 2 * ((min(height, width) - 1) // 2) + 1)
    # Two 1-D passes (the kernel is separable): (k + k) rather than k * k products per pixel.
    blurred = TF.gaussian_blur(images, kernel_size=[size, 1], sigma=[sigma, sigma])
    return TF.gaussian_blur(blurred, kernel_size=[1, size], sigma=[sigma, sigma])


def gaussian_filter(images: Tensor, sigma: float, radius: int | None = None) -> Tensor:
    """``images`` (N, C, H, W) under a Gaussian blur of ``sigma`` pixels, each channel on its
    own, zeros beyond the image: scipy's ``ndimage.gaussian_filter(mode="constant")`` over
    the two spatial axes, the kernel cut at ``radius`` (default ``int(4 sigma + 0.5)``, scipy's)
    and summing to one. Sigma 0 returns the images. What the paths of Blur IG and the
    perturbations of extremal perturbations blur with; in the images' dtype and device.

    >>> dot = torch.zeros(1, 1, 9, 9); dot[0, 0, 4, 4] = 1.0
    >>> round(gaussian_filter(dot, 1.0).sum().item(), 6), gaussian_filter(dot, 0.0).equal(dot)
    (1.0, True)
    """
    if sigma == 0:
        return images
    radius = int(4.0 * sigma + 0.5) if radius is None else radius
    offsets = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum()
    if radius > FFT_RADIUS:
        return _blur_axis_fft(_blur_axis_fft(images, kernel, -2), kernel, -1)
    channels = images.shape[1]
    rows = torch.nn.functional.conv2d(
        images, kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1), padding=(radius, 0), groups=channels
    )
    return torch.nn.functional.conv2d(
        rows, kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1), padding=(0, radius), groups=channels
    )


#: The kernel radius above which :func:`gaussian_filter` convolves through the FFT, whose cost
#: does not grow with the kernel: on 8 images of 224 x 224 on a 2-core CPU, a direct
#: convolution takes 37 to 55 ms in float32 and 0.18 to 0.42 s in float64 at sigma 1 to 5
#: (801 taps at sigma 100: seconds), the FFT 9 to 29 ms.
FFT_RADIUS = 3


def _blur_axis_fft(images: Tensor, kernel: Tensor, dim: int) -> Tensor:
    """``images`` convolved along ``dim`` with the symmetric ``kernel`` (zeros beyond the
    image), through a real FFT long enough that nothing wraps around."""
    size, radius = images.shape[dim], len(kernel) // 2
    length = size + 2 * radius
    spectrum = torch.fft.rfft(images, n=length, dim=dim)
    shape = [1] * images.dim()
    shape[dim] = -1
    filtered = torch.fft.irfft(spectrum * torch.fft.rfft(kernel, n=length).view(shape), n=length, dim=dim)
    return filtered.narrow(dim, radius, size).contiguous()


def make_baselines(
    images: Tensor, baseline: str | float | Tensor = "zeros", *, blur_sigma: float | None = None
) -> Tensor:
    """The reference input of each image, in the model's input space.

    - ``"zeros"``: all zeros. For inputs normalised with ``Normalize(mean, std)``, as
      torchvision and timm models expect, that is every pixel at the dataset's ``mean``
      colour (a flat grey-brown for ImageNet), not black;
    - ``"blur"``: the image under a Gaussian blur (sigma = ``blur_sigma``, default a tenth
      of the longer side): the image with its details, but not its colours, removed;
    - ``"noise"``: uniform noise between each channel's minimum and maximum in the image
      (in the volume or signal);
      draw it inside :func:`seeded` for reproducible runs;
    - a number, or a tensor that broadcasts to ``images``, taken as it is.

    >>> x = torch.rand(2, 3, 8, 8)
    >>> make_baselines(x).abs().sum().item(), make_baselines(x, "blur").shape
    (0.0, torch.Size([2, 3, 8, 8]))
    """
    if isinstance(baseline, Tensor):
        try:
            return torch.broadcast_to(baseline.to(images.device, images.dtype), images.shape).contiguous()
        except RuntimeError:
            raise ValueError(
                f"a baseline tensor of shape {tuple(baseline.shape)} does not broadcast to the "
                f"images' shape {tuple(images.shape)}"
            ) from None
    if isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
        return torch.full_like(images, float(baseline))
    if baseline == "zeros":
        return torch.zeros_like(images)
    if baseline == "blur":
        if images.dim() != 4:
            raise ValueError(
                f"the blur baseline blurs images (N, C, H, W), not inputs of shape {tuple(images.shape)}; "
                "use baseline='zeros' or 'noise' for volumes and signals"
            )
        sigma = blur_sigma if blur_sigma is not None else max(images.shape[-2:]) / 10
        if not sigma > 0:
            raise ValueError(f"blur_sigma must be positive, got {sigma}")
        return _gaussian_blur(images, float(sigma))
    if baseline == "noise":
        space = tuple(range(2, images.dim()))  # (N, C, ...): per image and channel
        low = images.amin(dim=space, keepdim=True)
        high = images.amax(dim=space, keepdim=True)
        return low + (high - low) * torch.rand_like(images)
    raise ValueError(
        f"unknown baseline {baseline!r}; use one of {', '.join(BASELINES)}, a number, or a tensor "
        "that broadcasts to the images"
    )
