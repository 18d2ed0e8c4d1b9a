"""The one place where explain reaches into captum's private parts.

captum's public classes guide the gradient at ``nn.ReLU`` only (Guided Backprop,
Deconvolution) and apply DeepLift's rescale rule to six activation classes, one call per
module and forward pass; explain extends both to every element-wise activation of the models
it meets (ReLU6, SiLU, GELU, timm's activations) and to modules called twice in a forward pass
(a ResNet block's shared ReLU). captum offers no public hook for either, so the subclasses
below override its private methods (``_register_hooks``, ``_is_non_linear``, the forward and
backward hooks) and import its private helpers (``_register_backward_hook``, the DeepLift
rules, the quadrature of the path methods, the Lasso that LIME fits). All of that is here,
so that a captum release that renames them breaks this module alone, and
``tests/test_attribution.py`` (parity with captum's public classes) says so.

The classes take the modules they act on as a predicate (``guided=``, ``rescaled=``): which
activations those are is explain's choice (:mod:`explain.methods.gradient_attribution`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import captum.attr as captum_attr
from captum._utils.common import _register_backward_hook
from captum.attr._core.deep_lift import SUPPORTED_NON_LINEAR, nonlinear
from captum.attr._utils.approximation_methods import approximation_parameters
from torch import nn

__all__ = [
    "DeconvolutionAt",
    "GuidedBackpropAt",
    "RescaleDeepLift",
    "RescaleDeepLiftShap",
    "lasso",
    "path_points",
]

ModulePredicate = Callable[[nn.Module], bool]


def path_points(method: str, n_steps: int) -> tuple[list[float], list[float]]:
    """captum's quadrature of a path method (``"riemann_trapezoid"``, ``"gausslegendre"``...):
    the step sizes and the points (fractions of the way from the baseline) of ``n_steps`` steps.

    >>> sizes, alphas = path_points("riemann_trapezoid", 3)
    >>> alphas, [round(size, 3) for size in sizes]
    ([0.0, 0.5, 1.0], [0.167, 0.333, 0.167])
    """
    step_sizes, alphas = approximation_parameters(method)
    return list(step_sizes(n_steps)), list(alphas(n_steps))


def lasso(alpha: float):
    """captum's Lasso interpretable model (scikit-learn's ``Lasso`` behind captum's interface),
    for LIME; imported on first use (it imports scikit-learn)."""
    from captum._utils.models.linear_model import SkLearnLasso

    return SkLearnLasso(alpha=alpha)


class _GuidedAt:
    """Mixin for captum's ModifiedReluGradientAttribution: hook the modules ``guided`` picks."""

    # captum's, set by ModifiedReluGradientAttribution
    backward_hooks: list
    _backward_hook: Callable[..., Any]
    guided: ModulePredicate

    def _register_hooks(self, module: nn.Module) -> None:
        if self.guided(module):
            self.backward_hooks.extend(_register_backward_hook(module, self._backward_hook, self))


class GuidedBackpropAt(_GuidedAt, captum_attr.GuidedBackprop):
    """captum's Guided Backprop, guided at every module ``guided`` picks (captum's: ``nn.ReLU``)."""

    def __init__(self, model: nn.Module, guided: ModulePredicate):
        super().__init__(model)
        self.guided = guided


class DeconvolutionAt(_GuidedAt, captum_attr.Deconvolution):
    """captum's Deconvolution, guided at every module ``guided`` picks (captum's: ``nn.ReLU``)."""

    def __init__(self, model: nn.Module, guided: ModulePredicate):
        super().__init__(model)
        self.guided = guided


class _RescaleAt:
    """Mixin for captum's DeepLift: the rescale rule at every module ``rescaled`` picks (besides
    captum's own), and one record per call of a module, so a module may run several times in a
    forward pass.

    A module's calls are undone in reverse order in the backward pass when each call feeds
    the next (the ReLU a ResNet block calls twice). A call whose output does not reach the
    score leaves its record behind, which is reported; a module applied to parallel
    branches is not supported (a mismatch of shapes is reported, equal shapes are not seen).
    """

    # captum's, set by DeepLift
    model: nn.Module
    eps: float
    rescaled: ModulePredicate

    def attribute(self, inputs, *args, **kwargs):
        modules = [module for module in self.model.modules() if self._is_non_linear(module)]
        for module in modules:
            module.__dict__.pop("explain_inputs", None)
            module.__dict__.pop("explain_outputs", None)
        attributions = super().attribute(inputs, *args, **kwargs)  # type: ignore[misc]  # a mixin: DeepLift's
        left = [type(module).__name__ for module in modules if module.__dict__.get("explain_inputs")]
        if left:
            raise RuntimeError(
                f"DeepLift: a {left[0]} module ran in the forward pass on a path that does not reach the "
                "explained score, so its calls cannot be matched to the backward pass; explain a model "
                "without unused branches"
            )
        return attributions

    def _is_non_linear(self, module: nn.Module) -> bool:
        return type(module) in SUPPORTED_NON_LINEAR or self.rescaled(module)

    def _forward_pre_hook(self, module: nn.Module, inputs) -> None:
        module.__dict__.setdefault("explain_inputs", []).append(inputs[0].clone().detach())

    def _forward_hook(self, module: nn.Module, inputs, outputs) -> None:
        output = outputs[0] if isinstance(outputs, tuple) else outputs
        module.__dict__.setdefault("explain_outputs", []).append(output.clone().detach())

    def _backward_hook(self, module: nn.Module, grad_input, grad_output):
        inputs, outputs = module.__dict__.get("explain_inputs"), module.__dict__.get("explain_outputs")
        if not inputs or not outputs:
            raise RuntimeError(
                f"DeepLift found no recorded forward call of {type(module).__name__} for its backward pass"
            )
        recorded_input, recorded_output = inputs.pop(), outputs.pop()
        gradient = grad_input[0] if isinstance(grad_input, tuple) else grad_input
        if gradient.shape != recorded_input.shape:
            raise RuntimeError(
                f"a {type(module).__name__} module runs on parallel branches, which DeepLift cannot "
                "follow; give each branch its own module"
            )
        rule = SUPPORTED_NON_LINEAR.get(type(module), nonlinear)
        module.input = recorded_input  # captum's max-pool rule reads it there
        try:
            return rule(module, recorded_input, recorded_output, grad_input, grad_output, eps=self.eps)
        finally:
            del module.input


class RescaleDeepLift(_RescaleAt, captum_attr.DeepLift):
    """captum's DeepLift with the rescale rule at every module ``rescaled`` picks too."""

    def __init__(self, model: nn.Module, rescaled: ModulePredicate):
        super().__init__(model)
        self.rescaled = rescaled


class RescaleDeepLiftShap(_RescaleAt, captum_attr.DeepLiftShap):
    """captum's DeepLiftShap with the rescale rule at every module ``rescaled`` picks too."""

    def __init__(self, model: nn.Module, rescaled: ModulePredicate):
        super().__init__(model)
        self.rescaled = rescaled
