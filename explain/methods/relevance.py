"""Layer-wise Relevance Propagation (LRP), computed by zennit.

LRP hands the explained score from the output back to the pixels, layer by layer, with a
rule per kind of layer. Residual additions and batch norms are not layers a rule can read,
so the model is first put in a canonical form (zennit's *canonizers*, undone after the
call): each batch norm that receives a layer's output is merged into that layer, and the
residual additions of torchvision's ResNet, MobileNetV2 / V3, EfficientNet and RegNet
blocks and timm's EfficientNet / MobileNet blocks become zennit ``Sum`` modules.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from zennit.canonizers import Canonizer, MergeBatchNorm
from zennit.core import BasicHook, Composite, Hook, ParamMod, Stabilizer
from zennit.layer import Sum
from zennit.rules import ClampMod, Flat, GammaMod, NoMod, Pass
from zennit.torchvision import ResNetBasicBlockCanonizer, ResNetBottleneckCanonizer
from zennit.types import Activation, AvgPool, BatchNorm, ConvolutionStandard

from ..attention_capture import has_attention
from ..base import NotApplicable, register
from ..checks import checked_number
from ..imagenet import IMAGENET_MEAN, IMAGENET_STD
from ..targets import class_logits
from .attribution_base import Attribution, ScoredModel
from .gradient_attribution import is_relu_like

__all__ = ["FIRST_RULES", "LRP", "ResidualSumCanonizer", "SharingRule", "traced_batch_norm_pairs"]

#: The rules selectable for the first convolution, the one that sees the pixels.
FIRST_RULES = ("zbox", "flat")
# Autograd nodes that merge two activations outside any module, where no rule applies.
_UNSEEN_MERGES = frozenset({"AddBackward0", "SubBackward0", "MulBackward0"})
# What a canonizer or a rule may change on a module, put back after each call.
_MODULE_DICTS = (
    "_parameters",
    "_buffers",
    "_modules",
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
)

#: (input modifier, parameter modifier, sign): the contributions sign * x'_i dz'_j/dx'_i
#: of the layer run on a modified input x' with modified parameters.
Term = tuple[Callable[[Tensor], Tensor], ParamMod, float]
#: (the output units it covers, from the layer's output z, or None for all; its terms; the
#: parameter modifier of the bias in its denominator, or None for no bias).
Group = tuple[Callable[[Tensor], Tensor] | None, list[Term], ParamMod | None]


def _identity(tensor: Tensor) -> Tensor:
    return tensor


def _ones(param: Tensor, name: str) -> Tensor:
    return torch.ones_like(param)


class SharingRule(BasicHook):
    """The rule R_i = sum_j (c_ij + s_j / n_j) / (sum_i' c_i'j + s_j) R_j: output j's
    relevance goes to its inputs in proportion to their contributions c_ij, and the share
    s_j that no input accounts for (the bias, and the stabiliser that keeps the denominator
    off zero) is divided equally among its n_j inputs, as the flat rule divides (the
    gradient of the layer with inputs and weights set to one). So the inputs receive all of
    R_j; with ``share_stabilizer=False`` the stabiliser's part is absorbed, as in LRP-epsilon.
    """

    def __init__(self, groups: list[Group], stabilizer: float = 1e-6, share_stabilizer: bool = True):
        stabilize = Stabilizer.ensure(stabilizer)
        inputs, params = [], []
        for _, terms, bias in groups:
            inputs += [modify for modify, _, _ in terms] + ([torch.zeros_like] if bias is not None else [])
            params += [param for _, param, _ in terms] + ([bias] if bias is not None else [])
        flat = len(inputs)
        inputs.append(torch.ones_like)
        params.append(ParamMod(_ones, zero_params=["bias"], require_params=False))
        if any(select is not None for select, _, _ in groups):
            inputs.append(_identity)  # the layer's own output, to select the units
            params.append(NoMod(param_keys=[]))

        def gradients(relevance: Tensor, outputs: list[Tensor]) -> list[Tensor]:
            result, held, index = [], torch.zeros_like(relevance), 0
            for select, terms, bias in groups:
                proportional = sum(sign * outputs[index + k] for k, (_, _, sign) in enumerate(terms))
                index += len(terms)
                total = proportional if bias is None else proportional + outputs[index]
                denominator = stabilize(total)
                scale = relevance / denominator if select is None else relevance * select(outputs[-1]) / denominator
                result += [sign * scale for _, _, sign in terms] + (
                    [torch.zeros_like(scale)] if bias is not None else []
                )
                index += bias is not None
                held = held + scale * ((denominator if share_stabilizer else total) - proportional)
            fan_in = outputs[flat]
            share = torch.where(fan_in > 0, held / fan_in.clamp(min=1e-12), 0.0)
            return result + [share] + [torch.zeros_like(share)] * (len(outputs) - flat - 1)

        def reduce(inputs: list[Tensor], gradients: list[Tensor]) -> Tensor:
            return sum(x * g for x, g in zip(inputs[:flat], gradients[:flat], strict=True)) + gradients[flat]

        super().__init__(
            input_modifiers=inputs,
            param_modifiers=params,
            output_modifiers=[_identity] * len(inputs),
            gradient_mapper=gradients,
            reducer=reduce,
        )


def epsilon_rule(epsilon: float) -> SharingRule:
    """LRP-epsilon with the bias shared; epsilon absorbs epsilon / (|z_j| + epsilon) of R_j."""
    return SharingRule(
        [(None, [(_identity, NoMod(zero_params=["bias"]), 1.0)], NoMod())], stabilizer=epsilon, share_stabilizer=False
    )


def gamma_rule(gamma: float) -> SharingRule:
    """LRP-gamma for signed inputs (zennit's ``Gamma``) with the bias shared."""

    def up(bias: bool) -> GammaMod:
        return GammaMod(gamma, min=0.0, zero_params=None if bias else ["bias"])

    def down(bias: bool) -> GammaMod:
        return GammaMod(gamma, max=0.0, zero_params=None if bias else ["bias"])

    def positive(x: Tensor) -> Tensor:
        return x.clamp(min=0)

    def negative(x: Tensor) -> Tensor:
        return x.clamp(max=0)

    return SharingRule(
        [
            (lambda z: z >= 0, [(positive, up(False), 1.0), (negative, down(False), 1.0)], up(True)),
            (lambda z: z < 0, [(positive, down(False), 1.0), (negative, up(False), 1.0)], down(True)),
        ]
    )


def zbox_rule(low: Tensor, high: Tensor) -> SharingRule:
    """The z-box rule for inputs between ``low`` and ``high`` (its bias cancels)."""
    return SharingRule(
        [
            (
                None,
                [
                    (_identity, NoMod(zero_params=["bias"]), 1.0),
                    (lambda x: low.to(x).expand_as(x), ClampMod(min=0.0, zero_params=["bias"]), -1.0),
                    (lambda x: high.to(x).expand_as(x), ClampMod(max=0.0, zero_params=["bias"]), -1.0),
                ],
                None,
            )
        ]
    )


def proportional_rule() -> SharingRule:
    """R_i = x_i dz_j/dx_i / z_j R_j summed over j, for sums and average pools."""
    return SharingRule([(None, [(_identity, NoMod(param_keys=[]), 1.0)], None)])


def _register_each(make: Callable[[], Canonizer], targets: Sequence[tuple]) -> list[Canonizer]:
    """One canonizer registered per target; if one fails, those registered are undone."""
    instances = []
    try:
        for target in targets:
            instances.append(make())
            instances[-1].register(*target)
    except BaseException:
        for instance in instances:
            instance.remove()
        raise
    return instances


# Blocks that add their input to their output where a flag says so: (module prefix, flag,
# the module that drops the branch in training, an identity at inference).
_FLAGGED_RESIDUALS = (
    ("timm.", "has_skip", "drop_path"),
    ("torchvision.models.", "use_res_connect", "stochastic_depth"),
)


class ResidualSumCanonizer(Canonizer):
    """Residual blocks that add in ``forward`` (no module, so no rule) add through a zennit
    ``Sum`` module instead, whose rule shares relevance in proportion to the two terms:

    - blocks whose addition a flag switches on: timm's EfficientNet / MobileNet blocks
      (``has_skip``) and torchvision's MobileNetV2 / V3 and EfficientNet blocks
      (``use_res_connect``). Their own forward runs with the flag off, then the branch's
      stochastic-depth module (an identity at inference) and the addition;
    - torchvision's RegNet blocks, activation(proj(x) + f(x)).
    """

    def __init__(self):
        self.block: nn.Module | None = None
        self.flag: str | None = None

    def apply(self, root_module: nn.Module) -> list[Canonizer]:
        blocks: list[tuple[nn.Module, str | None]] = []
        for module in root_module.modules():
            kind = type(module)
            blocks += [
                (module, flag)
                for prefix, flag, _ in _FLAGGED_RESIDUALS
                if kind.__module__.startswith(prefix) and vars(module).get(flag) is True
            ]
            if kind.__module__ == "torchvision.models.regnet" and kind.__name__ == "ResBottleneckBlock":
                blocks.append((module, None))
        return _register_each(type(self), blocks)

    def register(self, block: nn.Module, flag: str | None) -> None:
        self.block, self.flag = block, flag
        if flag is not None:
            setattr(block, flag, False)
        block.explain_residual_sum = Sum()
        block.forward = (self.flagged_forward if flag is not None else self.regnet_forward).__get__(block)

    def remove(self) -> None:
        if self.block is not None:
            vars(self.block).pop("forward", None)
            self.block._modules.pop("explain_residual_sum", None)
            if self.flag is not None:
                setattr(self.block, self.flag, True)

    # ``block``: timm's or torchvision's residual block, with attributes of its own class
    @staticmethod
    def flagged_forward(block: Any, x: Tensor) -> Tensor:
        branch = type(block).forward(block, x)
        for _, _, dropping in _FLAGGED_RESIDUALS:
            if isinstance(getattr(block, dropping, None), nn.Module):
                branch = getattr(block, dropping)(branch)
        return block.explain_residual_sum(torch.stack([branch, x], dim=-1))

    @staticmethod
    def regnet_forward(block: Any, x: Tensor) -> Tensor:
        shortcut = x if block.proj is None else block.proj(x)
        return block.activation(block.explain_residual_sum(torch.stack([block.f(x), shortcut], dim=-1)))


class TracedMergeBatchNorm(MergeBatchNorm):
    """zennit's batch-norm merge for given (layer, batch norm) pairs, leaving the batch norm
    exactly the identity (zennit's divides by sqrt(1 + eps))."""

    def __init__(self, pairs: Sequence[tuple[nn.Module, nn.Module]] = ()):
        super().__init__()
        self.pairs = list(pairs)

    def apply(self, root_module: nn.Module) -> list[Canonizer]:
        return _register_each(type(self), [((layer,), norm) for layer, norm in self.pairs])

    def remove(self) -> None:
        if self.batch_norm_params is not None:  # else the merge failed before changing anything
            super().remove()

    @staticmethod
    def merge_batch_norm(modules, batch_norm) -> None:
        MergeBatchNorm.merge_batch_norm(modules, batch_norm)
        batch_norm.running_var.data = batch_norm.running_var.data - batch_norm.eps


def traced_batch_norm_pairs(
    model: nn.Module, images: Tensor
) -> tuple[list[tuple[nn.Module, nn.Module]], nn.Module | None]:
    """The (convolution or linear layer, batch norm) pairs of ``model`` where the batch norm
    receives the very tensor the layer returned, unchanged in place, each called once: the
    pairs a merge leaves the model's function unchanged for; and the first convolution that
    runs (the one that sees the pixels; not necessarily the first registered). One forward
    pass on the first image, with hooks removed afterwards, finds them."""
    producers: dict[int, tuple[nn.Module, Tensor, int]] = {}
    calls: dict[nn.Module, int] = {}
    pairs = []

    def record(module: nn.Module, inputs, output) -> None:
        calls[module] = calls.get(module, 0) + 1
        if isinstance(output, Tensor):
            producers[id(output)] = (module, output, output._version)

    def match(module: nn.Module, inputs) -> None:
        if not inputs:
            return
        layer, output, version = producers.get(id(inputs[0]), (None, None, None))
        if output is inputs[0] and version == output._version and isinstance(layer, (ConvolutionStandard, nn.Linear)):
            pairs.append((layer, module))

    norms = [
        module
        for module in model.modules()
        if isinstance(module, BatchNorm)
        and module.affine
        and module.running_mean is not None
        and module.running_var is not None
    ]
    leaves = [module for module in model.modules() if next(module.children(), None) is None]
    handles = [module.register_forward_pre_hook(match) for module in norms]
    handles += [module.register_forward_hook(record) for module in {*leaves, *norms}]
    try:
        with torch.no_grad():
            model(images[:1])
    finally:
        for handle in handles:
            handle.remove()
    pairs = [(layer, norm) for layer, norm in pairs if calls.get(layer) == 1 and calls.get(norm) == 1]
    first = next((module for module in calls if isinstance(module, ConvolutionStandard)), None)
    return pairs, first


@contextmanager
def restored_modules(model: nn.Module) -> Iterator[None]:
    """Afterwards, whatever happened, every module has its parameters, buffers, submodules
    and hooks back, the same tensors with the same storage, and no attribute added or
    removed. zennit undoes its canonizers and hooks itself, but not those a failure half-way
    through registering them leaves behind."""
    saved = []
    for module in model.modules():
        dicts = {key: dict(getattr(module, key)) for key in _MODULE_DICTS if hasattr(module, key)}
        owned = itertools.chain(module._parameters.values(), module._buffers.values())
        tensors = [(tensor, tensor.data) for tensor in owned if tensor is not None]
        saved.append((module, dict(vars(module)), dicts, tensors))
    try:
        yield
    finally:
        for module, attributes, dicts, tensors in saved:
            for key, entries in dicts.items():
                getattr(module, key).clear()
                getattr(module, key).update(entries)
            for tensor, data in tensors:
                if tensor.data_ptr() != data.data_ptr() or tensor.shape != data.shape:
                    tensor.data = data
            current = vars(module)
            for key in set(current) - set(attributes):
                del current[key]
            current.update((key, attributes[key]) for key in set(attributes) - set(current))


def unseen_merges(output: Tensor) -> int:
    """How many additions, subtractions or products of two activations outside any module
    (functional residual additions, gates) the graph of ``output`` holds: relevance is
    copied through them, not divided."""
    seen, stack, count = set(), [output.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        parents = [parent for parent, _ in node.next_functions if parent is not None]
        count += type(node).__name__ in _UNSEEN_MERGES and len(parents) > 1
        stack.extend(parents)
    return count


def _mean_and_std(model: nn.Module, normalization) -> tuple[Tensor, Tensor]:
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


def _zbox_bounds(images: Tensor, mean: Tensor, std: Tensor) -> tuple[Tensor, Tensor]:
    """The z-box bounds (N, C, 1, 1): pixels 0 and 1 normalised by ``mean`` and ``std``,
    widened to each image."""
    low = (-mean / std).to(images).reshape(1, -1, 1, 1)
    high = ((1 - mean) / std).to(images).reshape(1, -1, 1, 1)
    return (
        torch.minimum(low, images.amin(dim=(2, 3), keepdim=True)),
        torch.maximum(high, images.amax(dim=(2, 3), keepdim=True)),
    )


def _lrp_composite(model: nn.Module, images: Tensor, first: Hook, *, gamma: float, epsilon: float) -> Composite:
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
        if isinstance(module, (BatchNorm, Activation)) or is_relu_like(module):
            return passed
        return None

    canonizers = [
        TracedMergeBatchNorm(pairs),
        ResNetBasicBlockCanonizer(),
        ResNetBottleneckCanonizer(),
        ResidualSumCanonizer(),
    ]
    return Composite(module_map=rule_for, canonizers=canonizers)


@contextmanager
def _registered_composite(composite: Composite, model: nn.Module) -> Iterator[None]:
    """``composite`` on ``model``, removed afterwards, also if registering it failed."""
    try:
        composite.register(model)
        yield
    finally:
        composite.remove()


def _check_canonical_output(output: Tensor, reference: Tensor) -> None:
    """RuntimeError unless the canonical model's ``output`` matches the model's ``reference``."""
    if not torch.allclose(output.detach(), reference, rtol=1e-3, atol=1e-4 * float(reference.abs().max())):
        raise RuntimeError(
            "LRP's canonical form of the model (batch norms merged into their layers, residual additions "
            "as modules) computes another output than the model, e.g. where a merged layer's output is "
            "also used elsewhere; LRP cannot explain this model"
        )


@register
class LRP(Attribution):
    """Layer-wise Relevance Propagation (LRP): the score handed back to the pixels, layer by layer.

    The epsilon / gamma / z-box composite for CNNs; the pixels' relevance sums to the score.
    Models with attention layers (transformers) are refused with
    :class:`~explain.NotApplicable`: no rule here conserves relevance through attention.

    Bach et al., "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by
    Layer-Wise Relevance Propagation", PLoS ONE 10(7), 2015; rules and composite as in
    Montavon et al., "Layer-Wise Relevance Propagation: An Overview", in Explainable AI,
    LNCS 11700, 2019. Output j's relevance R_j goes to its inputs i by

    - dense layers, LRP-epsilon: R_i = sum_j (x_i w_ij + b_j / n_j) / (z_j + epsilon
      sign(z_j)) R_j;
    - convolutions, LRP-gamma: the same with w + gamma w^+ and b + gamma b^+ in place of w
      and b (for z_j >= 0; w^-, b^- where z_j < 0, and swapped for negative inputs, as
      zennit's ``Gamma``), which favours positive evidence and keeps denominators off zero;
    - the first convolution, on normalised (signed) pixels where z+ does not apply: the
      z-box rule (``first_rule="zbox"``), R_i = sum_j (x_i w_ij - l_i w_ij^+ - h_i w_ij^-)
      / sum_i' (...) R_j, with l and h the pixel range [0, 1] under ``normalization``
      (mean, std; default: a timm model's ``pretrained_cfg``, else ImageNet's), widened to
      the batch; or the flat rule (``"flat"``), R_j shared equally, ignoring the pixels;
    - sums (residual additions) and average pools: R_i proportional to x_i; activations
      and unmerged batch norms pass R unchanged; max pools route it as the gradient does.

    The explained class c starts with R = z_c; a callable target f with R = z * df/dz at
    the output, which sums to f(z) for any linear f.

    Conservation. The share of a neuron's bias, b_j / n_j, and what a stabiliser holds
    back go equally to its n_j inputs (the flat rule's division) instead of being absorbed.
    With the usual rules the biases (with the merged batch norms' shifts) absorb a third or
    more of the score on ResNets and nearly all of it on the bundled model; left out of the
    rules (zennit's ``zero_params="bias"``) they leave denominators near zero on the bundled
    model, whose depthwise convolutions see whole channels of zeros, and relevance explodes.
    Only ``epsilon`` absorbs, ``epsilon / (|z_j| + epsilon)`` of R_j at dense layers: the
    default 1e-6 keeps the sum; a larger one (Montavon et al. use 0.25) drops weak evidence
    on purpose. Measured ``|sum(R) - z_c| / |z_c|``, top class, photos from data/images,
    224 x 224; torchvision models with random weights and batch-norm statistics:

    ================================  ============  ============  ==============================
    LRP by                            resnet18      resnet50      efficientnet_lite0
    ================================  ============  ============  ==============================
    captum 0.9 ``LRP``                3e12 - 2e13   1e29 - 1e30   fails: no rule for Conv2dSame
    zennit 0.5.1 ``EpsilonGammaBox``  0.3 - 0.4     0.6 - 0.7     0.98 - 0.99
    the same, ``zero_params="bias"``  5e-5          1e-4          1e27 - 4e29
    this class                        4e-7          2e-7          < 2e-5
    ================================  ============  ============  ==============================

    zennit's rows use the canonizers of this class (with zennit's own only, the bundled
    model's sum is 110 times its score). captum copies relevance through every residual
    addition (no module, so no rule) and has no rule for timm's layers; zennit (Anders et
    al., arXiv:2106.13200) has canonizers and takes custom rules, so this class runs
    zennit, with the rules above.

    Not covered: residual additions and gates that no canonizer here turns into a module
    (torchvision's ConvNeXt blocks; the squeeze-excitation gates of MobileNetV3 and
    EfficientNet) copy relevance, and activations called as functions (``F.relu``:
    GoogLeNet, DenseNet) drop the relevance that reaches their inactive units. A score
    near epsilon (an untrained network's logits of 1e-9) is absorbed. The call warns when the graph
    holds such an addition or product of two activations, or, with epsilon at most 1e-4,
    when the pixels' relevance misses the score by over 1 %. Batch norms that do not follow
    a layer (pre-activation blocks, DenseNet) are not merged: R passes them unchanged. The
    model's parameters, buffers, hooks and flags are as they were after the call, bitwise,
    also when it fails.

    >>> import torchvision
    >>> result = LRP(torchvision.models.resnet18().eval())(torch.randn(1, 3, 64, 64))
    >>> score = result.logits.max().item()
    >>> abs(result.raw.sum().item() - score) < 1e-4 * abs(score)
    True
    """

    name = "lrp"
    family = "gradient attribution"
    images_only = "its box rule's bounds and canonizers are written for 2-D convolutions"
    cost = "3 forward + 1 backward, each layer rerun about 8 times by its rule"
    check_runs = True  # a model its canonical form cannot reproduce shows only in a full pass

    def __init__(
        self,
        model: nn.Module,
        *,
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        first_rule: str = "zbox",
        normalization: tuple[Sequence[float], Sequence[float]] | None = None,
        **options,
    ):
        super().__init__(model, **options)
        self.epsilon = checked_number("epsilon", epsilon, positive=True)
        self.gamma = checked_number("gamma", gamma, positive=False)
        if first_rule not in FIRST_RULES:
            raise ValueError(f"unknown first_rule {first_rule!r}; use one of {', '.join(FIRST_RULES)}")
        self.first_rule = first_rule
        self.mean, self.std = _mean_and_std(model, normalization)

    def bounds(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """The z-box bounds (N, C, 1, 1): pixels 0 and 1 normalised, widened to each image."""
        return _zbox_bounds(images, self.mean, self.std)

    def composite(self, model: nn.Module, images: Tensor) -> Composite:
        """The rules and canonizers for ``model`` on ``images``."""
        first: Hook = zbox_rule(*self.bounds(images)) if self.first_rule == "zbox" else Flat()
        return _lrp_composite(model, images, first, gamma=self.gamma, epsilon=self.epsilon)

    registered = staticmethod(_registered_composite)

    def attribute_targets(self, scored: ScoredModel, images: Tensor) -> list[Tensor]:
        """One canonical forward pass with the rules registered, one backward pass per target."""
        if has_attention(scored.model):
            raise NotApplicable(
                "LRP's rules here are for CNNs: none conserves relevance through attention (the softmax and the "
                "product of queries, keys and values); for a transformer use attention-relevance (Chefer et al.), "
                "legrad or gradcam"
            )
        model, reference = scored.model, scored.output
        if not isinstance(reference, Tensor):
            raise TypeError(
                f"LRP with a callable target needs a model that returns one tensor, got "
                f"{type(reference).__name__}; explain class ids, which LRP reads by the output's logits"
            )
        inputs = images.detach().requires_grad_()
        relevances = []
        with restored_modules(model), self.registered(self.composite(model, images), model):
            output = model(inputs)
            if scored.custom is None:  # a dict or a Hugging Face output: its logits, as the other methods read
                output = class_logits(output)
            _check_canonical_output(output, reference)
            merges = unseen_merges(output)
            for k in range(scored.num_targets):
                start = _start_relevance(scored, output, k)
                last = k == scored.num_targets - 1
                (relevance,) = torch.autograd.grad(output, inputs, grad_outputs=start, retain_graph=not last)
                if k == 0:
                    self._check_conservation(relevance, start, merges)
                relevances.append(relevance)
        return relevances

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        return self.attribute_targets(scored, images)[k]

    def _check_conservation(self, relevance: Tensor, start: Tensor, merges: int) -> None:
        """Warn where the pixels' relevance does not sum to the output's: a larger epsilon
        absorbs some on purpose, anything else means parts of the model no rule covers."""
        score = start.flatten(1).sum(dim=1)
        gap = float(((relevance.flatten(1).sum(dim=1) - score).abs() / score.abs().clamp_min(1e-12)).max())
        if merges:
            cause = (
                f"the model adds or multiplies two activations outside any module (found: {merges}; "
                "residual additions or gates no canonizer covers), which copies relevance"
            )
        elif gap > 0.01 and self.epsilon <= 1e-4:
            cause = "relevance is lost or copied where no rule applies (e.g. activations called as functions)"
        else:
            return
        # One message per cause (no figures in it), so Python shows it once, not per batch.
        warnings.warn(f"LRP: the pixels' relevance does not sum to the score: {cause}", stacklevel=4)


def _start_relevance(scored: ScoredModel, output: Tensor, k: int) -> Tensor:
    """The relevance at the output: the explained logit in its place, or z * df/dz for a
    callable target f."""
    if scored.custom is not None:
        (gradient,) = torch.autograd.grad(scored.custom(output).sum(), output, retain_graph=True)
        return (output * gradient).detach()
    ids = scored.ids_of(k)[:, None]
    return torch.zeros_like(output).scatter(1, ids, output.gather(1, ids)).detach()
