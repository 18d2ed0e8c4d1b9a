"""Does the map's sum over a removed part predict how much the score falls? Infidelity (the
squared error of that prediction) and Sensitivity-n (its correlation), on random parts of
the image."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...checks import positive_int
from ...explanation import Explanation
from ...passes import with_pass_options
from ..base import Score, draws, pairs_of, pearson
from .perturbing import baselines_for, random_subsets, removal_effects

__all__ = ["infidelity", "sensitivity_n", "square_masks"]

#: Sensitivity-n's subset sizes, as fractions of the image's pixels: from a few pixels to
#: 80 %, as Ancona et al. vary n "from one to about 80 % of the total number of features".
SUBSET_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 0.8)


def square_masks(
    seed: int | None, samples: int, sides: list[int], height: int, width: int, device: torch.device
) -> Tensor:
    """Boolean masks (samples, H, W), each one square drawn uniformly among every square of
    the given ``sides`` at every position in the image (a side with more positions is drawn
    more often, as Yeh et al.'s code enumerates them all); draw ``s`` depends only on
    ``seed`` and ``s``.

    >>> masks = square_masks(0, 3, [2], 4, 4, torch.device("cpu"))
    >>> masks.shape, masks.flatten(1).sum(1).tolist()
    (torch.Size([3, 4, 4]), [4, 4, 4])
    """
    sizes = torch.tensor(sides, device=device)
    if (sizes < 1).any() or (sizes > min(height, width)).any():
        raise ValueError(f"patch_sizes must lie in 1..{min(height, width)} (the image's shorter side), got {sides}")
    positions = (height - sizes + 1) * (width - sizes + 1)
    u = draws(seed, list(range(samples)), (3,), device).double()
    cumulative = positions.cumsum(0).double() / positions.sum()
    side = sizes[torch.searchsorted(cumulative, u[:, 0].contiguous(), right=True).clamp_max(len(sides) - 1)]
    top = (u[:, 1] * (height - side + 1)).long()
    left = (u[:, 2] * (width - side + 1)).long()
    rows, columns = torch.arange(height, device=device), torch.arange(width, device=device)
    inside_rows = (rows >= top[:, None]) & (rows < (top + side)[:, None])
    inside_columns = (columns >= left[:, None]) & (columns < (left + side)[:, None])
    return inside_rows[:, :, None] & inside_columns[:, None, :]


def _default_sides(height: int, width: int) -> list[int]:
    """Yeh et al.'s square sides, 1 to 10 pixels on 28-pixel digits, scaled to the image."""
    side = min(height, width)
    return sorted({max(1, round(k * side / 28)) for k in range(1, 11)})


@with_pass_options
def infidelity(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    n_samples: int = 100,
    patch_sizes: list[int] | None = None,
    baseline: str | float | Tensor = "zeros",
    normalise: bool = True,
    batch_size: int | None = None,
    score: str = "logit",
    seed: int | None = 0,
) -> Score:
    """Infidelity: the mean squared error of the map's prediction of the score's drop when a
    random square of the image is removed (lower is better).

    Yeh, Hsieh, Suggala, Inouye & Ravikumar, "On the (In)fidelity and Sensitivity of
    Explanations", NeurIPS 2019: INFD = E_I[(I^T Phi - (f(x) - f(x - I)))^2],
    with the paper's square removal: I removes one square (all channels) to the
    ``baseline`` (zeros in the model's input space), and, the map being an attribution (the
    authors multiply gradients by the input for it), I^T Phi is the map's sum over the square.
    Each of ``n_samples`` squares is drawn uniformly among every square of ``patch_sizes``
    sides at every position (default: the authors' sides 1 to 10 on 28-pixel digits, scaled
    to the image: 8, 16, ..., 80 at 224 px). f is the class's logit (``score``). With
    ``normalise`` the map is first scaled by the optimal beta = E[I^T Phi Delta f] / E[(I^T
    Phi)^2], as the authors' code (and captum's ``normalize``) does, so that maps of any scale
    compare; ``normalise=False`` is the definition as written.

    The squares depend only on ``seed``: every image gets the same ones, whatever its batch.
    Quantus's Infidelity removes the squares of a grid one after another, keeping the earlier
    ones removed, multiplies the map by the input change instead of summing it, and does not
    scale the map.

    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2, bias=False))
    >>> with torch.no_grad():
    ...     _ = model[1].weight.fill_(1.0)
    >>> image = torch.rand(1, 1, 4, 4)
    >>> exact = image[:, 0]                   # each pixel's share of the logit, x_i * w_i
    >>> infidelity(model, image, exact, torch.tensor([0]), normalise=False).values.abs().max() < 1e-10
    tensor(True)
    """
    pairs = pairs_of(model, images, explanation, targets)
    height, width = pairs.images.shape[-2:]
    sides = _default_sides(height, width) if patch_sizes is None else [int(s) for s in patch_sizes]
    masks = square_masks(seed, positive_int("n_samples", n_samples), sides, height, width, pairs.images.device)
    sums, drops = removal_effects(
        model, pairs, masks, baselines_for(pairs, baseline), batch_size=batch_size, score=score
    )
    if normalise:
        denominator = sums.square().sum(1)
        beta = torch.where(denominator > 0, (sums * drops).sum(1) / denominator.clamp_min(1e-300), 0.0)
    else:
        beta = torch.ones(len(sums), dtype=sums.dtype, device=sums.device)
    error = (beta[:, None] * sums - drops).square().mean(1)
    return Score(
        metric="infidelity",
        values=pairs.unflatten(error.float()),
        higher_is_better=False,
        extra={"scale": pairs.unflatten(beta.float())},
    )


@with_pass_options
def sensitivity_n(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    fractions: tuple[float, ...] = SUBSET_FRACTIONS,
    n_samples: int = 20,
    baseline: str | float | Tensor = "zeros",
    batch_size: int | None = None,
    score: str = "logit",
    seed: int | None = 0,
) -> Score:
    """Sensitivity-n: the Pearson correlation between the map's sum over n random pixels and
    the score's drop when they are removed, averaged over the n of ``fractions`` (higher is
    better).

    Ancona, Ceolini, Oztireli & Gross, "Towards better understanding of gradient-based
    attribution methods for deep neural networks", ICLR 2018: a map satisfies
    sensitivity-n when sum_{i in S} R_i = f(x) - f(x_[x_S = 0]) for every subset S of n
    features; the test is the correlation of the two sides over subsets drawn uniformly,
    for n from a few features to about 80 % of them. Here, per image and n, ``n_samples``
    subsets of n pixels (all channels) are set to the ``baseline`` (zeros in the model's
    input space) and f is the class's logit (``score``).

    ``curves["sensitivity-n"]`` holds the correlation at each n, ``steps`` the fractions of
    the image they are; a constant map (or score) correlates 0. The subsets depend only on
    ``seed``: every image gets the same ones. (Quantus's SensitivityN removes the most
    relevant features cumulatively, not random subsets, and correlates across the images of
    a batch rather than across subsets of one image.)
    """
    pairs = pairs_of(model, images, explanation, targets)
    n_samples = positive_int("n_samples", n_samples)
    height, width = pairs.images.shape[-2:]
    counts = _subset_counts(fractions, height * width)
    masks = random_subsets(
        seed,
        list(range(len(counts) * n_samples)),
        counts.repeat_interleave(n_samples),
        height,
        width,
        pairs.images.device,
    )
    sums, drops = removal_effects(
        model, pairs, masks, baselines_for(pairs, baseline), batch_size=batch_size, score=score
    )
    m = len(sums)
    curve = pearson(sums.view(m, len(counts), n_samples), drops.view(m, len(counts), n_samples))
    return Score(
        metric="sensitivity-n",
        values=pairs.unflatten(curve.mean(1)),
        higher_is_better=True,
        curves={"sensitivity-n": pairs.unflatten(curve)},
        steps=counts.float() / (height * width),
    )


def _subset_counts(fractions, pixels: int) -> Tensor:
    """Pixels per subset for each fraction in (0, 1) of the image, at least one."""
    values = torch.as_tensor([float(f) for f in fractions])
    if values.numel() == 0 or not ((values > 0) & (values < 1)).all():
        raise ValueError(f"fractions must lie strictly between 0 and 1, got {list(fractions)}")
    return (values * pixels).round().long().clamp(1, pixels - 1)
