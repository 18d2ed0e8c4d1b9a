"""Axioms: properties an attribution ought to have by construction. Completeness (the map
sums to the change of the score), non-sensitivity (zero relevance exactly where the model
does not depend on the input) and input invariance (a constant shift of the input that the
model absorbs leaves the map as it was)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
from torch import Tensor, nn

from ..base import Explainer
from ..checks import checked_number
from ..concurrency import model_lock
from ..explanation import Explanation
from ..hooks import LayerCapture, preserved_state
from ..layers import module_calls
from ..passes import Passes, with_pass_options
from .base import Score, chunks, explanation_batch, listed_scores, pairs_of, perturbed_scores
from .faithfulness.perturbing import baselines_for, step_pixels
from .robustness.neighbourhood import class_outputs

__all__ = ["completeness", "input_invariance", "non_sensitivity"]


def _raw_attributions(explanation: Explanation | Tensor, images: Tensor) -> Tensor | None:
    """An attribution method's raw attributions summed over the channels, one row per
    explained target (M, H, W); None where the explanation has none (maps as a tensor, or
    a CAM, whose raw layers are activations)."""
    if not isinstance(explanation, Explanation):
        return None
    raw = explanation.raw_layers.get("input")
    channels = images.shape[1]
    if not isinstance(raw, Tensor) or raw.shape[-3:] != images.shape[-3:] or raw.shape[-3] != channels:
        return None
    return raw.reshape(-1, *images.shape[-3:]).sum(1).to(images.device)


@with_pass_options
def completeness(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    baseline: str | float | Tensor = "zeros",
    score: str = "logit",
    tolerance: float = 0.01,
    batch_size: int | None = None,
) -> Score:
    """Completeness: how far the map's sum is from the change of the class score between
    the baseline and the image (lower is better; 0 is complete).

    Sundararajan, Taly & Yan, "Axiomatic Attribution for Deep Networks", ICML 2017 (also
    Shrikumar et al.'s summation to delta, Montavon et al.'s conservation): an attribution
    is complete when sum_i a_i = f(x) - f(b). ``values`` is the relative gap
    ``|sum_i a_i - (f(x) - f(b))| / |f(x) - f(b)|`` (NaN where the score does not change);
    ``extra`` holds ``"sum"`` (sum_i a_i), ``"difference"`` (f(x) - f(b)) and
    ``"complete"`` (1 where the gap is at most ``tolerance`` times ``|f(x) - f(b)|``).

    f is the explained class's logit (``score="probability"``: its softmax probability) and
    b the ``baseline`` (zeros in the model's input space; a number, ``"blur"``, or a
    tensor). The sum is of the attributions themselves: an attribution method's
    :class:`~explain.Explanation` is scored on its raw, signed attributions
    (``raw_layers["input"]``, added up over the colour channels), not on its maps, which
    are scaled and reduced to magnitudes for display; maps given as a tensor are summed as
    they are. Quantus's Completeness returns whether the two are exactly equal
    (``tolerance=0``), its baseline "black" each image's minimum over every value.

    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2, 2, bias=False))
    >>> with torch.no_grad():
    ...     _ = model[1].weight.copy_(torch.tensor([[1.0, 2.0], [0.0, 0.0]]))
    >>> x = torch.tensor([[[[1.0, 1.0]]]])   # f(x) - f(0) = 3; gradient x input is [1, 2]
    >>> completeness(model, x, torch.tensor([[[1.0, 2.0]]]), torch.tensor([0])).values.item()
    0.0
    """
    pairs = pairs_of(model, images, explanation, targets)
    tolerance = checked_number("tolerance", tolerance, positive=False)
    attributions = _raw_attributions(explanation, pairs.images)
    base = baselines_for(pairs, baseline)
    both = perturbed_scores(
        model,
        pairs.images,
        pairs.targets,
        2,
        lambda rows, columns: torch.where((columns == 0).view(-1, 1, 1, 1), pairs.images[rows], base[rows]),
        batch_size=batch_size,
        score=score,
    ).double()
    difference = both[:, 0] - both[:, 1]
    total = (pairs.maps if attributions is None else attributions).flatten(1).double().sum(1)
    gap = (total - difference).abs()
    relative = torch.where(difference != 0, gap / difference.abs().clamp_min(1e-300), float("nan"))
    complete = (gap <= tolerance * difference.abs()).float()
    return Score(
        metric="completeness",
        values=pairs.unflatten(relative.float()),
        higher_is_better=False,
        extra={
            "sum": pairs.unflatten(total.float()),
            "difference": pairs.unflatten(difference.float()),
            "complete": pairs.unflatten(complete),
        },
    )


def _feature_groups(zero: Tensor, step: int) -> tuple[Tensor, Tensor]:
    """Each pixel's group (M, P) and the number of groups per map (M,): the pixels of zero
    relevance and the others each in runs of ``step`` in raster order, the zero ones first
    (as Quantus groups its features)."""
    zero_rank = zero.long().cumsum(1) - 1
    other_rank = (~zero).long().cumsum(1) - 1
    zero_groups = -(-zero.sum(1) // step)
    groups = torch.where(zero, zero_rank // step, zero_groups[:, None] + other_rank // step)
    return groups, zero_groups + -(-(~zero).sum(1) // step)


@with_pass_options
def non_sensitivity(
    model: nn.Module,
    images: Tensor,
    explanation: Explanation | Tensor,
    targets: Tensor | None = None,
    *,
    step: int | float | None = None,
    eps: float = 1e-5,
    baseline: str | float | Tensor = "zeros",
    score: str = "probability",
    batch_size: int | None = None,
) -> Score:
    """Non-sensitivity: the number of pixels whose relevance is zero while the model depends
    on them, or non-zero while it does not (lower is better; 0 is exact).

    Nguyen & Rodriguez Martinez, "On Quantitative Aspects of Model Interpretability", arXiv
    2007.07584 (2020): the size of the symmetric difference of Z_a, the features of zero
    relevance, and Z_f, those the model does not depend on. A pixel's relevance counts as
    zero below ``eps`` times the map's largest magnitude; the model does not depend on a
    pixel when replacing it by the ``baseline`` (all channels; zeros in the model's input
    space) moves the explained class's probability (``score="logit"``: its logit) by less
    than ``eps``. Pixels are replaced ``step`` at a time (an int, a fraction of the image,
    or None for one row's worth), the zero-relevance pixels and the others each in runs
    of ``step`` in raster order, and each pixel takes its run's verdict; ``step=1`` tests
    every pixel alone, as the paper (H x W + 1 forwards). ``extra`` holds the two kinds of
    miss, ``"zero_but_sensitive"`` and ``"relevant_but_insensitive"``.

    Quantus's NonSensitivity does the same per input value (each colour channel a feature;
    a one-channel image's pixels are its features), and scales every map by the batch's
    largest magnitude rather than its own.

    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2, bias=False))
    >>> with torch.no_grad():
    ...     _ = model[1].weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    >>> x = torch.ones(1, 1, 2, 2)   # the model depends on pixel 0 alone
    >>> maps = torch.tensor([[[1.0, 0.0], [0.5, 0.0]]])   # pixel 2 is relevant, wrongly
    >>> non_sensitivity(model, x, maps, torch.tensor([0]), step=1).values.item()
    1.0
    """
    pairs = pairs_of(model, images, explanation, targets)
    eps = checked_number("eps", eps, positive=True)
    height, width = pairs.images.shape[-2:]
    size = step_pixels(step, height, width)
    magnitudes = pairs.maps.flatten(1).abs()
    zero = magnitudes < eps * magnitudes.amax(1, keepdim=True)
    zero |= magnitudes.amax(1, keepdim=True) == 0
    groups, counts = _feature_groups(zero, size)
    base = baselines_for(pairs, baseline)
    m = len(pairs.targets)
    rows = torch.arange(m, device=groups.device).repeat_interleave(counts + 1)
    starts = torch.cumsum(counts + 1, 0) - (counts + 1)
    column = torch.arange(len(rows), device=rows.device) - starts[rows] - 1  # -1: the intact image

    def build(jobs: Tensor) -> Tensor:
        r = rows[jobs]
        replaced = (groups[r] == column[jobs, None]).view(-1, 1, height, width)
        return torch.where(replaced, base[r], pairs.images[r])

    scores = listed_scores(model, pairs.images, pairs.targets, rows, build, batch_size=batch_size, score=score)
    intact = scores[starts]
    moved = (scores - intact[rows]).abs() >= eps
    pixel_moved = moved[starts[:, None] + 1 + groups]
    zero_but_sensitive = (zero & pixel_moved).sum(1).float()
    relevant_but_insensitive = (~zero & ~pixel_moved).sum(1).float()
    return Score(
        metric="non-sensitivity",
        values=pairs.unflatten(zero_but_sensitive + relevant_but_insensitive),
        higher_is_better=False,
        extra={
            "zero_but_sensitive": pairs.unflatten(zero_but_sensitive),
            "relevant_but_insensitive": pairs.unflatten(relevant_but_insensitive),
        },
    )


def first_layer(model: nn.Module, images: Tensor) -> tuple[str, nn.Module]:
    """The first convolution or linear layer that the images reach (name, module)."""
    for name, module, shape in module_calls(model, images[:1]):
        if shape is not None and isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
            return name, module
    raise ValueError(
        "input invariance shifts the bias of the model's first convolution or linear layer, and no such layer "
        "reads the images: pass layer= (the name of the first layer with weights)"
    )


def _first_outputs(model: nn.Module, name: str, module: nn.Module, inputs: Tensor) -> Tensor:
    with LayerCapture(model, {name: module}, gradients=False) as capture, torch.inference_mode():
        model(inputs)
    return capture.activations[name].float()


@contextmanager
def shifted_bias(model: nn.Module, images: Tensor, shift: float, layer: str | None) -> Iterator[None]:
    """The model with its first layer's bias lowered so that it gives for ``images +
    shift`` the output it gave for ``images``: Kindermans et al.'s b2 = b1 - W m, each
    output channel's change read from one pass of the shifted and one of the unshifted
    images (its median over positions: the interior of a convolution). Where a zero-padded
    convolution's border sees less of the shift, the rest is taken off those outputs by a
    forward hook for the block, so that the shifted model computes the same function. A
    layer without a bias gets one for the block; everything is put back afterwards (the
    bias, the hook), also after an error."""
    name, module = (layer, model.get_submodule(layer)) if layer is not None else first_layer(model, images)
    if not isinstance(getattr(module, "weight", None), Tensor) or not hasattr(module, "bias"):
        raise ValueError(f"layer {name!r} has no weights to shift the bias of: pass the first convolution or linear")
    with preserved_state(model):
        change = _first_outputs(model, name, module, images + shift) - _first_outputs(model, name, module, images)
    at_position = change.median(0).values  # (C, ...) or (..., features): the same for every image
    if change.dim() > 2:
        per_channel = at_position.reshape(at_position.shape[0], -1).median(1).values
        rest = at_position - per_channel.view(-1, *[1] * (at_position.dim() - 1))
    else:
        per_channel, rest = at_position.reshape(-1, at_position.shape[-1]).median(0).values, None
    weight = cast(Tensor, module.weight)
    bias = module.bias if isinstance(module.bias, Tensor) else None
    saved = None if bias is None else bias.detach().clone()
    handle = None
    with torch.no_grad():
        if bias is None:
            bias = nn.Parameter(torch.zeros_like(per_channel, dtype=weight.dtype), requires_grad=False)
            module.register_parameter("bias", bias)
        bias.sub_(per_channel.to(bias.dtype))
    try:
        if rest is not None and bool(rest.abs().max() > 0):
            offset = rest

            def absorb(_: nn.Module, args: tuple, output: Tensor) -> Tensor:
                return output - offset.to(output.dtype)

            handle = module.register_forward_hook(absorb)
        yield
    finally:
        if handle is not None:
            handle.remove()
        with torch.no_grad():
            if saved is None:
                module.register_parameter("bias", None)
            else:
                bias.copy_(saved)


@with_pass_options
def input_invariance(
    explainer: Explainer,
    images: Tensor,
    explanation: Explanation | None = None,
    targets: Tensor | None = None,
    *,
    shift: float = -1.0,
    atol: float = 1e-4,
    layer: str | None = None,
    batch_size: int | None = None,
) -> Score:
    """Input invariance: 1 where the map stays the same when a constant ``shift`` is added
    to the input and the model's first layer absorbs it, so that the model computes the
    same function of the image; 0 where the map moves (higher is better).

    Kindermans et al., "The (Un)reliability of Saliency Methods", in Explainable AI:
    Interpreting, Explaining and Visualizing Deep Learning, Springer 2019 (arXiv 1711.00867):
    x2 = x + m and the first layer's bias b2 = b1 - W m. The maps of the shifted images
    (explained by ``explainer`` with the shifted model, ``batch_size`` images a call) must
    equal the original ones within ``atol`` (and 1e-5 relative) at every pixel, as
    Quantus's InputInvariance tests them (numpy's ``isclose``). Gradients pass the test;
    gradient x input and integrated gradients against a zero baseline fail it.

    The first layer is the first convolution or linear layer the images reach (``layer``:
    another, by name). Its bias change is read per output channel from the layer's outputs;
    where a zero-padded convolution's border sees less of the shift, the rest is taken off
    those outputs during the test, so the shifted model computes the same function (Quantus
    shifts the bias alone, by one output value of a constant input: at the border of a
    padded convolution its shifted model differs, and gradients fail its test). ``extra``
    holds ``"difference"`` (the largest change of a map pixel), ``"output_change"`` (the
    largest change of the model's class logits between the shifted model on the shifted
    image and the model on the image: how well the shift is absorbed) and
    ``"relative_difference"`` (``||a2 - a|| / ||a||``). The model is put back as it was
    afterwards.
    """
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not math.isfinite(shift) or shift == 0:
        raise ValueError(f"shift must be a non-zero number (the constant added to every input value), got {shift!r}")
    atol = checked_number("atol", atol, positive=False)
    if explanation is None:
        explanation = explainer(images, targets)
    pairs = pairs_of(explainer.model, images, explanation, targets)
    model, m = explainer.model, len(pairs.targets)
    maps = torch.empty_like(pairs.maps)
    logits_change = torch.empty(m, device=pairs.maps.device)
    size = explanation_batch(batch_size, pairs.images.device)
    with model_lock(model), Passes(None, m) as passes:
        before = [class_outputs(model, pairs.images[part]) for part in chunks(m, size)]
        with shifted_bias(model, pairs.images, shift, layer):
            for index, part in enumerate(chunks(m, size)):
                shifted = pairs.images[part] + shift
                maps[part] = explainer(shifted, pairs.targets[part]).maps.float()
                after = class_outputs(model, shifted)
                logits_change[part] = (after - before[index]).abs().flatten(1).amax(1)
                passes.advance(part.stop - part.start)
    close = torch.isclose(pairs.maps, maps, rtol=1e-5, atol=atol).flatten(1).all(1)
    moved = (maps - pairs.maps).flatten(1)
    relative = moved.norm(dim=1) / pairs.maps.flatten(1).norm(dim=1).clamp_min(1e-12)
    return Score(
        metric="input-invariance",
        values=pairs.unflatten(close.float()),
        higher_is_better=True,
        extra={
            "difference": pairs.unflatten(moved.abs().amax(1)),
            "output_change": pairs.unflatten(logits_change),
            "relative_difference": pairs.unflatten(relative),
        },
    )
