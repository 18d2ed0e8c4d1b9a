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
import re
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
    _active.explicit = True
    try:
        weights = attention_weights(query, _grouped(query, key, enable_gqa), attn_mask, is_causal, scale)
    finally:
        _active.explicit = False
    capture = getattr(_active, "capture", None)
    if capture is not None:
        weights = capture.record(weights)
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
                self.saved = (
                    F.scaled_dot_product_attention,
                    torch.backends.mha.get_fastpath_enabled(),
                    F.softmax,
                    torch.softmax,
                )
                F.scaled_dot_product_attention = explicit_attention
                torch.backends.mha.set_fastpath_enabled(False)
                F.softmax = _recorded_softmax(F.softmax)
                torch.softmax = _recorded_softmax(torch.softmax)
                torch.Tensor.softmax = _recorded_softmax(torch._C.TensorBase.softmax)  # type: ignore[method-assign]
            self.users += 1
        try:
            yield
        finally:
            with process_lock:
                self.users -= 1
                if self.users == 0 and self.saved is not None:
                    F.scaled_dot_product_attention, fastpath, F.softmax, torch.softmax = self.saved
                    torch.backends.mha.set_fastpath_enabled(fastpath)
                    del torch.Tensor.softmax  # TensorBase's own again


_explicit_kernel = _ExplicitKernel()


def _recorded_softmax(softmax):
    """``softmax`` (``F.softmax``, ``torch.softmax`` or ``Tensor.softmax``) that also records
    its result in the active capture of this thread where it runs inside an attention module
    over the last axis of a 4-D tensor: the attention weights of models that compute their
    attention by hand (Hugging Face's CvT, LeViT, Hiera, MobileViT, Swin; timm modules without
    a fused path)."""

    def recorded(input, *args, **kwargs):
        if getattr(_active, "softmax", False):  # F.softmax calls Tensor.softmax: record the outer call once
            return softmax(input, *args, **kwargs)
        _active.softmax = True
        try:
            output = softmax(input, *args, **kwargs)
        finally:
            _active.softmax = False
        capture = getattr(_active, "capture", None)
        if capture is None or not capture.inside or getattr(_active, "explicit", False) or output.dim() != 4:
            return output
        dim = kwargs.get("dim", args[0] if args else None)
        if dim not in (-1, 3):
            return output
        return capture.record(output)

    return recorded


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


#: Type names of attention modules: ``*Attention*`` (timm, Hugging Face, torchvision), timm's
#: ``ClassAttn`` (CaiT, XCiT) and ``XCA`` (XCiT's attention over channels).
_ATTENTION_NAMES = re.compile(r"Attention|Attn|^XCA$")


def _is_attention_module(module: nn.Module) -> bool:
    return isinstance(module, nn.MultiheadAttention) or bool(_ATTENTION_NAMES.search(type(module).__name__))


def _token_count(module: nn.Module, args: tuple, kwargs: dict) -> int | None:
    """The number of tokens an attention module attends over: the keys of
    ``nn.MultiheadAttention``, else its first tensor (``hidden_states`` where it is passed
    by name), (N, T, C)."""
    if isinstance(module, nn.MultiheadAttention):
        key = args[1] if len(args) > 1 else kwargs.get("key")
        if not isinstance(key, Tensor) or key.dim() != 3:
            return None
        return key.shape[1] if module.batch_first else key.shape[0]
    first = next((a for a in args if isinstance(a, Tensor)), kwargs.get("hidden_states"))
    return first.shape[-2] if isinstance(first, Tensor) and first.dim() == 3 else None


class AttentionCapture:
    """Context manager that records the attention weights of every attention call.

    ``weights`` lists one (N, heads, T, T) tensor per self-attention call, in the order of
    the forward pass: the attention run through ``F.scaled_dot_product_attention`` or
    ``nn.MultiheadAttention`` (see the module's description), and the softmax over the last
    axis of a 4-D tensor computed by hand inside an attention module (a class named
    ``*Attention*``, ``*Attn*`` or ``XCA``: Hugging Face's eager attention, CvT, LeViT,
    Hiera, MobileViT; timm modules without a fused path). Where the
    attention module's input has T tokens, only a T x T attention is a self-attention over
    them; ``pooling`` lists the calls with fewer queries than those T keys (an attention-pool
    head's latent query, a class-attention layer's class token) and ``skipped`` counts the
    others (attention over channels as in XCiT, over strided keys as in CvT and PVT).

    With ``gradients``, a graph is recorded from the first attention on (also under
    ``torch.no_grad()``), so that ``torch.autograd.grad(score, capture.weights)`` gives
    each layer's attention gradient; nothing before the first attention is recorded.
    Without, the block runs under ``torch.no_grad()``. The hooks that follow the attention
    modules are removed on leaving the block, also after an error.

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
        self.pooling: list[Tensor] = []
        self.skipped = 0
        self._paused = False
        #: Whether an attention module formed several attention maps in one call
        #: (differential attention subtracts two softmaxes).
        self.several = False
        self._tokens: list[int | None] = []
        self._counts: list[int] = []
        self._context: ExitStack | None = None

    @property
    def inside(self) -> bool:
        """Whether an attention module of the model is running."""
        return bool(self._tokens)

    def record(self, weights: Tensor) -> Tensor:
        """Keep ``weights`` (N, heads, queries, keys) as what it is (see the class), and
        return the tensor the model goes on with: with ``gradients``, the first attention
        starts the graph, as the first captured layer does in LayerCapture (nothing before
        it is recorded, and backward stops there)."""
        if self._paused:
            return weights
        if self.gradients and not weights.requires_grad:
            weights = weights.detach().requires_grad_()
        tokens = self._tokens[-1] if self._tokens else None
        if self._tokens:
            self._counts[-1] += 1
            self.several |= self._counts[-1] > 1
        queries, keys = weights.shape[-2:]
        if tokens is not None and keys != tokens:
            self.skipped += 1
        elif queries == keys:
            self.weights.append(weights)
        elif queries < keys:
            self.pooling.append(weights)
        else:
            self.skipped += 1
        return weights

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Within the block, attention calls are not recorded (a method's own extra passes)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def _follow(self, context: ExitStack) -> None:
        """Hooks that keep the token count of the running attention modules' inputs."""

        def enter(module: nn.Module, args, kwargs) -> None:
            self._tokens.append(_token_count(module, args, kwargs))
            self._counts.append(0)

        def leave(module: nn.Module, args, kwargs, output) -> None:
            self._tokens.pop()
            self._counts.pop()

        for module in self.model.modules():
            if _is_attention_module(module):
                context.callback(module.register_forward_pre_hook(enter, with_kwargs=True).remove)
                context.callback(module.register_forward_hook(leave, with_kwargs=True, always_call=True).remove)

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
            self._follow(context)
            _active.capture = self
            context.callback(setattr, _active, "capture", None)
            self._context = context.pop_all()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.close()
