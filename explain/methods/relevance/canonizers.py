"""Canonizers: the model put in a form whose every step is a module a rule can read, for
the call, and put back afterwards.

Each batch norm that receives a layer's output is merged into that layer
(:class:`TracedMergeBatchNorm`), residual additions written in ``forward`` become zennit
``Sum`` modules (:class:`ResidualSumCanonizer`), squeeze-excitation gates and layer scales
become constant weights (:class:`GateCanonizer`, :class:`GatedPath`), and poolings and ReLUs
called as functions become modules (:class:`FunctionalHeadCanonizer`). :func:`restored_modules` puts every module
back as it was, also after a failure half-way through.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from zennit.canonizers import Canonizer, MergeBatchNorm
from zennit.layer import Sum

__all__ = [
    "FunctionalHeadCanonizer",
    "GateCanonizer",
    "GatedPath",
    "ResidualSumCanonizer",
    "TracedMergeBatchNorm",
    "restored_modules",
]

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


class GatedPath(torch.autograd.Function):
    """The product ``gated`` of ``x`` and a gate (a squeeze-excitation gate, a layer scale)
    as its value; backward, the relevance of the product goes to ``x`` whole and none to the
    gate. The gate is taken as a constant positive weight per unit, under which a
    proportional rule passes each unit's relevance on whole: R_x = x g / (x g) R."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, gated: Tensor) -> Tensor:
        return gated.clone()

    @staticmethod
    def backward(ctx: Any, relevance: Tensor) -> tuple[Tensor, None]:
        return relevance, None


# Squeeze-excitation modules, which return x * gate(x): (module prefix, class names).
_GATES = (
    ("torchvision.", frozenset({"SqueezeExcitation"})),
    ("timm.", frozenset({"SqueezeExcite", "SEModule", "EffectiveSEModule", "SqueezeExciteCl"})),
)


class GateCanonizer(Canonizer):
    """Squeeze-excitation gates (torchvision's ``SqueezeExcitation`` in MobileNetV3 and
    EfficientNet, timm's ``SqueezeExcite``, ``SEModule`` and ``EffectiveSEModule``): the
    gate, computed from the input as the module does, is taken as a constant weight, and the
    relevance passes through the gated path only (:class:`GatedPath`), none into the branch
    that computes the gate."""

    def __init__(self):
        self.gate: nn.Module | None = None

    def apply(self, root_module: nn.Module) -> list[Canonizer]:
        gates = [
            (module,)
            for module in root_module.modules()
            if any(
                type(module).__module__.startswith(prefix) and type(module).__name__ in names
                for prefix, names in _GATES
            )
        ]
        return _register_each(type(self), gates)

    def register(self, gate: nn.Module) -> None:
        self.gate = gate
        gate.forward = self.gated_forward.__get__(gate)

    def remove(self) -> None:
        if self.gate is not None:
            vars(self.gate).pop("forward", None)

    # ``gate``: a squeeze-excitation module of torchvision or timm
    @staticmethod
    def gated_forward(gate: Any, x: Tensor) -> Tensor:
        return GatedPath.apply(x, type(gate).forward(gate, x.detach()))


# torchvision models whose forward pools (DenseNet: and applies ReLU) by a function, where no
# rule applies: (module, class name).
_FUNCTIONAL_HEADS = frozenset(
    {
        ("torchvision.models.densenet", "DenseNet"),
        ("torchvision.models.mobilenetv2", "MobileNetV2"),
        ("torchvision.models.shufflenetv2", "ShuffleNetV2"),
    }
)


class FunctionalHeadCanonizer(Canonizer):
    """torchvision's DenseNet, MobileNetV2 and ShuffleNetV2 pool their features by a function
    (``F.adaptive_avg_pool2d``, ``x.mean``), which the gradient divides equally, and DenseNet
    calls ``F.relu`` on them, whose gradient drops what reaches inactive units (relevance
    from a shared bias): their forward runs the same steps as modules, ``nn.ReLU`` and
    ``nn.AdaptiveAvgPool2d``, which the rules cover (DenseNet's concatenations route
    relevance as the gradient does)."""

    def __init__(self):
        self.model: nn.Module | None = None

    def apply(self, root_module: nn.Module) -> list[Canonizer]:
        heads = [(m,) for m in root_module.modules() if (type(m).__module__, type(m).__name__) in _FUNCTIONAL_HEADS]
        return _register_each(type(self), heads)

    def register(self, model: nn.Module) -> None:
        self.model = model
        model.explain_relu = nn.ReLU()
        model.explain_pool = nn.AdaptiveAvgPool2d(1)
        model.forward = self.head_forward.__get__(model)

    def remove(self) -> None:
        if self.model is not None:
            vars(self.model).pop("forward", None)
            self.model._modules.pop("explain_relu", None)
            self.model._modules.pop("explain_pool", None)

    # ``model``: torchvision's DenseNet, MobileNetV2 or ShuffleNetV2
    @staticmethod
    def head_forward(model: Any, x: Tensor) -> Tensor:
        if hasattr(model, "stage2"):  # ShuffleNetV2
            x = model.conv5(model.stage4(model.stage3(model.stage2(model.maxpool(model.conv1(x))))))
            return model.fc(torch.flatten(model.explain_pool(x), 1))
        features = model.features(x)
        if hasattr(model.features, "denseblock1"):  # DenseNet
            features = model.explain_relu(features)
        return model.classifier(torch.flatten(model.explain_pool(features), 1))


# Blocks that add their input to their output where a flag says so: (module prefix, flag,
# the module that drops the branch in training, an identity at inference).
_FLAGGED_RESIDUALS = (
    ("timm.", "has_skip", "drop_path"),
    ("torchvision.models.", "use_res_connect", "stochastic_depth"),
)


# Blocks that always add their shortcut in forward: (module, class name).
_UNFLAGGED_RESIDUALS = frozenset(
    {
        ("torchvision.models.regnet", "ResBottleneckBlock"),
        ("torchvision.models.video.resnet", "BasicBlock"),
        ("torchvision.models.video.resnet", "Bottleneck"),
        ("torchvision.models.convnext", "CNBlock"),
    }
)


class ResidualSumCanonizer(Canonizer):
    """Residual blocks that add in ``forward`` (no module, so no rule) add through a zennit
    ``Sum`` module instead, whose rule shares relevance in proportion to the two terms:

    - blocks whose addition a flag switches on: timm's EfficientNet / MobileNet blocks
      (``has_skip``) and torchvision's MobileNetV2 / V3 and EfficientNet blocks
      (``use_res_connect``). Their own forward runs with the flag off, then the branch's
      stochastic-depth module (an identity at inference) and the addition;
    - torchvision's RegNet blocks, activation(proj(x) + f(x));
    - torchvision's video ResNet blocks (r3d_18, mc3_18, r2plus1d_18), relu(convs(x) + x);
    - torchvision's ConvNeXt blocks (``CNBlock``: depthwise convolution, layer norm, MLP),
      gamma * block(x) + x, the layer scale gamma a constant weight (:class:`GatedPath`).
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
            if (kind.__module__, kind.__name__) in _UNFLAGGED_RESIDUALS:
                blocks.append((module, None))
        return _register_each(type(self), blocks)

    def register(self, block: nn.Module, flag: str | None) -> None:
        self.block, self.flag = block, flag
        if flag is not None:
            setattr(block, flag, False)
        block.explain_residual_sum = Sum()
        if flag is not None:
            forward = self.flagged_forward
        elif hasattr(block, "layer_scale"):
            forward = self.convnext_forward
        else:
            forward = self.regnet_forward if hasattr(block, "proj") else self.video_forward
        block.forward = forward.__get__(block)

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

    @staticmethod
    def convnext_forward(block: Any, x: Tensor) -> Tensor:
        branch = block.block(x)
        branch = block.stochastic_depth(GatedPath.apply(branch, block.layer_scale * branch.detach()))
        return block.explain_residual_sum(torch.stack([branch, x], dim=-1))

    @staticmethod
    def video_forward(block: Any, x: Tensor) -> Tensor:
        out = block.conv2(block.conv1(x))
        if hasattr(block, "conv3"):  # a bottleneck
            out = block.conv3(out)
        shortcut = x if block.downsample is None else block.downsample(x)
        return block.relu(block.explain_residual_sum(torch.stack([out, shortcut], dim=-1)))


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
