"""Randomisation sanity checks: does the map change when the model or the class does?

A map that survives randomising the model's weights, or explaining another class, does not
explain the model's decision (an edge detector passes any such test). Similarities are
Spearman's rank correlation (ranks by :func:`scipy.stats.rankdata`) and SSIM
(:func:`skimage.metrics.structural_similarity`) between each image's original map and the
one after randomisation; lower is better for both.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor, nn

from ..base import Explainer
from ..baselines import seeded
from ..checks import positive_int
from ..concurrency import model_lock
from ..explanation import Explanation
from ..hooks import preserved_state
from ..layers import module_calls
from ..passes import Passes, advance, with_pass_options
from .base import Score, chunks, explanation_batch, pairs_of

__all__ = ["model_randomisation", "random_logit", "randomisable_layers", "rank_maps", "spearman", "ssim"]


def rank_maps(maps: Tensor) -> np.ndarray:
    """Each map's pixels ranked (:func:`scipy.stats.rankdata`, ties given their mean rank),
    centred: (M, H*W) float64. Ranking is most of Spearman's cost, so a map compared many
    times (the original, in the cascade) is ranked once."""
    from scipy.stats import rankdata

    ranks = rankdata(maps.flatten(1).double().cpu().numpy(), axis=1)
    return ranks - ranks.mean(axis=1, keepdims=True)


def spearman(a: Tensor | np.ndarray, b: Tensor) -> Tensor:
    """Spearman's rank correlation of each pair of maps (M, H, W): the Pearson correlation
    of their ranks, ties given their mean rank (as :func:`scipy.stats.spearmanr`); 0 where
    either map is constant (it has no ranking to correlate). ``a`` may be given already
    ranked by :func:`rank_maps`.

    >>> spearman(torch.tensor([[[1.0, 2.0, 3.0]]]), torch.tensor([[[1.0, 5.0, 9.0]]])).item()
    1.0
    """
    x = a if isinstance(a, np.ndarray) else rank_maps(a)
    y = rank_maps(b)
    norms = np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))
    correlation = np.divide((x * y).sum(axis=1), norms, out=np.zeros(len(x)), where=norms > 0)
    return torch.tensor(correlation, dtype=torch.float32, device=b.device)


def ssim(a: Tensor, b: Tensor) -> Tensor:
    """Structural similarity of each pair of 2-D maps (M, H, W) (Wang et al., IEEE TIP 2004,
    scikit-image's 7 x 7 window, or the largest odd window that fits a smaller map), the
    data range taken from both maps together.

    >>> x = torch.rand(1, 16, 16)
    >>> round(ssim(x, x).item(), 6)
    1.0
    """
    from skimage.metrics import structural_similarity

    window = min(7, 2 * ((min(a.shape[-2:]) - 1) // 2) + 1)
    if window < 3:
        raise ValueError(f"SSIM needs maps of at least 3 x 3 pixels, got {tuple(a.shape[-2:])}")
    out = []
    for x, y in zip(a.double().cpu().numpy(), b.double().cpu().numpy(), strict=True):
        low, high = min(x.min(), y.min()), max(x.max(), y.max())
        span = high - low
        out.append(1.0 if span == 0 else float(structural_similarity(x, y, data_range=span, win_size=window)))
    return torch.tensor(out, dtype=torch.float32, device=a.device)


def _explain_again(explainer: Explainer, images: Tensor, targets: Tensor, batch_size: int) -> Tensor:
    maps = []
    for part in chunks(len(images), batch_size):
        maps.append(explainer(images[part], targets[part]).maps)
        advance(len(maps[-1]))  # the metric's progress counts explanations
    return torch.cat(maps)


def randomisable_layers(model: nn.Module, images: Tensor) -> list[str]:
    """Names of the modules with their own ``reset_parameters`` that a forward pass of
    ``images`` runs, in the order they first run (found with forward hooks on one image)."""
    calls = module_calls(model, images[:1])
    return list(dict.fromkeys(name for name, module, _ in calls if hasattr(module, "reset_parameters")))


@contextmanager
def restored_state(model: nn.Module) -> Iterator[None]:
    """Put back every parameter and buffer of ``model``, bitwise, on leaving the block."""
    saved = [(tensor, tensor.detach().clone()) for tensor in (*model.parameters(), *model.buffers())]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, copy in saved:
                tensor.copy_(copy)


def _cascade_layers(model: nn.Module, images: Tensor, layers: Sequence[str] | None) -> list[str]:
    """The names of the layers to randomise, top first: ``layers``, or by default those of
    :func:`randomisable_layers` in reverse order of execution."""
    if layers is None:
        layers = randomisable_layers(model, images)[::-1]
    layers = list(layers)
    if not layers:
        raise ValueError("the model has no layer to randomise (no module with reset_parameters runs)")
    return layers


def _checkpoint_steps(checkpoints: int | None, count: int) -> list[int]:
    """After how many of the ``count`` layers the maps are compared: ``checkpoints`` points
    evenly spaced from the first layer to the last, or every layer."""
    if checkpoints is None or positive_int("checkpoints", checkpoints) >= count:
        return list(range(1, count + 1))
    return sorted(
        {round(1 + i * (count - 1) / (checkpoints - 1)) for i in range(checkpoints)} if checkpoints > 1 else {count}
    )


def _randomise(module: nn.Module, seed: int, device: torch.device) -> None:
    """Re-initialise every part of ``module`` with ``reset_parameters``, after seeding ``seed``."""
    with seeded(seed, device), torch.no_grad():
        for child in module.modules():
            reset = getattr(child, "reset_parameters", None)
            if reset is not None:
                reset()


def _cascade(
    explainer: Explainer, pairs, modules: list[nn.Module], compared: list[int], seed: int, batch_size: int
) -> tuple[Tensor, Tensor]:
    """Randomise ``modules`` one after another, explaining again after each number of layers
    in ``compared``; the Spearman correlations and SSIMs with the original maps, (M, S) each.
    The model's weights are put back afterwards."""
    spearmans, ssims = [], []
    original = rank_maps(pairs.maps)
    with restored_state(explainer.model):
        for done, module in enumerate(modules, start=1):
            _randomise(module, seed + 1, pairs.images.device)
            if done in compared:
                again = _explain_again(explainer, pairs.images, pairs.targets, batch_size)
                spearmans.append(spearman(original, again))
                ssims.append(ssim(pairs.maps, again))
    return torch.stack(spearmans, 1), torch.stack(ssims, 1)


@with_pass_options
def model_randomisation(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    layers: Sequence[str] | None = None,
    checkpoints: int | None = 10,
    seed: int = 42,
    batch_size: int | None = None,
) -> Score:
    """Cascading model-parameter randomisation (lower is better).

    Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018. The layers are
    re-initialised one after another from the logits down (each with its module's own
    ``reset_parameters``, as the model was built, after ``torch.manual_seed(seed + 1)``,
    as Quantus does), the randomisation accumulating; at each of ``checkpoints`` points of
    the cascade, evenly spaced over the layers from the first to the last, the images are
    explained again for the same targets and compared with the original maps.
    ``checkpoints=None`` compares after every layer, as Quantus does: on the bundled
    EfficientNet-Lite0 that is 99 explanations per image, against 10 by default.

    ``layers`` names the modules to randomise, top first; by default every module with
    ``reset_parameters`` that the forward pass runs, in reverse order of execution (Quantus
    uses reverse registration order, which is not the order of the computation in every
    model). The model's weights are randomised in place and put back bitwise afterwards,
    also after an error; nothing else about the model changes.

    ``curves`` holds ``"spearman"`` and ``"ssim"`` (N, S) over the checkpoints: ``steps``
    counts the layers randomised so far and ``step_labels`` names the last of them;
    ``values`` is the Spearman correlation averaged over the checkpoints and
    ``extra`` holds ``"ssim"`` (averaged) and ``"spearman_last"`` (the fully randomised model).
    """
    model = explainer.model
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(model, images, explanation, targets)
    batch_size = explanation_batch(batch_size, pairs.images.device)
    layers = _cascade_layers(model, pairs.images, layers)
    modules = [model.get_submodule(name) for name in layers]
    compared = _checkpoint_steps(checkpoints, len(layers))
    # no other thread may explain with the randomised weights
    with model_lock(model), Passes(None, len(compared) * len(pairs.images)):
        by_layer, ssim_by_layer = _cascade(explainer, pairs, modules, compared, seed, batch_size)
    return Score(
        metric="randomisation",
        values=pairs.unflatten(by_layer.mean(1)),
        higher_is_better=False,
        curves={"spearman": pairs.unflatten(by_layer), "ssim": pairs.unflatten(ssim_by_layer)},
        steps=torch.tensor(compared, dtype=torch.float32),
        step_labels=tuple(layers[i - 1] for i in compared),
        extra={"ssim": pairs.unflatten(ssim_by_layer.mean(1)), "spearman_last": pairs.unflatten(by_layer[:, -1])},
    )


@with_pass_options
def random_logit(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    seed: int = 42,
    batch_size: int | None = None,
) -> Score:
    """Random logit test: the SSIM between the map of the explained class and the map of
    a random other class (lower is better).

    Sixt, Granz & Landgraf, "When Explanations Lie: Why Many Modified BP Attributions
    Fail", ICML 2020. The other class is drawn uniformly from the classes other than the
    target with numpy's ``RandomState(seed)``, as Quantus draws it. The SSIM is of the 2-D
    maps, as in the paper; Quantus's RandomLogit computes it over the flattened maps (a
    1-D signal), which is why its numbers differ. ``extra["spearman"]`` holds the rank
    correlation too.
    """
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    logits = (
        explanation.logits if isinstance(explanation, Explanation) and isinstance(explanation.logits, Tensor) else None
    )
    if logits is None:
        with preserved_state(explainer.model), torch.inference_mode():
            logits = explainer.model(images[:1])
    classes = logits.shape[-1]
    if classes < 2:
        raise ValueError("the random logit test needs a model with at least two classes")
    k = pairs.per_image
    offsets = torch.as_tensor(
        np.random.RandomState(seed).randint(0, classes - 1, len(pairs.targets) // k), device=pairs.targets.device
    ).repeat_interleave(k)
    others = offsets + (offsets >= pairs.targets).long()
    with Passes(None, len(pairs.images)):
        again = _explain_again(explainer, pairs.images, others, explanation_batch(batch_size, pairs.images.device))
    return Score(
        metric="random-logit",
        values=pairs.unflatten(ssim(pairs.maps, again)),
        higher_is_better=False,
        extra={"spearman": pairs.unflatten(spearman(pairs.maps, again)), "class": pairs.unflatten(others.float())},
    )
