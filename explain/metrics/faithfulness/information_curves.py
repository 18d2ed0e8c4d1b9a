"""Performance information curves (PIC): how much of the class's score comes back as the most
salient pixels are revealed on a blurred copy of the image, against how much information the
revealed image holds. The softmax information curve (SIC) reads the class's probability, the
accuracy information curve (AIC) whether the class is the top one.

The blurred copies, the information estimate and the curve follow the PAIR ``saliency``
package's ``saliency.metrics.pic`` (the reference implementation): missing pixels are
interpolated linearly over a Delaunay triangulation of the known ones (scipy), a copy's
information is its size compressed as lossless WebP (Pillow), on the image's 8-bit pixels. That
work runs on the CPU, image by image; the model passes run in batches on the images' device.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ...checks import checked_number
from ...drawing import denormalize
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Pairs, Score, pairs_of, perturbed_scores, probability_and_hit

__all__ = ["PIC_THRESHOLDS", "compressed_size", "eight_bit", "interpolated_image", "pic", "pic_curve", "random_pixels"]

#: The shares of the most salient pixels revealed, as in PAIR's example.
PIC_THRESHOLDS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.07, 0.10, 0.13, 0.21, 0.34, 0.5, 0.75)


def eight_bit(images: Tensor, normalization: tuple[Sequence[float], Sequence[float]] | None) -> np.ndarray:
    """The images' 8-bit pixels, (N, H, W, C) uint8: ``normalization`` (mean, std) undone
    (None: images in [0, 1]), then rounded from [0, 255].

    >>> eight_bit(torch.full((1, 1, 1, 1), 0.5), None).ravel().tolist()
    [128]
    """
    if normalization is None:
        low, high = float(images.min()), float(images.max())
        if low < -1e-6 or high > 1 + 1e-6:
            raise ValueError(
                f"PIC reads the images' 8-bit pixels, but these lie in [{low:.3g}, {high:.3g}], not [0, 1]: pass "
                "normalization=(mean, std) of the model's preprocessing (explain.normalization_of(preprocess))"
            )
        unit = images.detach().clamp(0, 1)
    else:
        unit = denormalize(images, *normalization)
    return (unit.float() * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def random_pixels(pixels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """PAIR's ``generate_random_mask`` for one 8-bit image (H, W, C): ``int(H W fraction)``
    pixels drawn without replacement, from ``seed`` and the image's own pixels, so that an
    image gets the same mask in any batch and for every method, and two images different ones.

    >>> int(random_pixels(np.zeros((10, 10, 3), np.uint8), 0.05, 0).sum())
    5
    """
    height, width = pixels.shape[:2]
    generator = np.random.default_rng([seed, zlib.crc32(np.ascontiguousarray(pixels).tobytes())])
    chosen = generator.choice(height * width, size=int(height * width * fraction), replace=False)
    mask = np.zeros(height * width, dtype=bool)
    mask[chosen] = True
    return mask.reshape(height, width)


def interpolated_image(pixels: np.ndarray, known: np.ndarray) -> np.ndarray:
    """The 8-bit image (H, W, C) with its unknown pixels (``known`` False, (H, W))
    interpolated linearly over the Delaunay triangulation of the known ones (the four corners
    always known, so the triangles cover the image), rounded: PAIR's
    ``create_blurred_image``. The triangulation is scipy's (the one ``griddata`` makes); each
    triangle's pixels take their barycentric mix of its corners, the barycentric weights
    computed exactly in integers on the pixel grid (``griddata`` searches each pixel's
    triangle, which costs seconds per copy at 224 x 224), once for every channel.

    >>> image = np.array([[[0], [10]], [[20], [30]]], np.uint8)
    >>> interpolated_image(image, np.zeros((2, 2), bool)).ravel().tolist()   # the corners are all there is
    [0, 10, 20, 30]
    """
    from scipy.spatial import Delaunay

    known = known.copy()
    height, width = known.shape
    known[[0, 0, height - 1, height - 1], [0, width - 1, 0, width - 1]] = True
    if known.all():
        return pixels.copy()
    points = np.argwhere(known)
    corners = points[Delaunay(points.astype(np.float64)).simplices]  # (T, 3, 2) integer rows and columns
    rows, columns, triangle, parts, total = _triangle_pixels(corners)
    unknown = ~known[rows, columns]
    values = pixels[corners[..., 0], corners[..., 1]].astype(np.float64)[triangle[unknown]]  # (P, 3, C)
    # integer numerators times 8-bit values: the sums are exact, the division rounds once
    filled = np.einsum("pk,pkc->pc", parts[unknown].astype(np.float64), values) / total[unknown, None]
    out = pixels * known[..., None].astype(np.float32)
    out[rows[unknown], columns[unknown]] = filled
    covered = known.copy()
    covered[rows, columns] = True
    out[~covered] = pixels.mean(axis=(0, 1))  # outside every triangle: PAIR's fill (never, with the corners)
    return np.round(out).astype(np.uint8)


def _triangle_pixels(corners: np.ndarray) -> tuple[np.ndarray, ...]:
    """The pixels inside (or on an edge of) each triangle of ``corners`` (T, 3, 2): their
    rows, columns and triangle, their barycentric numerators (P, 3) and the denominator
    (P,), twice the triangle's area, all integers."""
    low, high = corners.min(1), corners.max(1)
    extent = high - low + 1
    counts = extent[:, 0] * extent[:, 1]
    triangle = np.repeat(np.arange(len(corners)), counts)
    local = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    rows = low[triangle, 0] + local // extent[triangle, 1]
    columns = low[triangle, 1] + local % extent[triangle, 1]
    point = np.stack([rows, columns], 1)
    a, b, c = (corners[triangle, k] for k in range(3))

    def area(p, q, r):  # twice the signed area of the triangle (p, q, r)
        return (q[:, 0] - p[:, 0]) * (r[:, 1] - p[:, 1]) - (q[:, 1] - p[:, 1]) * (r[:, 0] - p[:, 0])

    total = area(a, b, c)
    parts = np.stack([area(point, b, c), area(a, point, c), area(a, b, point)], 1) * np.sign(total)[:, None]
    inside = (parts >= 0).all(1) & (total != 0)
    return rows[inside], columns[inside], triangle[inside], parts[inside], np.abs(total)[inside]


def compressed_size(pixels: np.ndarray) -> int:
    """PAIR's information estimate of an 8-bit image (H, W, C): its size in bytes as a
    lossless WebP (quality 100)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(
        buffer, format="webp", lossless=True, quality=100
    )
    return buffer.tell()


def pic_curve(
    sizes: np.ndarray, predictions: np.ndarray, *, min_prediction: float, keep_monotonous: bool, points: int
) -> np.ndarray | None:
    """One image's PIC, (points + 1,) over [0, 1]: PAIR's ``compute_pic_metric`` from the
    compressed ``sizes`` and ``predictions`` of the original image, the fully blurred one and
    each threshold's, in that order. None where PAIR raises ``ComputePicMetricError``: the
    original's prediction is below ``min_prediction``, or the fully blurred image holds as
    much information or scores as high."""
    from scipy.interpolate import interp1d

    original, blurred = predictions[0], predictions[1]
    if original < min_prediction or sizes[1] >= sizes[0] or blurred >= original:
        return None
    entropy = np.clip((sizes[2:] - sizes[1]) / (sizes[0] - sizes[1]), 0.0, 1.0)
    score = np.clip((predictions[2:] - blurred) / (original - blurred), 0.0, 1.0)
    if keep_monotonous:
        score = np.maximum.accumulate(score)
    curve = interp1d(x=[*entropy, 0.0, 1.0], y=[*score, 0.0, 1.0])
    return np.append(curve(np.linspace(0.0, 1.0, points, endpoint=False)), 1.0)


class _Copies:
    """The original, fully blurred and thresholded copies of each image, made as the model's
    batches need them, with their compressed sizes."""

    def __init__(self, pairs: Pairs, pixels: np.ndarray, thresholds: Sequence[float], fraction: float, seed: int):
        self.pairs, self.pixels, self.thresholds = pairs, pixels, list(thresholds)
        self.maps = pairs.maps.cpu().numpy()
        self.random: dict[int, np.ndarray] = {}
        self.sizes = np.zeros((len(self.maps), len(self.thresholds) + 2))
        self.fraction, self.seed = fraction, seed

    def copy(self, row: int, column: int) -> np.ndarray:
        image = self.pixels[row // self.pairs.per_image]
        if column == 0:
            out = image
        elif column == 1:
            out = interpolated_image(image, self.random[row])
        else:
            saliency = self.maps[row]
            revealed = saliency >= np.quantile(saliency, 1 - self.thresholds[column - 2])
            out = interpolated_image(image, revealed | self.random[row])
        self.sizes[row, column] = compressed_size(out)
        return out

    def batch(self, rows: Tensor, columns: Tensor, normalization) -> Tensor:
        """A batch of copies in the model's input space. They are made on as many threads as
        torch uses (the triangulation, the rasterisation and the encoding release the GIL)."""
        from concurrent.futures import ThreadPoolExecutor

        for row in set(rows.tolist()) - set(self.random):  # before the threads, which only read it
            self.random[row] = random_pixels(self.pixels[row // self.pairs.per_image], self.fraction, self.seed)
        cells = list(zip(rows.tolist(), columns.tolist(), strict=True))
        with ThreadPoolExecutor(max_workers=max(1, min(len(cells), torch.get_num_threads()))) as pool:
            pixels = np.stack(list(pool.map(lambda cell: self.copy(*cell), cells)))
        images = self.pairs.images
        unit = torch.from_numpy(pixels).to(images.device).permute(0, 3, 1, 2).to(images.dtype) / 255
        if normalization is None:
            return unit
        mean, std = (torch.as_tensor(v, dtype=images.dtype, device=images.device).view(-1, 1, 1) for v in normalization)
        return (unit - mean) / std


@with_pass_options
def pic(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    normalization: tuple[Sequence[float], Sequence[float]] | None = None,
    thresholds: Sequence[float] = PIC_THRESHOLDS,
    random_fraction: float = 0.01,
    min_probability: float = 0.8,
    keep_monotonous: bool = True,
    points: int = 1000,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Score:
    """Softmax and accuracy information curves (SIC, AIC): the area under the class's
    normalised probability (SIC) or accuracy (AIC) against the normalised information of a
    blurred copy of the image on which the most salient pixels are revealed (higher is
    better for both).

    Kapishnikov, Bolukbasi, Viegas & Terry, "XRAI: Better Attributions Through Regions",
    ICCV 2019, as used by Kapishnikov et al., "Guided Integrated Gradients",
    CVPR 2021, and implemented by PAIR's ``saliency.metrics.pic``: a copy keeps the top
    ``thresholds`` share of the map's pixels and a ``random_fraction`` of random ones (drawn
    from ``seed`` and the image's pixels) and interpolates the rest; its information is its
    lossless WebP size, normalised between the fully blurred copy (the random pixels only)
    and the original; its score is the class's probability (SIC) or 1 where the class is the
    top one (AIC), normalised likewise and, with ``keep_monotonous``, never falling. The
    curve, interpolated at ``points`` points over [0, 1], and its area follow PAIR's code.
    Images whose original probability is below ``min_probability`` (AIC: that are not
    classified as the target), whose fully blurred copy is not less informative or scores
    as high, score NaN, as PAIR skips them; the papers aggregate over images with the median.

    ``normalization`` (mean, std) of the model's preprocessing recovers the 8-bit pixels
    (None: images in [0, 1]); every copy, the original too, is run from its 8-bit pixels.
    ``values`` hold the SIC area, ``extra["aic"]`` the AIC's; ``curves`` both curves.
    """
    pairs = pairs_of(model, images, explanation, targets)
    thresholds = _checked_thresholds(thresholds)
    fraction = checked_number("random_fraction", random_fraction, positive=False)
    if fraction >= 1:
        raise ValueError(f"random_fraction must be a share of the pixels below 1, got {random_fraction}")
    seed = int(torch.randint(2**31, ())) if seed is None else seed
    copies = _Copies(pairs, eight_bit(images, normalization), thresholds, fraction, seed)
    predictions = perturbed_scores(
        model,
        pairs.images,
        pairs.targets,
        len(thresholds) + 2,
        lambda rows, columns: copies.batch(rows, columns, normalization),
        batch_size=batch_size,
        score=probability_and_hit,
    )
    return _pic_score(pairs, copies.sizes, predictions.double().cpu().numpy(), min_probability, keep_monotonous, points)


def _checked_thresholds(thresholds: Sequence[float]) -> list[float]:
    values = [float(t) for t in thresholds]
    if not values or any(not 0 < t < 1 for t in values) or values != sorted(values):
        raise ValueError(f"thresholds must be shares of the pixels in (0, 1), ascending, got {list(thresholds)}")
    return values


def _pic_score(pairs: Pairs, sizes: np.ndarray, predictions: np.ndarray, min_probability, keep, points: int) -> Score:
    x = np.append(np.linspace(0.0, 1.0, points, endpoint=False), 1.0)
    curves = {"sic": np.full((len(sizes), points + 1), np.nan), "aic": np.full((len(sizes), points + 1), np.nan)}
    for row in range(len(sizes)):
        for name, which, least in (("sic", 0, min_probability), ("aic", 1, 0.5)):
            curve = pic_curve(
                sizes[row], predictions[row, :, which], min_prediction=least, keep_monotonous=keep, points=points
            )
            if curve is not None:
                curves[name][row] = curve
    areas = {name: np.trapezoid(curve, x, axis=1) for name, curve in curves.items()}
    device = pairs.images.device

    def tensor(array: np.ndarray) -> Tensor:
        return pairs.unflatten(torch.as_tensor(array, dtype=torch.float32, device=device))

    return Score(
        metric="sic",
        values=tensor(areas["sic"]),
        higher_is_better=True,
        curves={name: tensor(curve) for name, curve in curves.items()},
        steps=torch.as_tensor(x, dtype=torch.float32),
        extra={"aic": tensor(areas["aic"])},
    )
