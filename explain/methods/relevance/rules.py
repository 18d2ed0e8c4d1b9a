"""The LRP rules of this package, as zennit hooks: how a layer hands the relevance of its
outputs to its inputs."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from zennit.core import BasicHook, ParamMod, Stabilizer
from zennit.rules import ClampMod, GammaMod, NoMod

__all__ = [
    "Group",
    "SharingRule",
    "Term",
    "epsilon_rule",
    "excitation_rule",
    "gamma_rule",
    "proportional_rule",
    "zbox_rule",
]

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


def excitation_rule(negated: Callable[[], bool] = lambda: False, stabilizer: float = 1e-6) -> BasicHook:
    """Excitation Backprop's rule (Zhang et al., ECCV 2016, sec. 3.2): P(a_i) = sum_j a_i w_ij^+
    / (sum_i' a_i' w_i'j^+) P(a_j), the bias left out; for signed inputs, as zennit's ``ZPlus``,
    negative inputs count with w^- (a_i^+ w^+ + a_i^- w^-). While ``negated()`` is true the
    layer's weights are negated first: the dual unit of contrastive Excitation Backprop, read
    when the backward pass runs, so that one forward pass serves both."""
    stabilize = Stabilizer.ensure(stabilizer)

    def weights(keep: Callable[[Tensor], Tensor]) -> ParamMod:
        return ParamMod(lambda param, name: keep(-param if negated() else param), zero_params=["bias"])

    return BasicHook(
        input_modifiers=[lambda x: x.clamp(min=0), lambda x: x.clamp(max=0)],
        param_modifiers=[weights(lambda w: w.clamp(min=0)), weights(lambda w: w.clamp(max=0))],
        output_modifiers=[_identity, _identity],
        gradient_mapper=lambda grad, outputs: [grad / stabilize(outputs[0] + outputs[1])] * 2,
        reducer=lambda inputs, gradients: inputs[0] * gradients[0] + inputs[1] * gradients[1],
    )
