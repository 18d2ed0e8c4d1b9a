"""The hook engine's attention capture: the attention weights of a transformer's layers.

Attention rollout, gradient-weighted attention relevance and LeGrad read the attention
matrices softmax(Q K^T / sqrt(d)) of every self-attention layer, and two of them their
gradients. Current implementations never form those matrices: torchvision's ViT calls
``nn.MultiheadAttention``, timm and Hugging Face call ``F.scaled_dot_product_attention``,
which fuse the softmax into one kernel. :class:`AttentionCapture` computes attention in
plain torch operations for the duration of a call (the same mathematics, so the logits
agree with the fused kernels' to float rounding) and records each layer's matrix as it is
used, so gradients reach it. Inside the block:

- ``torch.nn.functional.scaled_dot_product_attention`` is the explicit computation;
- ``nn.MultiheadAttention``'s fast path is off (``torch.backends.mha``), so it calls that
  function; timm attention modules with ``fused_attn`` and Hugging Face models whose config
  chooses another attention implementation are switched to it.

Everything is put back on leaving the block, also after an error, along with the model's
train/eval flags and ``requires_grad`` flags (:func:`~explain.hooks.preserved_state`). The
patch is process-wide while the block runs: another thread's attention calls meanwhile are
computed explicitly too (same values, slower), and recorded only on this capture's thread;
it is made when the first capture of any thread opens and undone when the last one closes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .concurrency import model_lock, process_lock
from .hooks import preserved_state

__all__ = [
    "AttentionCapture",
    "AttentionRule",
    "attention_weights",
    "explicit_attention",
    "explicit_attention_kernels",
    "has_attention",
    "ruled_attention",
]

_active = threading.local()


def attention_weights(
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    logits: bool = False,
) -> Tensor:
    """softmax(Q K^T * scale + mask), as ``F.scaled_dot_product_attention`` forms it: scale
    1 / sqrt(d) by default; a boolean mask keeps the True positions, a float mask is added;
    ``is_causal`` masks the future. (N, heads, T, S). With ``logits``, what the softmax takes."""
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * scale
    if is_causal:
        future = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return scores if logits else scores.softmax(dim=-1)


def _grouped(query: Tensor, other: Tensor, enable_gqa: bool) -> Tensor:
    """Key or value heads repeated to the query's, for grouped-query attention."""
    if enable_gqa and other.shape[-3] != query.shape[-3]:
        return other.repeat_interleave(query.shape[-3] // other.shape[-3], dim=-3)
    return other


def explicit_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention`` in plain operations, recording the weights in the
    active :class:`AttentionCapture` of this thread, if any.

    >>> q = k = v = torch.rand(1, 2, 5, 8)
    >>> torch.allclose(explicit_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), atol=1e-6)
    True
    """
    rule = getattr(_active, "rule", None)
    if rule is not None:  # a relevance rule of this thread (AttnLRP): it forms the attention itself
        key, value = _grouped(query, key, enable_gqa), _grouped(query, value, enable_gqa)
        return rule(query, key, value, attn_mask, is_causal, scale)
    weights = attention_weights(query, _grouped(query, key, enable_gqa), attn_mask, is_causal, scale)
    capture = getattr(_active, "capture", None)
    if capture is not None:
        if capture.gradients and not weights.requires_grad:
            # The first attention starts the graph, as the first captured layer does in
            # LayerCapture: nothing before it is recorded, and backward stops there.
            weights = weights.detach().requires_grad_()
        capture.weights.append(weights)
    applied = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return applied @ _grouped(query, value, enable_gqa)


class _ExplicitKernel:
    """The process-wide swap of ``F.scaled_dot_product_attention`` for
    :func:`explicit_attention` and of ``nn.MultiheadAttention``'s fast path: made when the
    first block of any thread opens, undone when the last one closes (two threads that each
    saved and put back what they found would leave the swap in place for good)."""

    def __init__(self):
        self.users = 0
        self.saved: tuple | None = None

    @contextmanager
    def installed(self) -> Iterator[None]:
        with process_lock:
            if self.users == 0:
                self.saved = (F.scaled_dot_product_attention, torch.backends.mha.get_fastpath_enabled())
                F.scaled_dot_product_attention = explicit_attention
                torch.backends.mha.set_fastpath_enabled(False)
            self.users += 1
        try:
            yield
        finally:
            with process_lock:
                self.users -= 1
                if self.users == 0 and self.saved is not None:
                    F.scaled_dot_product_attention, fastpath = self.saved
                    torch.backends.mha.set_fastpath_enabled(fastpath)


_explicit_kernel = _ExplicitKernel()


@contextmanager
def explicit_attention_kernels(model: nn.Module) -> Iterator[None]:
    """Within the block, every attention of ``model`` runs through :func:`explicit_attention`
    (see the module's description), whose operations, unlike the fused kernels, all have
    second derivatives; everything is put back afterwards, also after an error. The block
    holds the model's lock (:mod:`explain.concurrency`)."""
    with ExitStack() as context:
        context.enter_context(model_lock(model))
        context.enter_context(_explicit_kernel.installed())
        for module in model.modules():
            if getattr(module, "fused_attn", None) is False:  # timm: its explicit path forms no record
                module.fused_attn = True  # type: ignore[assignment]  # torch types Module attributes as tensors or modules
                context.callback(setattr, module, "fused_attn", False)
        config = getattr(model, "config", None)
        implementation = getattr(config, "_attn_implementation", None)
        if config is not None and implementation not in (None, "sdpa"):  # Hugging Face
            config._attn_implementation = "sdpa"
            context.callback(setattr, config, "_attn_implementation", implementation)
        yield


#: A relevance rule for attention: (query, key, value, attn_mask, is_causal, scale) -> the
#: attention's output, formed in operations whose gradients carry the rule.
AttentionRule = Callable[[Tensor, Tensor, Tensor, "Tensor | None", bool, "float | None"], Tensor]


@contextmanager
def ruled_attention(model: nn.Module, rule: AttentionRule) -> Iterator[None]:
    """Within the block, every attention of ``model`` called on this thread is computed by
    ``rule`` (with :func:`explicit_attention_kernels`, so that the fused kernels are not
    used); other threads' attention calls are computed as usual. Blocks do not nest on one
    thread, nor with an :class:`AttentionCapture`."""
    if getattr(_active, "rule", None) is not None or getattr(_active, "capture", None) is not None:
        raise RuntimeError("an attention rule or capture is already active on this thread; they do not nest")
    with explicit_attention_kernels(model):
        _active.rule = rule
        try:
            yield
        finally:
            _active.rule = None


def has_attention(model: nn.Module) -> bool:
    """Whether ``model`` holds attention layers: ``nn.MultiheadAttention``, or modules whose
    class name ends in ``Attention`` (timm's, Hugging Face's, torchvision's Swin's)."""
    return any(isinstance(m, nn.MultiheadAttention) or type(m).__name__.endswith("Attention") for m in model.modules())


class AttentionCapture:
    """Context manager that records the attention weights of every attention call.

    ``weights`` lists one (N, heads, T, T) tensor per call, in the order of the forward
    pass. With ``gradients``, a graph is recorded from the first attention on (also under
    ``torch.no_grad()``), so that ``torch.autograd.grad(score, capture.weights)`` gives
    each layer's attention gradient; nothing before the first attention is recorded.
    Without, the block runs under ``torch.no_grad()``.

    >>> import torchvision
    >>> model = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    >>> with AttentionCapture(model) as capture:
    ...     logits = model(torch.rand(1, 3, 32, 32))
    >>> [tuple(w.shape) for w in capture.weights]    # 1 class token + 4 x 4 patches
    [(1, 2, 17, 17), (1, 2, 17, 17)]
    """

    def __init__(self, model: nn.Module, *, gradients: bool = False):
        self.model = model
        self.gradients = gradients
        self.weights: list[Tensor] = []
        self._context: ExitStack | None = None

    def __enter__(self) -> AttentionCapture:
        if getattr(_active, "capture", None) is not None:
            raise RuntimeError("an AttentionCapture is already active on this thread; captures do not nest")
        with ExitStack() as context:
            if self.gradients:
                context.enter_context(torch.inference_mode(False))
                context.enter_context(torch.enable_grad())
            else:  # nothing to differentiate: no graph, and weights left unfrozen (see preserved_state)
                context.enter_context(torch.no_grad())
            context.enter_context(preserved_state(self.model, freeze=self.gradients))
            context.enter_context(explicit_attention_kernels(self.model))
            _active.capture = self
            context.callback(setattr, _active, "capture", None)
            self._context = context.pop_all()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.close()
