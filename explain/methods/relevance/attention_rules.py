"""AttnLRP's rules (Achtibat et al., ICML 2024) as modified gradients: the relevance of an
input is the input times a gradient whose backward functions carry the rules, so that one
forward and one backward pass give the relevance of every pixel ("LRP as modified gradient",
as the reference implementation, ``lxt``, computes it).

With R_j = z_j g_j (relevance = output times the incoming modified gradient), an operation's
plain gradient already gives

- LRP-epsilon (epsilon -> 0) on linear maps (dense layers, convolutions, the scaling of the
  attention logits, the centring of a layer norm, sums and means): R_i = sum_j x_i
  dz_j/dx_i / z_j R_j, additive terms (biases, the class token, position embeddings)
  keeping their share;
- the softmax rule of the paper's Proposition 3.1 (a Taylor decomposition at x, with its
  bias): R_i = x_i (R_i' - s_i sum_j R_j'), where R' is the relevance of the outputs s.

The other rules change the gradient (:class:`UniformRule`, :class:`IdentityRule`,
:func:`layer_norm_rule`, :func:`attnlrp_attention`, :func:`cp_attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function

from ...attention_capture import attention_weights

__all__ = [
    "ATTENTION_RULES",
    "IdentityRule",
    "SoftmaxRecord",
    "UniformRule",
    "attnlrp_attention",
    "cp_attention",
    "layer_norm_rule",
]

#: How relevance passes through attention: AttnLRP's softmax and bilinear rules, or CP-LRP's
#: attention weights taken as constants.
ATTENTION_RULES = ("attnlrp", "cp")


class UniformRule(Function):
    """The identity, whose gradient is divided by ``factor``: the uniform rule of the paper's
    Proposition 3.2 for a product of ``factor`` terms. For z = a b, gradient times input gives
    each factor all of z g = R_z (a dz/da = b dz/db = z); with the gradient halved, each gets
    R_z / 2. On a matrix product (sums of such products, LRP-epsilon over the sum, then the
    uniform rule: Proposition 3.3) the same division applies."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor, None]:
        return gradient / ctx.factor, None


class IdentityRule(Function):
    """``function(x)`` for an element-wise ``function`` (GELU, SiLU, ...), with the identity
    rule of the paper's Eq. 9: R_x = R_y, each unit's relevance passed on whole. As a
    modified gradient: g_x = y / x g_y, so that x g_x = y g_y, exactly (no stabiliser: the
    ratio is finite wherever x is not zero, and where it is, x g_x is zero whatever g_x; lxt
    divides by x + 1e-10, which moves units within 1e-6 of zero by 1e-4 of their relevance)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, function: Callable[[Tensor], Tensor]) -> Tensor:
        y = function(x)
        nonzero = x != 0
        ctx.save_for_backward(torch.where(nonzero, y / torch.where(nonzero, x, 1.0), 0.0))
        return y

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return gradient * ratio, None


def layer_norm_rule(x: Tensor, dims: tuple[int, ...], weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """Layer norm over the axes ``dims`` of ``x``, (x - mean) / std * weight + bias, with the
    standard deviation taken as a constant (detached): the identity rule on the division by
    it (the paper's Proposition 3.4), LRP-epsilon on the centring (a linear map, which
    conserves relevance) and the affine map (the bias keeping its share)."""
    mean = x.mean(dim=dims, keepdim=True)
    centred = x - mean
    std = (centred.detach().pow(2).mean(dim=dims, keepdim=True) + eps).sqrt()
    y = centred / std
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


class SoftmaxRecord:
    """The attention logits and weights of each attention call, where a caller wants to
    account for the relevance the softmax's bias absorbs (tests, diagnostics)."""

    def __init__(self):
        self.logits: list[Tensor] = []
        self.weights: list[Tensor] = []


def _weights(query: Tensor, key: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None):
    """The attention weights softmax(Q K^T * scale + mask) and the logits they come from."""
    logits = attention_weights(query, key, attn_mask, is_causal, scale, logits=True)
    return logits, logits.softmax(dim=-1)


def attnlrp_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    record: SoftmaxRecord | None = None,
) -> Tensor:
    """softmax(Q K^T * scale + mask) V with AttnLRP's rules: the uniform rule on both matrix
    products (half the relevance of A V to the attention weights A, half to V; half that of
    Q K^T to Q, half to K), and on the softmax its Taylor rule at the logits, which is the
    plain gradient times the logits (the logits' relevance does not sum to that of the
    weights: the rule's bias term holds the rest)."""
    half = 2.0
    query, key = UniformRule.apply(query, half), UniformRule.apply(key, half)
    logits, weights = _weights(query, key, attn_mask, is_causal, scale)
    if record is not None:
        record.logits.append(logits)
        record.weights.append(weights)
    return UniformRule.apply(weights, half) @ UniformRule.apply(value, half)


def cp_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """softmax(Q K^T * scale + mask) V with CP-LRP's rule (Ali et al., "XAI for
    Transformers: Better Explanations through Conservative Propagation", ICML 2022): the
    attention weights are constants, so A V is a linear map of V and all its relevance goes
    to V (LRP-epsilon), none through the softmax to the queries and keys."""
    _, weights = _weights(query.detach(), key.detach(), attn_mask, is_causal, scale)
    return weights @ value
