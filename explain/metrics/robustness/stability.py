"""Relative stability (Agarwal et al.): the map's relative change against the relative
change of the input, of the model's output, or of a layer's representation, over noisy
copies of the image that the model still classifies as it classifies the image."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...base import Explainer
from ...checks import checked_number, positive_int
from ...explanation import Explanation
from ...layers import LayerSpec, find_target_layer, resolve_layers
from ...passes import with_pass_options
from ..base import Pairs, Score, pairs_of
from .neighbourhood import ball_noise, class_outputs, explained_neighbours, largest, layer_outputs, relative_change

__all__ = ["relative_input_stability", "relative_output_stability", "relative_representation_stability"]

#: ``change(rows, neighbours, explanation)``: for a batch of neighbours of the pairs
#: ``rows``, the change that the map's change is measured against (B,) and the
#: neighbours' class logits (B, classes).
Change = Callable[[Tensor, Tensor, Explanation], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class _Setting:
    """What the three stabilities share: the pairs, their class logits, the neighbours'
    perturbation and the options."""

    pairs: Pairs
    original: Tensor
    perturb: Callable[[Tensor, list[int]], Tensor]
    n_samples: int
    eps: float
    batch_size: int | None


def _setting(explainer, images, explanation, targets, *, radius, noise, n_samples, seed, eps, batch_size) -> _Setting:
    """The checked options, the pairs and their logits (the explanation's where it has them)."""
    checked_number("radius", radius, positive=True)
    perturb, n_samples = ball_noise(radius, noise, seed), positive_int("n_samples", n_samples)
    eps = checked_number("eps", eps, positive=True)
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    logits = explanation.logits if isinstance(explanation, Explanation) else None
    original = class_outputs(explainer.model, pairs.images, logits, repeat=pairs.per_image)
    return _Setting(pairs, original, perturb, n_samples, eps, batch_size)


def _stability(metric: str, explainer: Explainer, setting: _Setting, change: Change) -> Score:
    """max over the neighbours x' that keep the predicted class of
    ||(e_x - e_x') / e_x|| / max(change, eps)."""
    pairs, eps = setting.pairs, setting.eps
    ratios = torch.empty(len(pairs.targets), setting.n_samples, device=pairs.images.device)

    def visit(part: slice, r: Tensor, neighbours: Tensor, again: Explanation) -> None:
        moved, logits = change(r, neighbours, again)
        ratio = relative_change(pairs.maps[r], again.maps, eps) / moved.clamp_min(eps)
        kept = logits.argmax(1) == setting.original[r].argmax(1)
        ratios.view(-1)[part] = torch.where(kept, ratio, float("nan"))

    explained_neighbours(explainer, pairs, setting.n_samples, setting.perturb, setting.batch_size, visit)
    return Score(
        metric=metric,
        values=pairs.unflatten(largest(ratios)),
        higher_is_better=False,
        extra={"kept": pairs.unflatten((~ratios.isnan()).sum(1).float())},
    )


@with_pass_options
def relative_input_stability(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    radius: float = 0.1,
    noise: str = "uniform",
    n_samples: int = 10,
    eps: float = 1e-6,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Score:
    """Relative input stability (RIS): the map's relative change per relative change of
    the image, at its worst over the image's neighbours (lower is better).

    Agarwal, Johnson, Pawelczyk, Krishna, Saxena, Zitnik & Lakkaraju, "Rethinking
    Stability for Attribution-based Explanations", ICLR 2022 workshop PAIR^2Struct
    (arXiv:2203.06877), the RIS definition:
    RIS(x) = max over x' of ||(e_x - e_x') / e_x||_2 / max(||(x - x') / x||_2, eps),
    over the neighbours x' that the model gives the same class as x (ŷ_x' = ŷ_x), e the
    map (``Explanation.maps``) of the same target, re-explained by ``explainer`` at x', the
    divisions elementwise (where e_x or x is 0, ``eps`` stands in for it, as in Quantus:
    a map with zeros, as every min-max scaled map has, makes large values). The x' are
    ``n_samples`` random neighbours: uniform in the L-inf ball of ``radius`` per input
    value (``noise="uniform"``), or Gaussian of that standard deviation (``"normal"``).
    Draw ``s`` depends only on ``seed`` and ``s``.

    NaN where every neighbour changed the class; ``extra["kept"]`` counts the neighbours
    that kept it. (Quantus's RelativeInputStability gives NaN as soon as one neighbour
    changes it, and draws uniform noise in [0.02, 0.2], all positive, 200 times.)
    """
    setting = _setting(
        explainer,
        images,
        explanation,
        targets,
        radius=radius,
        noise=noise,
        n_samples=n_samples,
        seed=seed,
        eps=eps,
        batch_size=batch_size,
    )

    def change(rows: Tensor, neighbours: Tensor, again: Explanation) -> tuple[Tensor, Tensor]:
        moved = relative_change(setting.pairs.images[rows], neighbours, setting.eps)
        return moved, class_outputs(explainer.model, neighbours, again.logits)

    return _stability("relative-input-stability", explainer, setting, change)


@with_pass_options
def relative_output_stability(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    radius: float = 0.1,
    noise: str = "uniform",
    n_samples: int = 10,
    eps: float = 1e-6,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Score:
    """Relative output stability (ROS): the map's relative change per change of the
    model's logits, at its worst over the image's neighbours (lower is better).

    Agarwal, Johnson, Pawelczyk, Krishna, Saxena, Zitnik & Lakkaraju, "Rethinking
    Stability for Attribution-based Explanations", ICLR 2022 workshop PAIR^2Struct
    (arXiv:2203.06877), the ROS definition:
    ROS(x) = max over x' of ||(e_x - e_x') / e_x||_2 / max(||h(x) - h(x')||_2, eps),
    h the model's logits, over the neighbours x' that keep the class, drawn and compared
    as in :func:`relative_input_stability` (the logits are the explanations' own where
    they carry them, else one forward pass per neighbour).
    """
    setting = _setting(
        explainer,
        images,
        explanation,
        targets,
        radius=radius,
        noise=noise,
        n_samples=n_samples,
        seed=seed,
        eps=eps,
        batch_size=batch_size,
    )

    def change(rows: Tensor, neighbours: Tensor, again: Explanation) -> tuple[Tensor, Tensor]:
        logits = class_outputs(explainer.model, neighbours, again.logits)
        return (setting.original[rows] - logits).norm(dim=1), logits

    return _stability("relative-output-stability", explainer, setting, change)


def _representation_layer(model: nn.Module, images: Tensor, layer: LayerSpec) -> dict[str, nn.Module]:
    found = resolve_layers(model, find_target_layer(model, images) if layer is None else layer)
    if len(found) != 1:
        raise ValueError(f"relative representation stability reads one layer; got {len(found)}: {', '.join(found)}")
    return found


@with_pass_options
def relative_representation_stability(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    layer: str | nn.Module | None = None,
    radius: float = 0.1,
    noise: str = "uniform",
    n_samples: int = 10,
    eps: float = 1e-6,
    batch_size: int | None = None,
    seed: int | None = 0,
) -> Score:
    """Relative representation stability (RRS): the map's relative change per relative
    change of a layer's representation, at its worst over the image's neighbours (lower is
    better).

    Agarwal, Johnson, Pawelczyk, Krishna, Saxena, Zitnik & Lakkaraju, "Rethinking
    Stability for Attribution-based Explanations", ICLR 2022 workshop PAIR^2Struct
    (arXiv:2203.06877), the RRS definition:
    RRS(x) = max over x' of ||(e_x - e_x') / e_x||_2 / max(||(L_x - L_x') / L_x||_2, eps),
    L the output of ``layer`` (a name or a module; by default the layer Grad-CAM explains,
    ``explain.layers.find_target_layer``: the last spatial one of a CNN), flattened,
    over the neighbours x' that keep the class, drawn and compared as in
    :func:`relative_input_stability`. The representation is read by a forward hook (the
    hook engine's :class:`~explain.hooks.LayerCapture`, no hook left behind), one extra
    forward pass per neighbour and one for the images. (Quantus's
    RelativeRepresentationStability reads every layer by default, concatenated.)
    """
    setting = _setting(
        explainer,
        images,
        explanation,
        targets,
        radius=radius,
        noise=noise,
        n_samples=n_samples,
        seed=seed,
        eps=eps,
        batch_size=batch_size,
    )
    chosen = _representation_layer(explainer.model, setting.pairs.images, layer)
    before, _ = layer_outputs(explainer.model, chosen, setting.pairs.images)

    def change(rows: Tensor, neighbours: Tensor, again: Explanation) -> tuple[Tensor, Tensor]:
        after, logits = layer_outputs(explainer.model, chosen, neighbours)
        return relative_change(before[rows], after, setting.eps), logits

    return _stability("relative-representation-stability", explainer, setting, change)
