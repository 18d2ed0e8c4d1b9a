"""The canonizer of :class:`~explain.AttnLRP`: layer norms and element-wise activations of a
transformer run, for the call, through forwards that carry AttnLRP's rules
(:func:`~explain.methods.relevance.attention_rules.layer_norm_rule`,
:class:`~explain.methods.relevance.attention_rules.IdentityRule`); the attention itself runs
through :func:`~explain.attention_capture.ruled_attention`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from torch import Tensor, nn
from zennit.canonizers import Canonizer

from .attention_rules import IdentityRule, layer_norm_rule

__all__ = ["ACTIVATION_MODULES", "RuledForwardCanonizer", "ruled_forward"]

#: The modules whose classes are element-wise activations, where the identity rule applies:
#: the classes of these modules but the named ones (which are not element-wise).
ACTIVATION_MODULES: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "torch.nn.modules.activation",
        frozenset({"MultiheadAttention", "Softmax", "Softmin", "LogSoftmax", "Softmax2d", "GLU"}),
    ),
    ("timm.layers.activations", frozenset()),
    ("transformers.activations", frozenset({"LinearActivation"})),
)
# Layer norms over the last axes, and over the channels of (N, C, H, W): (module, class name).
_LAST_AXES = frozenset({("torch.nn.modules.normalization", "LayerNorm"), ("timm.layers.norm", "LayerNorm")})
_CHANNELS = frozenset({("timm.layers.norm", "LayerNorm2d"), ("torchvision.models.convnext", "LayerNorm2d")})


def _layer_norm(module: Any, x: Tensor, channels: bool) -> Tensor:
    if channels:
        shape = (-1, *([1] * (x.dim() - 2)))
        weight = None if module.weight is None else module.weight.reshape(shape)
        bias = None if module.bias is None else module.bias.reshape(shape)
        return layer_norm_rule(x, (1,), weight, bias, module.eps)
    dims = tuple(range(-len(module.normalized_shape), 0))
    return layer_norm_rule(x, dims, module.weight, module.bias, module.eps)


def _activation(module: Any, x: Tensor) -> Tensor:
    return IdentityRule.apply(x, partial(type(module).forward, module))


def ruled_forward(module: nn.Module) -> Callable[[Tensor], Tensor] | None:
    """The forward of ``module`` that carries AttnLRP's rule, where one applies: the layer
    norms of torch, timm and torchvision (the standard deviation a constant) and element-wise
    activation modules (:data:`ACTIVATION_MODULES`: the identity rule); None for others.
    Layer norms of other classes keep their forward, which the rules do not cover."""
    kind = (type(module).__module__, type(module).__name__)
    if kind in _LAST_AXES or kind in _CHANNELS:
        return partial(_layer_norm, module, channels=kind in _CHANNELS)
    if any(kind[0] == home and kind[1] not in excluded for home, excluded in ACTIVATION_MODULES):
        return partial(_activation, module)
    return None


class RuledForwardCanonizer(Canonizer):
    """For the call, each layer norm and element-wise activation of the model (see
    :func:`ruled_forward`) runs the forward that carries its rule; :meth:`remove` puts back
    what the module had."""

    def __init__(self):
        self.module: nn.Module | None = None
        self.saved: dict[str, Any] = {}

    def apply(self, root_module: nn.Module) -> list[Canonizer]:
        instances: list[Canonizer] = []
        try:
            for module in root_module.modules():
                forward = ruled_forward(module)
                if forward is not None:
                    instance = type(self)()
                    instance.register(module, forward)
                    instances.append(instance)
        except BaseException:
            for instance in instances:
                instance.remove()
            raise
        return instances

    def register(self, module: nn.Module, forward: Callable[[Tensor], Tensor]) -> None:
        self.module = module
        self.saved = {key: vars(module)[key] for key in ("forward",) if key in vars(module)}
        module.forward = forward  # an instance's own forward, for the call

    def remove(self) -> None:
        if self.module is not None:
            vars(self.module).pop("forward", None)
            vars(self.module).update(self.saved)
