"""Transformer attention methods: maps from the attention matrices of a vision transformer.

Each method reads the attention weights A_l (N, heads, T, T) of every self-attention layer
through :class:`~explain.attention_capture.AttentionCapture`, turns them into a relevance per token,
and shows the patch tokens' relevance on the patch grid (:class:`~explain.TokenLayout`),
upsampled to the input and min-max scaled like every map of the library.

They need global self-attention over the same tokens in every layer (ViT, DeiT, EVA,
BEiT, DINOv2, SigLIP, CLIP, I-JEPA and the like, of timm, torchvision and Hugging Face),
with a class token or without one (the row of what the head reads,
:mod:`~explain.methods.attention_readout`), computed through
``F.scaled_dot_product_attention``, ``nn.MultiheadAttention`` or by hand. Swin's windowed
attention has no token that sees the whole image, and hierarchical models (PVT, CvT,
LeViT) attend over other tokens in each stage: both raise :class:`~explain.NotApplicable`
(Grad-CAM works on both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..attention_capture import AttentionCapture
from ..base import Explainer, NotApplicable, register
from ..blocks import token_blocks, trace_calls
from ..checks import channel_hint, check_images, checked_number
from ..explanation import Explanation, scale_maps
from ..targets import Targets, class_logits, custom_target, select_targets
from ..tokens import TokenLayout, infer_layout
from .attention_readout import find_readout, readout_row, replay_readout
from .cam_base import detached

__all__ = ["AttentionRelevance", "AttentionRollout", "LeGrad", "TransformerAttention"]

HEAD_FUSIONS = ("mean", "max", "min")


class TransformerAttention(Explainer):
    """Base class: one forward pass through :class:`~explain.attention_capture.AttentionCapture`
    (and the backward passes a method needs), then :meth:`relevance` per target.

    ``layout`` says where the patch tokens lie among the attention's T tokens (default:
    inferred from T, the input size and the model, see :func:`~explain.tokens.infer_layout`);
    the class token is token 0.
    """

    family: ClassVar[str] = "transformer attention"
    uses_gradients: ClassVar[bool] = False
    images_only: ClassVar[str] = "it reads a vision transformer's attention over the patches of an image"

    def __init__(
        self, model: nn.Module, *, class_names: Sequence[str] | None = None, layout: TokenLayout | None = None
    ):
        super().__init__(model, class_names=class_names)
        if layout is not None and (not isinstance(layout, TokenLayout) or layout.kind != "tokens"):
            raise ValueError("layout must be an explain.TokenLayout('tokens', prefix=P, grid=(h, w))")
        self.layout = layout

    def check_attention(self, capture: AttentionCapture, images: Tensor) -> TokenLayout:
        """The token layout of the recorded attention; :class:`~explain.NotApplicable` where the
        model's attention was not seen or is not global self-attention over the same tokens
        in every layer."""
        weights = capture.weights
        if not weights and capture.skipped:
            raise NotApplicable(
                f"{self.name} needs self-attention over the model's tokens, and its {capture.skipped} attention "
                "call(s) attend over other tokens than their input's (keys and values pooled or strided, as in CvT "
                "and PVT, or channels, as in XCiT); use Grad-CAM, which works on any transformer"
            )
        if not weights:
            raise NotApplicable(
                f"{self.name} saw no attention: the model has no attention module that computes softmax(Q K^T) over "
                "its tokens; use Grad-CAM, which works on any model"
            )
        if capture.several:
            raise NotApplicable(
                f"{self.name} needs one attention matrix per layer, and this model's attention modules form several "
                "in one call (differential attention subtracts two softmaxes), whose difference is no attention "
                "flow; use Grad-CAM"
            )
        n = images.shape[0]
        shapes = {tuple(w.shape) for w in weights}
        t = weights[0].shape[-1]
        if len(shapes) != 1 or weights[0].shape[0] != n or capture.skipped:
            other = f" and {capture.skipped} attention call(s) over other tokens" if capture.skipped else ""
            raise NotApplicable(
                f"{self.name} needs global self-attention over the same tokens in every layer, and this model's "
                f"attention matrices have shapes {sorted(shapes)[:3]} for {n} images{other} (windowed attention, "
                "as in Swin; stages over other tokens, as in PVT, CvT and LeViT; patches folded into the batch, as "
                "in MobileViT; attention over channels, as in XCiT); use Grad-CAM"
            )
        if self.layout is not None:
            return self.layout
        try:
            return infer_layout((n, t, 1), (images.shape[-2], images.shape[-1]), self.model)
        except ValueError:
            raise ValueError(
                f"{self.name} found no patch grid among the {t} tokens of the model's attention for a "
                f"{images.shape[-2]} x {images.shape[-1]} input; pass layout=explain.TokenLayout('tokens', prefix=P, "
                "grid=(h, w)) (P tokens before the patches, an h x w patch grid)"
            ) from None

    def relevance(self, weights: list[Tensor], gradients: list[Tensor] | None, row: Tensor) -> Tensor:
        """(N, T) relevance of every token for what the head reads (``row``, (N, T) weights
        of the last layer's tokens: the class token, or the pooled ones), from the attention
        weights (and, for gradient methods, their gradients for one target)."""
        raise NotImplementedError

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        images = check_images(images, self.model)
        self.check_applies(images)
        with AttentionCapture(self.model, gradients=self.uses_gradients) as capture:
            with channel_hint(images):
                output = self.model(images)
            scores, ids = select_targets(output, targets, topk=topk, class_names=self.class_names)
            layout = self.check_attention(capture, images)
            weights = [w.detach().float() for w in capture.weights]
            n, _, t, _ = weights[0].shape
            try:
                row = readout_row(self.model, layout, capture.pooling, n, t, weights[0].device)
            except ValueError as error:
                raise NotApplicable(f"{self.name}: {error}; use Grad-CAM") from None
            columns = (scores if scores.dim() == 2 else scores[:, None]).unbind(dim=1)
            relevances = [
                self.relevance(weights, self.gradients(capture, output, column, ids, k), row)
                for k, column in enumerate(columns)
            ]
        assert layout.grid is not None  # a token layout (check_attention)
        h, w = layout.grid
        raw = torch.stack([r[:, layout.prefix : layout.prefix + h * w].reshape(-1, h, w) for r in relevances], dim=1)
        raw = raw.squeeze(1) if ids.dim() == 1 else raw
        custom = custom_target(targets) is not None
        return Explanation(
            scale_maps(raw, (images.shape[-2], images.shape[-1])),
            {"attention": raw},
            detached(output if custom else class_logits(output)),
            ids,
            self.name,
            self.class_names,
        )

    def gradients(self, capture: AttentionCapture, output, scores: Tensor, ids: Tensor, k: int) -> list[Tensor] | None:
        """The gradients of ``scores`` (N,) with respect to every layer's attention, or None
        for methods that use none."""
        if not self.uses_gradients:
            return None
        return [g.float() for g in torch.autograd.grad(scores.sum(), capture.weights, retain_graph=True)]

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return ("attention",)


def fuse_heads(weights: Tensor, fusion: str) -> Tensor:
    """(N, heads, T, T) -> (N, T, T) by the mean, max or min over heads."""
    if fusion == "mean":
        return weights.mean(dim=1)
    return weights.amax(dim=1) if fusion == "max" else weights.amin(dim=1)


@register
class AttentionRollout(TransformerAttention):
    """Attention rollout: how much each patch token flows into the class token, through the
    attention of every layer and the residual connections.

    With A_l each layer's attention averaged over heads (``head_fusion``: ``"mean"``,
    ``"max"`` or ``"min"``), Â_l = (A_l + I) / 2 with rows renormalised to sum to 1 (the
    residual path carries half of each token), and the rollout R = Â_L ... Â_2 Â_1, the map
    is the row of what the head reads over the patch tokens: the class token's, or for a
    pooled head the mean of the pooled tokens' rows or an attention pool's weights times R
    (:mod:`~explain.methods.attention_readout`). It does not depend on the class: rollout
    shows what the head's token attends to. ``discard_ratio`` zeroes that fraction of each
    layer's smallest fused attentions (never the class token's own) before adding I, as
    the widely used implementation by J. Gildenblat does; the paper has no such step
    (default 0).

    Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, section 3.
    """

    name = "attention-rollout"
    formula = (
        "the row of what the head reads in prod_l (A_l + I)/2, A_l averaged over heads ({head_fusion:code}: mean, "
        "max or min; {discard_ratio:code}); not class-specific"
    )
    runs_on = "explain"
    cost = "1 forward"

    def __init__(
        self,
        model: nn.Module,
        *,
        head_fusion: str = "mean",
        discard_ratio: float = 0.0,
        class_names: Sequence[str] | None = None,
        layout: TokenLayout | None = None,
    ):
        super().__init__(model, class_names=class_names, layout=layout)
        if head_fusion not in HEAD_FUSIONS:
            raise ValueError(f"head_fusion must be one of {', '.join(HEAD_FUSIONS)}, got {head_fusion!r}")
        discard_ratio = checked_number("discard_ratio", discard_ratio, positive=False)
        if discard_ratio >= 1:
            raise ValueError(f"discard_ratio is a fraction of the attentions to drop, in [0, 1); got {discard_ratio}")
        self.head_fusion, self.discard_ratio = head_fusion, discard_ratio

    def relevance(self, weights: list[Tensor], gradients: list[Tensor] | None, row: Tensor) -> Tensor:
        n, _, t, _ = weights[0].shape
        eye = torch.eye(t, device=weights[0].device)
        rollout = eye.expand(n, t, t)
        for layer in weights:
            fused = fuse_heads(layer, self.head_fusion)
            if self.discard_ratio > 0:
                flat = fused.flatten(1)
                smallest = flat.topk(int(flat.shape[1] * self.discard_ratio), dim=1, largest=False).indices
                kept = torch.ones_like(flat, dtype=torch.bool).scatter_(1, smallest, False)
                kept[:, 0] = True  # the class token's attention to itself stays
                fused = (flat * kept).view(n, t, t)
            mixed = (fused + eye) / 2
            mixed = mixed / mixed.sum(dim=-1, keepdim=True)
            rollout = mixed @ rollout
        return (row[:, None] @ rollout)[:, 0]


@register
class AttentionRelevance(TransformerAttention):
    """Gradient-weighted attention relevance: each layer's attention, weighted by its
    gradient for the class, accumulated over the layers with the residual connections.

    R starts as the identity; for every layer in the order of the forward pass,
    Ā_l = E_h[(∇A_l ⊙ A_l)^+] (the positive part of gradient times attention, averaged over
    heads) and R ← R + Ā_l R. The map is the row of what the head reads (the class token's,
    or the mean of the pooled tokens' rows, see :mod:`~explain.methods.attention_readout`)
    over the patch tokens, without the identity's share where that is the same for every
    patch (it only shifts the map). One forward pass and one backward pass per target, down
    to the first attention layer.

    Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal
    and Encoder-Decoder Transformers", ICCV 2021, eq. 5-6 (the self-attention rules).
    """

    name = "attention-relevance"
    formula = "R = I, R += E_h[(grad A_l * A_l)^+] R per layer; the row of what the head reads"
    runs_on = "explain"
    cost = "1 forward + 1 backward to the first attention"
    uses_gradients = True

    def relevance(self, weights: list[Tensor], gradients: list[Tensor] | None, row: Tensor) -> Tensor:
        n, _, t, _ = weights[0].shape
        relevance = torch.eye(t, device=weights[0].device).expand(n, t, t)
        assert gradients is not None  # (uses_gradients)
        for attention, gradient in zip(weights, gradients, strict=True):
            weighted = (gradient * attention).clamp_min(0).mean(dim=1)
            relevance = relevance + weighted @ relevance
        # The identity's share of a row that weighs its tokens equally (a class token, or the
        # mean of pooled tokens) is the same for every patch: left out, so that small
        # gradient terms are not lost under it (it only shifts the map, which is min-max scaled).
        read = row > 0
        equal = ((row - row.amax(dim=1, keepdim=True)).abs() * read).amax(dim=1) == 0
        relevance = relevance - torch.eye(t, device=relevance.device) * equal[:, None, None]
        return (row[:, None] @ relevance)[:, 0]


@register
class LeGrad(TransformerAttention):
    """LeGrad: the sensitivity of each layer's prediction to that layer's attention.

    For every layer l, the block's output tokens z_l are read out as the model reads its
    last block's (final norm, pooling, head: ``readout``), giving the class score s_l; the
    layer's map is E_h,i[ReLU(∂s_l / ∂A_l)], the positive gradient with respect to the
    attention weights averaged over heads and query tokens, and the map is the mean over
    the layers from ``start_layer`` (default 0: all, as in the paper's formulation; the
    authors' code defaults to the last two). One forward pass, then one backward pass per
    layer and target, each from that layer's readout down to its attention.

    The readout is the model's own head where it is known (timm's ``forward_head(norm(z))``,
    torchvision's ``VisionTransformer``, Hugging Face's ViT and DeiT classifiers) and gives
    the model's logits on the last block's tokens; for any other model (BEiT, DINOv2, CLIP,
    SigLIP, DeiT with its teacher's head, ...) the model is replayed with its last block's
    output replaced by z_l (:func:`~explain.methods.attention_readout.replay_readout`: one
    more forward pass per layer). ``readout=`` (a function of the last block's tokens that
    returns the logits) replaces both; it is checked on each call against the model's logits.
    LeGrad needs no class token: the mean over query tokens is the same for any head.

    Bousselham, Boggust, Chaybouti, Strobelt & Kuehne, "LeGrad: An Explainability Method
    for Vision Transformers via Feature Formation Sensitivity", ICCV 2025, arXiv:2404.03214,
    eq. 5-7; https://github.com/WalBouss/LeGrad.
    """

    name = "legrad"
    formula = (
        "mean over layers of E_{{h,i}}[ReLU(d s_l / d A_l)], s_l the class score read out from layer l's "
        "tokens by the model's head"
    )
    runs_on = "explain"
    cost = "1 forward + 1 backward per layer to its attention"
    uses_gradients = True

    def __init__(
        self,
        model: nn.Module,
        *,
        start_layer: int = 0,
        readout: Callable[[Tensor], Tensor] | None = None,
        class_names: Sequence[str] | None = None,
        layout: TokenLayout | None = None,
    ):
        super().__init__(model, class_names=class_names, layout=layout)
        if isinstance(start_layer, bool) or not isinstance(start_layer, int):
            raise ValueError(f"start_layer must be an int (negative counts from the last layer), got {start_layer!r}")
        if readout is not None and not callable(readout):
            raise TypeError(f"readout must be a function of the last block's tokens, got {type(readout).__name__}")
        self.start_layer = start_layer
        self.readout = readout
        self._blocks: list[tuple[nn.Module, int]] | None = None
        self._tokens: list[Tensor] = []
        self._images: Tensor | None = None
        self._replaying = False

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        images = check_images(images, self.model)
        self.check_applies(images)
        if self._blocks is None:
            example = images[:1]
            calls = token_blocks(trace_calls(self.model, example), example)
            self._blocks = [(self.model.get_submodule(call.name), call.output) for call in calls]
        self._tokens, self._images = [], images

        def keep(index: int):
            def hook(module: nn.Module, args, output) -> None:
                if self._replaying:
                    return
                tensors = [
                    t for t in (output if isinstance(output, (tuple, list)) else (output,)) if isinstance(t, Tensor)
                ]
                self._tokens.append(tensors[index])

            return hook

        handles = [block.register_forward_hook(keep(index)) for block, index in self._blocks]
        try:
            return super()._explain(images, targets, topk=topk)
        finally:
            for handle in handles:
                handle.remove()
            self._tokens, self._images = [], None

    def gradients(self, capture: AttentionCapture, output, scores: Tensor, ids: Tensor, k: int) -> list[Tensor]:
        tokens = list(self._tokens)
        if len(tokens) != len(capture.weights):
            raise NotApplicable(
                f"LeGrad pairs each block with its attention, and found {len(tokens)} transformer blocks for "
                f"{len(capture.weights)} self-attention layers; use Grad-CAM or attention rollout"
            )
        layers = range(len(tokens))[self.start_layer :]
        if not layers:
            raise ValueError(f"start_layer={self.start_layer} leaves none of the {len(tokens)} layers")
        column = ids if ids.dim() == 1 else ids[:, k]
        if column.min() < 0:
            raise ValueError("LeGrad reads class logits at every layer; pass class targets, not a callable")
        readout = self._readout(capture, tokens[-1], class_logits(output).detach())
        rows = torch.arange(len(column), device=column.device)
        gradients = []
        for layer in layers:
            with capture.paused():
                score = readout(tokens[layer]).float()[rows, column]
            (gradient,) = torch.autograd.grad(score.sum(), capture.weights[layer], retain_graph=True)
            gradients.append(gradient.float())
        return gradients

    def _readout(self, capture: AttentionCapture, last: Tensor, logits: Tensor) -> Callable[[Tensor], Tensor]:
        """The readout: ``readout=``, else the model's known head where it gives the model's
        logits on the last block's tokens, else a replay of the model after its last block."""
        candidates = [self.readout] if self.readout is not None else [find_readout(self.model)]
        for readout in candidates:
            if readout is None:
                continue
            try:
                with capture.paused():
                    final = readout(last)
            except Exception:  # a known head that does not take these tokens: replay instead
                if self.readout is not None:
                    raise
                final = None
            if (
                isinstance(final, Tensor)
                and final.shape == logits.shape
                and torch.allclose(
                    final.detach().float(),
                    logits.float(),
                    rtol=1e-4,
                    atol=1e-4 * float(logits.abs().max().clamp_min(1)),
                )
            ):
                return readout
            if self.readout is not None:
                raise ValueError(
                    "the readout applied to the last block's tokens does not give the model's logits; "
                    "pass readout= (a function of the last block's tokens that returns the logits)"
                )
        assert self._blocks and self._images is not None  # set by __call__
        block, index = self._blocks[-1]
        replay = replay_readout(self.model, block, self._images, index)

        def replayed(tokens: Tensor) -> Tensor:
            self._replaying = True
            try:
                return replay(tokens)
            finally:
                self._replaying = False

        return replayed

    def relevance(self, weights: list[Tensor], gradients: list[Tensor] | None, row: Tensor) -> Tensor:
        assert gradients is not None  # (uses_gradients)
        per_layer = [g.clamp_min(0).mean(dim=(1, 2)) for g in gradients]  # (N, T) each
        return torch.stack(per_layer).mean(dim=0)
