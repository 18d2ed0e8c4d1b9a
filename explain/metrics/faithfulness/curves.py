"""The perturbation curves: the class score as ever more of the image is removed (or restored)
in the map's order, and the area under (or over) that curve. Deletion and insertion (RISE),
pixel-flipping, region perturbation, selectivity and IROF."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...baselines import make_baselines, seeded
from ...checks import checked_number, positive_int
from ...explanation import Explanation
from ...passes import with_pass_options
from ...superpixels import superpixels
from ..base import Score, pairs_of, perturbation_curve, ranks
from .perturbing import baselines_for, block_keys, step_pixels

__all__ = ["blurred", "deletion", "insertion", "irof", "pixel_flipping", "region_perturbation", "selectivity"]


def _petsiuk_curve(model, pairs, *, insert: bool, step, substrate, batch_size, score, name: str) -> Score:
    height, width = pairs.images.shape[-2:]
    pixels = height * width
    per_step = step_pixels(step, height, width)
    n_steps = math.ceil(pixels / per_step)
    counts = torch.clamp(torch.arange(n_steps + 1) * per_step, max=pixels)
    keys = ranks(pairs.maps)
    # Deletion moves from the image to the substrate; insertion from the substrate to the image.
    start, finish = (substrate, pairs.images) if insert else (pairs.images, substrate)
    curve = perturbation_curve(model, start, pairs.targets, keys, counts, finish, batch_size=batch_size, score=score)
    # The trapezoid rule on n_steps equal intervals of [0, 1], as in the paper's code.
    auc = (curve.sum(1) - (curve[:, 0] + curve[:, -1]) / 2) / n_steps
    return Score(
        metric=name,
        values=pairs.unflatten(auc),
        higher_is_better=insert,
        curves={name: pairs.unflatten(curve)},
        steps=counts.float() / pixels,
    )


@with_pass_options
def deletion(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    step: int | float | None = None,
    baseline: str | float | Tensor = "zeros",
    batch_size: int | None = None,
    score: str = "probability",
) -> Score:
    """Deletion: the area under the explained class's probability as the most salient
    pixels are removed first (lower is better).

    Petsiuk, Das & Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box
    Models", BMVC 2018. Step ``i`` replaces the ``i * step`` highest-ranked pixels (all
    channels) with the ``baseline`` (zeros in the model's input space, as in the paper's
    code: the dataset's mean colour for normalised inputs); the curve runs from the intact
    image to the fully removed one, and the area is the trapezoid rule over equal steps on
    [0, 1]. ``step`` is pixels per step, a fraction of the image, or ``None`` for one row's
    worth (224 pixels at 224 x 224, the paper's setting).

    Returns a :class:`Score` whose ``curves["deletion"]`` holds the probabilities at
    ``steps`` (the fraction of pixels removed).

    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2, bias=False))
    >>> with torch.no_grad():
    ...     _ = model[1].weight.copy_(torch.tensor([[1.0, 1, 0, 0], [0, 0, 0, 0]]))
    >>> image = torch.ones(1, 1, 2, 2)
    >>> oracle = torch.tensor([[[1.0, 0.9], [0.1, 0.0]]])   # the two pixels class 0 reads
    >>> result = deletion(model, image, oracle, torch.tensor([0]), step=1, score="logit")
    >>> result.curves["deletion"].tolist(), result.values.tolist()
    ([[2.0, 1.0, 0.0, 0.0, 0.0]], [0.5])
    """
    pairs = pairs_of(model, images, explanation, targets)
    return _petsiuk_curve(
        model,
        pairs,
        insert=False,
        step=step,
        substrate=baselines_for(pairs, baseline),
        batch_size=batch_size,
        score=score,
        name="deletion",
    )


def blurred(images: Tensor, kernel_size: int = 11, sigma: float = 5.0) -> Tensor:
    """The images under a Gaussian blur: Petsiuk et al.'s insertion substrate (kernel 11,
    sigma 5, as in the paper's code), the kernel cut to the image on images smaller than it."""
    import torchvision.transforms.v2.functional as TF

    # torchvision pads by reflection, which needs the kernel's half-width below the side.
    kernel_size = min(kernel_size, 2 * min(images.shape[-2:]) - 1)

    return TF.gaussian_blur(images, kernel_size=[kernel_size, kernel_size], sigma=[sigma, sigma])


@with_pass_options
def insertion(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    step: int | float | None = None,
    blur_kernel: int = 11,
    blur_sigma: float = 5.0,
    batch_size: int | None = None,
    score: str = "probability",
) -> Score:
    """Insertion: the area under the explained class's probability as the most salient
    pixels are restored first onto a blurred copy of the image (higher is better).

    Petsiuk, Das & Saenko, "RISE", BMVC 2018. The substrate is the image under a Gaussian
    blur (kernel ``blur_kernel``, sigma ``blur_sigma``: the paper's 11 and 5); step ``i``
    puts back the ``i * step`` highest-ranked pixels. The curve and area are as in
    :func:`deletion`; ``curves["insertion"]`` holds the curve.
    """
    pairs = pairs_of(model, images, explanation, targets)
    substrate = blurred(
        pairs.images, positive_int("blur_kernel", blur_kernel), checked_number("blur_sigma", blur_sigma, positive=True)
    )
    return _petsiuk_curve(
        model, pairs, insert=True, step=step, substrate=substrate, batch_size=batch_size, score=score, name="insertion"
    )


@with_pass_options
def pixel_flipping(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    step: int | float = 0.01,
    baseline: str | float | Tensor = "zeros",
    batch_size: int | None = None,
    score: str = "logit",
) -> Score:
    """Pixel-flipping: the explained class's score as the most relevant pixels are
    replaced first; the area under that curve (lower is better).

    Bach et al., "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by
    Layer-Wise Relevance Propagation", PLOS ONE 2015, as Samek et al. (2017) use it. The
    score is the class's logit (the classifier's output f(x) of the papers; ``score=
    "probability"`` for the softmax); ``step`` pixels (all channels) are replaced with the
    ``baseline`` per step: 1 % of the image by default (Quantus flips one channel value per
    step, which costs C x H x W passes per image). ``curves["pixel-flipping"]`` holds the curve from
    the intact image on; the area is the trapezoid rule on [0, 1] as in :func:`deletion`.
    """
    pairs = pairs_of(model, images, explanation, targets)
    return _petsiuk_curve(
        model,
        pairs,
        insert=False,
        step=step,
        substrate=baselines_for(pairs, baseline),
        batch_size=batch_size,
        score=score,
        name="pixel-flipping",
    )


@with_pass_options
def region_perturbation(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    patch_size: int = 9,
    regions: int = 100,
    baseline: str | float | Tensor = "noise",
    batch_size: int | None = None,
    score: str = "logit",
    seed: int | None = 0,
) -> Score:
    """Region perturbation: the area over the perturbation curve (AOPC) as the most
    relevant regions are perturbed first (higher is better).

    Samek et al., "Evaluating the Visualization of What a Deep Neural Network Has
    Learned", IEEE TNNLS 2017: AOPC = 1/(L+1) sum_{k=0..L} (f(x) - f(x_k)), x_k the image
    with its ``k`` most relevant regions replaced, f the class's logit, L = ``regions``.
    Regions are the squares of a ``patch_size`` grid (9 x 9, the paper's size; centred
    where the side is not a multiple) ranked by their summed relevance, as Quantus's
    RegionPerturbation tiles them (the paper takes
    the 9 x 9 window around each next most relevant pixel, which may overlap earlier
    ones). Replaced values come from the ``baseline``: uniform noise within each channel's
    range by default, as in the paper (Quantus's default is the image's minimum), drawn
    once per image from ``seed``.

    ``curves["region-perturbation"]`` holds f(x) - f(x_k) for k = 0..L.
    """
    pairs = pairs_of(model, images, explanation, targets)
    patch_size, regions = positive_int("patch_size", patch_size), positive_int("regions", regions)
    keys, total = block_keys(pairs.maps, patch_size)
    regions = min(regions, total)
    k = pairs.per_image
    if isinstance(baseline, str) and baseline == "noise":
        noisy = []
        for image in pairs.images[::k]:  # each image on the same seeded stream, whatever its position
            with seeded(seed, pairs.images.device):
                noisy.append(make_baselines(image[None], baseline))
        substrate = torch.cat(noisy).repeat_interleave(k, dim=0)
    else:
        substrate = baselines_for(pairs, baseline)
    counts = torch.arange(regions + 1)
    curve = perturbation_curve(
        model, pairs.images, pairs.targets, keys, counts, substrate, batch_size=batch_size, score=score
    )
    drops = curve[:, :1] - curve
    return Score(
        metric="region-perturbation",
        values=pairs.unflatten(drops.mean(1)),
        higher_is_better=True,
        curves={"region-perturbation": pairs.unflatten(drops)},
        steps=counts.float(),
    )


@with_pass_options
def selectivity(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    patch_size: int = 16,
    baseline: str | float | Tensor = "zeros",
    batch_size: int | None = None,
    score: str = "logit",
) -> Score:
    """Selectivity: the area under the class's score as the image's patches are removed,
    most relevant first, until none is left (lower is better: a selective map names first
    what the score needs).

    Montavon, Samek & Mueller, "Methods for Interpreting and Understanding Deep Neural
    Networks", Digital Signal Processing 2018 (explanation selectivity): features are
    removed in order of decreasing relevance and the function value f(x) should fall
    sharply. Features are the squares of a ``patch_size`` grid (centred where the side is
    not a multiple: 196 patches at 224 px; Quantus's default 8 makes 784), ranked by their
    summed relevance, all channels set to the
    ``baseline`` (zeros in the model's input space); f is the class's logit (``score``).
    ``curves["selectivity"]`` holds the score from the intact image to every patch removed;
    the area is the trapezoid rule on [0, 1], as :func:`deletion`'s. (Quantus's curve starts
    after the first removal and its area is in patch units.)
    """
    pairs = pairs_of(model, images, explanation, targets)
    keys, total = block_keys(pairs.maps, positive_int("patch_size", patch_size))
    counts = torch.arange(total + 1)
    curve = perturbation_curve(
        model,
        pairs.images,
        pairs.targets,
        keys,
        counts,
        baselines_for(pairs, baseline),
        batch_size=batch_size,
        score=score,
    )
    area = (curve.sum(1) - (curve[:, 0] + curve[:, -1]) / 2) / total
    return Score(
        metric="selectivity",
        values=pairs.unflatten(area),
        higher_is_better=False,
        curves={"selectivity": pairs.unflatten(curve)},
        steps=counts.float() / total,
    )


def _irof_segments(pairs, segments, n_segments: int, compactness: float) -> Tensor:
    """Each map's (H, W) segment ids: SLIC's superpixels of the images, or the given
    (N, H, W) ids checked and repeated for each of an image's targets."""
    if segments is None:
        return superpixels(pairs.images, positive_int("n_segments", n_segments), compactness)[:, 0]
    segments = torch.as_tensor(segments, device=pairs.images.device).long()
    if segments.dim() == 4 and segments.shape[1] == 1:
        segments = segments[:, 0]
    k = pairs.per_image
    if (
        segments.dim() != 3
        or len(segments) * k != len(pairs.maps)
        or segments.shape[1:] != pairs.maps.shape[1:]
        or (segments < 0).any()
    ):
        raise ValueError(
            f"segments must be (N, H, W) non-negative integer ids, one per image, at the maps' size "
            f"{tuple(pairs.maps.shape[1:])}; got {tuple(segments.shape)}"
        )
    return segments.repeat_interleave(k, dim=0)


def _segment_keys(maps: Tensor, segments: Tensor) -> tuple[Tensor, Tensor, int]:
    """Each pixel's key: the rank of its segment by mean relevance, highest first (ids
    absent from a map rank last); with each map's number of segments present and the
    number of ids."""
    m = len(maps)
    count = int(segments.max()) + 1
    flat = segments.flatten(1)
    sums = torch.zeros(m, count, device=flat.device).scatter_add_(1, flat, maps.flatten(1))
    sizes = torch.zeros(m, count, device=flat.device).scatter_add_(1, flat, torch.ones_like(maps.flatten(1)))
    present = sizes > 0
    means = torch.where(present, sums / sizes.clamp_min(1), -math.inf)  # absent ids rank last
    segment_rank = ranks(means)
    keys = segment_rank.gather(1, flat).view_as(segments)
    return keys, present.sum(1), count


def _irof_area(curve: Tensor, n: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """The curve relative to the intact image's score, held at its last value after an
    image's ``n`` segments are gone, and the area under it by the trapezoid rule on [0, 1]."""
    relative = curve / curve[:, :1].clamp_min(1e-12)
    # An image with n < count segments is fully removed at step n; its curve stops there.
    last = relative.gather(1, n[:, None])
    relative = torch.where(counts.to(relative.device)[None] > n[:, None], last, relative)
    area = torch.stack([torch.trapezoid(relative[i, : n[i] + 1], dx=1.0 / n[i].item()) for i in range(len(curve))])
    return relative, area


@with_pass_options
def irof(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    segments: Tensor | None = None,
    n_segments: int = 100,
    compactness: float = 10.0,
    batch_size: int | None = None,
    score: str = "probability",
) -> Score:
    """IROF, Iterative Removal Of Features: the area over the curve of the explained
    class's score, relative to the intact image's, as superpixels are replaced by the
    image's mean colour, most relevant (highest mean relevance) first (higher is better).

    Rieger & Hansen, "IROF: a low resource evaluation metric for explanation methods",
    ICLR Workshop 2020. Superpixels are SLIC's (:func:`~explain.superpixels.superpixels`,
    ``n_segments`` and ``compactness``) unless ``segments`` (N, H, W) integer ids are
    given. The curve runs from the intact image (1) to every segment removed; its area by
    the trapezoid rule on [0, 1] is taken from 1. (Quantus's IROF starts its curve after
    the first removal and does not divide by the number of segments n, so its value is n
    times this plus (1 + r_1) / 2, r_1 the curve after the first removal, less r_n / 2
    where an image has fewer segments than the longest in its batch, since Quantus pads
    the curves with zeros. Quantus fills with the mean of the whole batch, recomputed at
    every step; given the image's mean colour instead, its curves equal these.)

    ``curves["irof"]`` holds the relative score after each removal, padded with its last
    value where an image has fewer segments than another.
    """
    pairs = pairs_of(model, images, explanation, targets)
    segments = _irof_segments(pairs, segments, n_segments, compactness)
    keys, n, count = _segment_keys(pairs.maps, segments)
    fill = pairs.images.mean((2, 3), keepdim=True).expand_as(pairs.images)
    counts = torch.arange(count + 1)
    curve = perturbation_curve(
        model, pairs.images, pairs.targets, keys, counts, fill, batch_size=batch_size, score=score
    )
    relative, area = _irof_area(curve, n, counts)
    return Score(
        metric="irof",
        values=pairs.unflatten(1 - area),
        higher_is_better=True,
        curves={"irof": pairs.unflatten(relative)},
        steps=counts.float(),
    )
