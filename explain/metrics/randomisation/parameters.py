"""The model parameter randomisation tests: MPRT (Adebayo et al.) and the two repairs of
Hedström et al., Smooth MPRT and Efficient MPRT."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ...base import Explainer
from ...checks import checked_number, positive_int
from ...concurrency import model_lock
from ...explanation import Explanation
from ...passes import Passes, with_pass_options
from ..base import Score, explanation_batch, pairs_of
from .cascade import cascade, cascade_layers, checkpoint_steps, explain_again, smoothed_maps
from .similarity import histogram_entropy, rank_maps, spearman, ssim

__all__ = ["efficient_model_randomisation", "model_randomisation", "smooth_model_randomisation"]


def _cascade_score(metric: str, pairs, layers: list[str], compared: list[int], by_layer: Tensor, **extra) -> Score:
    """The Score of a cascade's Spearman correlations (M, S) over the ``compared`` checkpoints."""
    return Score(
        metric=metric,
        values=pairs.unflatten(by_layer.mean(1)),
        higher_is_better=False,
        curves={"spearman": pairs.unflatten(by_layer), **{k: pairs.unflatten(v) for k, v in extra.items()}},
        steps=torch.tensor(compared, dtype=torch.float32),
        step_labels=tuple(layers[i - 1] for i in compared),
        extra={
            **{k: pairs.unflatten(v.mean(1)) for k, v in extra.items()},
            "spearman_last": pairs.unflatten(by_layer[:, -1]),
        },
    )


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
    layers = cascade_layers(model, pairs.images, layers)
    modules = [model.get_submodule(name) for name in layers]
    compared = checkpoint_steps(checkpoints, len(layers))
    original = rank_maps(pairs.maps)

    def compare() -> tuple[Tensor, Tensor]:
        again = explain_again(explainer, pairs.images, pairs.targets, batch_size)
        return spearman(original, again), ssim(pairs.maps, again)

    # no other thread may explain with the randomised weights
    with model_lock(model), Passes(None, len(compared) * len(pairs.images)):
        found = cascade(model, modules, compared, seed, pairs.images.device, compare)
    by_layer, ssim_by_layer = (torch.stack(values, 1) for values in zip(*found, strict=True))
    return _cascade_score("randomisation", pairs, layers, compared, by_layer, ssim=ssim_by_layer)


@with_pass_options
def smooth_model_randomisation(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    n_samples: int = 50,
    noise: float = 0.1,
    order: str = "bottom_up",
    layers: Sequence[str] | None = None,
    checkpoints: int | None = 10,
    seed: int = 42,
    batch_size: int | None = None,
) -> Score:
    """Smooth MPRT: the cascading randomisation test on denoised maps (lower is better).

    Hedström, Weber, Lapuschkin & Höhne, "Sanity Checks Revisited: An Exploration to
    Repair the Model Parameter Randomisation Test", XAI in Action workshop, NeurIPS 2023
    (Quantus's SmoothMPRT). A noisy explainer's maps differ between two calls, randomised
    model or not, which MPRT reads as a change; Smooth MPRT first averages each map over
    ``n_samples`` noisy copies of the image (Gaussian noise of standard deviation ``noise``
    times the image's range, the last copy noise-free, so ``n_samples=1`` is MPRT), for the
    intact model and at each checkpoint of the cascade, and compares the averages by
    Spearman's rank correlation. The draws depend on ``seed`` and the sample alone: every
    image and every state of the model gets the same noise.

    The cascade is MPRT's (:func:`model_randomisation`, the same ``checkpoints`` and
    seeding), from the input up by default (``order="bottom_up"``, the paper's and
    Quantus's: randomising from the logits down leaves the lower layers' information in
    the map); ``"top_down"`` goes from the logits down, and ``layers`` names the modules
    in the order to randomise them. ``explanation`` gives the targets only: the original
    map is the average over the noisy copies too (Quantus compares a given ``a_batch``
    unsmoothed).

    ``curves["spearman"]`` (N, S) over the checkpoints, ``values`` its mean and
    ``extra["spearman_last"]`` the fully randomised model's. Cost: ``n_samples`` explanations
    per checkpoint and per image, and ``n_samples`` for the original: 550 with the defaults.
    """
    n_samples, noise = positive_int("n_samples", n_samples), checked_number("noise", noise, positive=False)
    model = explainer.model
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(model, images, explanation, targets)
    batch_size = explanation_batch(batch_size, pairs.images.device)
    layers = cascade_layers(model, pairs.images, layers, order)
    modules = [model.get_submodule(name) for name in layers]
    compared = checkpoint_steps(checkpoints, len(layers))

    def smooth() -> Tensor:
        return smoothed_maps(
            explainer, pairs.images, pairs.targets, n_samples=n_samples, noise=noise, seed=seed, batch_size=batch_size
        )

    with model_lock(model), Passes(None, (len(compared) + 1) * len(pairs.images) * n_samples):
        original = rank_maps(smooth())
        found = cascade(model, modules, compared, seed, pairs.images.device, lambda: spearman(original, smooth()))
    return _cascade_score("smooth-randomisation", pairs, layers, compared, torch.stack(found, 1))


@with_pass_options
def efficient_model_randomisation(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    bins: int = 100,
    layers: Sequence[str] | None = None,
    seed: int = 42,
    batch_size: int | None = None,
) -> Score:
    """Efficient MPRT: how much more complex the map gets once every layer is randomised
    (higher is better).

    Hedström, Weber, Lapuschkin & Höhne, "Sanity Checks Revisited: An Exploration to
    Repair the Model Parameter Randomisation Test", XAI in Action workshop, NeurIPS 2023
    (Quantus's EfficientMPRT). Instead of comparing maps layer by layer with a similarity
    measure, eMPRT compares the map's complexity H, the entropy of its histogram of
    ``bins`` equal bins (``explain.metrics.randomisation.histogram_entropy``, 100 as in
    the paper), before and after randomising the whole model: the relative rise
    (H(e_random) - H(e)) / H(e). A map that explains the model turns to noise, and its
    entropy rises, when the model is random; NaN where the original map is constant (H = 0).

    Every layer is randomised as in :func:`model_randomisation` (``layers``: the modules to
    randomise, by default every module with ``reset_parameters`` that runs; each is reset
    after ``torch.manual_seed(seed + 1)``, so the fully random model does not depend on the
    order) and the images explained once more: one explanation per image. The model's
    weights are put back bitwise afterwards. ``extra`` holds ``"entropy"`` (the original
    map's) and ``"entropy_random"``.
    """
    bins = positive_int("bins", bins)
    model = explainer.model
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(model, images, explanation, targets)
    batch_size = explanation_batch(batch_size, pairs.images.device)
    modules = [model.get_submodule(name) for name in cascade_layers(model, pairs.images, layers)]
    before = histogram_entropy(pairs.maps, bins)

    def complexity() -> Tensor:
        return histogram_entropy(explain_again(explainer, pairs.images, pairs.targets, batch_size), bins)

    with model_lock(model), Passes(None, len(pairs.images)):
        [after] = cascade(model, modules, [len(modules)], seed, pairs.images.device, complexity)
    rise = torch.where(before > 0, (after - before) / before.clamp_min(1e-300), float("nan"))
    return Score(
        metric="efficient-randomisation",
        values=pairs.unflatten(rise.float()),
        higher_is_better=True,
        extra={"entropy": pairs.unflatten(before.float()), "entropy_random": pairs.unflatten(after.float())},
    )
