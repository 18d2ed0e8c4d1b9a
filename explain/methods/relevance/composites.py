"""The composites: which rule each layer of a model gets, and the canonizers applied first.

:func:`lrp_composite` is :class:`~explain.LRP`'s epsilon / gamma / first-layer composite,
:func:`excitation_composite` Excitation Backprop's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from zennit.canonizers import Canonizer
from zennit.composites import EpsilonAlpha2Beta1, EpsilonGammaBox, EpsilonPlusFlat
from zennit.composites import ExcitationBackprop as ZennitExcitationBackprop
from zennit.core import Composite, Hook
from zennit.layer import Sum
from zennit.rules import Norm, Pass, ZPlus
from zennit.torchvision import ResNetBasicBlockCanonizer, ResNetBottleneckCanonizer
from zennit.types import Activation, AvgPool, BatchNorm, ConvolutionStandard
from zennit.types import Linear as WeightedLayer

from ...checks import check_finite_output
from ...imagenet import IMAGENET_MEAN, IMAGENET_STD
from ..gradient_attribution import is_relu_like
from .canonizers import FunctionalHeadCanonizer, GateCanonizer, ResidualSumCanonizer, TracedMergeBatchNorm
from .rules import epsilon_rule, excitation_rule, gamma_rule, proportional_rule
from .tracing import TracedLayers, traced_batch_norm_pairs

__all__ = [
    "LRP_COMPOSITES",
    "PASSED",
    "ZENNIT_COMPOSITES",
    "canonizers",
    "check_canonical_output",
    "excitation_composite",
    "lrp_composite",
    "mean_and_std",
    "registered_composite",
    "zbox_bounds",
    "zennit_composite",
]

#: Modules whose relevance passes unchanged: element-wise activations, and norms that are not
#: merged, their statistics taken as constants (so each is an element-wise affine map).
PASSED = (BatchNorm, Activation, nn.LayerNorm)

#: zennit's composites that :class:`~explain.LRP` takes by name.
ZENNIT_COMPOSITES = ("epsilon-gamma-box", "epsilon-plus-flat", "epsilon-alpha2-beta1", "excitation-backprop")
#: The composites of :class:`~explain.LRP`: its own (the default: epsilon / gamma / z-box with
#: the biases shared, so that relevance is conserved), then zennit's.
LRP_COMPOSITES = ("epsilon-gamma-box-shared", *ZENNIT_COMPOSITES)


def mean_and_std(model: nn.Module, normalization) -> tuple[Tensor, Tensor]:
    """(mean, std) as flat float32 tensors: ``normalization``, or by default a timm model's
    ``pretrained_cfg``, else ImageNet's; ValueError unless one positive std per mean."""
    if normalization is None:
        config = getattr(model, "pretrained_cfg", None) or {}
        normalization = (config.get("mean", IMAGENET_MEAN), config.get("std", IMAGENET_STD))
    try:
        mean, std = (torch.as_tensor(values, dtype=torch.float32).flatten() for values in normalization)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(
            f"normalization must be (mean, std), two sequences of numbers, got {normalization!r}"
        ) from None
    if mean.shape != std.shape or not (std > 0).all():
        raise ValueError(f"normalization needs one positive std per mean, got {normalization!r}")
    return mean, std


def zbox_bounds(images: Tensor, mean: Tensor, std: Tensor) -> tuple[Tensor, Tensor]:
    """The z-box bounds (N, C, 1, 1): pixels 0 and 1 normalised by ``mean`` and ``std``,
    widened to each image."""
    low = (-mean / std).to(images).reshape(1, -1, 1, 1)
    high = ((1 - mean) / std).to(images).reshape(1, -1, 1, 1)
    return (
        torch.minimum(low, images.amin(dim=(2, 3), keepdim=True)),
        torch.maximum(high, images.amax(dim=(2, 3), keepdim=True)),
    )


def lrp_composite(model: nn.Module, images: Tensor, first: Hook, *, gamma: float, epsilon: float) -> Composite:
    """:class:`LRP`'s rules and canonizers for ``model`` on ``images``: ``first`` on the first
    convolution to run, LRP-gamma on the other convolutions, LRP-epsilon on dense layers, the
    proportional rule on sums and average pools, and batch norms and activations passed."""
    gamma_hook, epsilon_hook = gamma_rule(gamma), epsilon_rule(epsilon)
    proportional, passed = proportional_rule(), Pass()
    pairs, first_convolution = traced_batch_norm_pairs(model, images)

    def rule_for(context: dict, name: str, module: nn.Module) -> Hook | None:
        if isinstance(module, ConvolutionStandard):
            return first if module is first_convolution else gamma_hook
        if isinstance(module, nn.Linear):
            return epsilon_hook
        if isinstance(module, (Sum, AvgPool)):
            return proportional
        if isinstance(module, PASSED) or is_relu_like(module):
            return passed
        return None

    return Composite(module_map=rule_for, canonizers=canonizers(pairs))


def canonizers(pairs: list[tuple[nn.Module, nn.Module]]) -> list[Canonizer]:
    """The canonizers of this package: the batch norms of ``pairs`` merged into their layers
    (see :func:`~explain.methods.relevance.traced_batch_norm_pairs`), and residual additions as
    ``Sum`` modules."""
    return [
        TracedMergeBatchNorm(pairs),
        ResNetBasicBlockCanonizer(),
        ResNetBottleneckCanonizer(),
        ResidualSumCanonizer(),
        GateCanonizer(),
        FunctionalHeadCanonizer(),
    ]


def excitation_composite(traced: TracedLayers, negated: Callable[[], bool], stabilizer: float = 1e-6) -> Composite:
    """Excitation Backprop's rules (Zhang et al., ECCV 2016, sec. 3.2) and this package's
    canonizers: the excitation rule (zennit's ``ZPlus`` with the bias left out) on
    convolutions and dense layers, the proportional rule (zennit's ``Norm``) on sums and
    average pools, batch norms that are not merged and element-wise activations passed, and
    on the last layer to run, the classifier, the excitation rule whose weights are negated
    while ``negated()`` (the dual unit of contrastive Excitation Backprop)."""
    plain, dual = ZPlus(stabilizer=stabilizer, zero_params=["bias"]), excitation_rule(negated, stabilizer)
    proportional, passed = Norm(stabilizer=stabilizer), Pass()

    def rule_for(context: dict, name: str, module: nn.Module) -> Hook | None:
        if module is traced.last:
            return dual
        if isinstance(module, WeightedLayer):
            return plain
        if isinstance(module, (Sum, AvgPool)):
            return proportional
        if isinstance(module, PASSED) or is_relu_like(module):
            return passed
        return None

    return Composite(module_map=rule_for, canonizers=canonizers(traced.pairs))


def zennit_composite(
    name: str, model: nn.Module, images: Tensor, bounds: tuple[Tensor, Tensor], *, epsilon: float, gamma: float
) -> Composite:
    """zennit's composite ``name`` (one of :data:`ZENNIT_COMPOSITES`) as zennit defines it, with
    this package's canonizers, and batch norms that are not merged and element-wise
    activations passed (zennit's ``ExcitationBackprop`` leaves them to the gradient, and no
    zennit map knows timm's activations): ``EpsilonGammaBox`` (z-box on the first convolution registered, within
    ``bounds`` (N, C, 1, 1), gamma on the other convolutions, epsilon on dense layers),
    ``EpsilonPlusFlat`` (flat on the first convolution or dense layer registered, z+ on
    convolutions, epsilon on dense layers), ``EpsilonAlpha2Beta1`` (alpha 2 beta 1 on
    convolutions, epsilon on dense layers) and ``ExcitationBackprop`` (z+ on both). Their
    rules keep the biases in the denominators, so the biases absorb relevance."""
    pairs, _ = traced_batch_norm_pairs(model, images)
    kept = canonizers(pairs)
    passed = tuple({*PASSED, *(type(module) for module in model.modules() if is_relu_like(module))})
    layer_map = [(passed, Pass())]
    if name == "epsilon-gamma-box":
        low, high = (bound.expand_as(images).contiguous() for bound in bounds)
        return EpsilonGammaBox(low, high, epsilon=epsilon, gamma=gamma, layer_map=layer_map, canonizers=kept)
    if name == "epsilon-plus-flat":
        return EpsilonPlusFlat(epsilon=epsilon, layer_map=layer_map, canonizers=kept)
    if name == "epsilon-alpha2-beta1":
        return EpsilonAlpha2Beta1(epsilon=epsilon, layer_map=layer_map, canonizers=kept)
    if name == "excitation-backprop":
        return ZennitExcitationBackprop(layer_map=layer_map, canonizers=kept)
    raise ValueError(f"unknown composite {name!r}; use one of {', '.join(LRP_COMPOSITES)}")


@contextmanager
def registered_composite(composite: Composite, model: nn.Module) -> Iterator[None]:
    """``composite`` on ``model``, removed afterwards, also if registering it failed."""
    try:
        composite.register(model)
        yield
    finally:
        composite.remove()


def check_canonical_output(output: Tensor, reference: Tensor, method: str = "LRP") -> None:
    """RuntimeError unless the canonical model's ``output`` matches the model's ``reference``;
    ValueError where the model's output is NaN (nothing to explain) or where a float16 or
    bfloat16 model's canonical form rounds its output differently (the fix: float32)."""
    check_finite_output(reference, method)
    if not torch.allclose(output.detach(), reference, rtol=1e-3, atol=1e-4 * float(reference.abs().max())):
        if reference.dtype in (torch.float16, torch.bfloat16):
            gap = float((output.detach().float() - reference.float()).abs().max() / reference.float().abs().max())
            raise ValueError(
                f"{method} on a {str(reference.dtype).removeprefix('torch.')} model: its canonical form (batch norms "
                f"merged into their layers) rounds the output differently, by up to {gap:.1%} of its largest "
                f"value, past what {method} can check; explain the model in float32: model.float() and "
                "float32 images"
            )
        raise RuntimeError(
            f"{method}'s canonical form of the model (batch norms merged into their layers, residual additions "
            "as modules) computes another output than the model, e.g. where a merged layer's output is "
            f"also used elsewhere; {method} cannot explain this model"
        )
