"""Transformer attention methods: maps from the attention matrices of a vision transformer.

Each method reads the attention weights A_l (N, heads, T, T) of every self-attention layer
through :class:`~explain.attention_capture.AttentionCapture`, turns them into a relevance per token,
and shows the patch tokens' relevance on the patch grid (:class:`~explain.TokenLayout`),
upsampled to the input and min-max scaled like every map of the library.

They need global self-attention over all tokens (ViT, DeiT, EVA-style models of timm,
torchvision and Hugging Face). Swin's windowed attention has no token that sees the whole
image, and a model whose attention does not run through ``F.scaled_dot_product_attention``
or ``nn.MultiheadAttention`` is not seen: both are refused with a ``ValueError`` that says
so (Grad-CAM works on both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attention_capture import AttentionCapture
from ..base import Explainer, NotApplicable, register
from ..checks import channel_hint, check_images, checked_number
from ..explanation import Explanation, scale_maps
from ..layers import transformer_blocks
from ..targets import Targets, class_logits, custom_target, select_targets
from ..tokens import TokenLayout, infer_layout
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

    def check_attention(self, weights: list[Tensor], images: Tensor) -> TokenLayout:
        """The token layout of the recorded attention; an error where the model's attention
        was not seen or is not global self-attention over a class token and the patches."""
        if not weights:
            raise NotApplicable(
                f"{self.name} saw no attention: the model computes none through F.scaled_dot_product_attention or "
                "nn.MultiheadAttention (torchvision's Swin computes its windowed attention by hand); use Grad-CAM, "
                "which works on any transformer"
            )
        n = images.shape[0]
        shapes = {tuple(w.shape) for w in weights}
        t = weights[0].shape[-1]
        if len(shapes) != 1 or weights[0].shape[0] != n or weights[0].shape[-2] != t:
            raise NotApplicable(
                f"{self.name} needs global self-attention over the same tokens in every layer, and this model's "
                f"attention matrices have shapes {sorted(shapes)[:3]} for {n} images (windowed attention, as in "
                "Swin, or cross-attention); use Grad-CAM"
            )
        layout = self.layout or infer_layout((n, t, 1), (images.shape[-2], images.shape[-1]), self.model)
        if layout.prefix < 1:
            raise NotApplicable(
                f"{self.name} reads the class token's attention, and this model's {t} tokens have none before the "
                "patches (an average-pooled transformer); use Grad-CAM, or pass layout= if token 0 is a class token"
            )
        return layout

    def relevance(self, weights: list[Tensor], gradients: list[Tensor] | None) -> Tensor:
        """(N, T) relevance of every token for the class token, from the attention weights
        (and, for gradient methods, their gradients for one target)."""
        raise NotImplementedError

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        images = check_images(images, self.model)
        self.check_applies(images)
        with AttentionCapture(self.model, gradients=self.uses_gradients) as capture:
            with channel_hint(images):
                output = self.model(images)
            scores, ids = select_targets(output, targets, topk=topk, class_names=self.class_names)
            layout = self.check_attention(capture.weights, images)
            weights = [w.detach().float() for w in capture.weights]
            columns = (scores if scores.dim() == 2 else scores[:, None]).unbind(dim=1)
            relevances = [
                self.relevance(weights, self.gradients(capture, output, column, ids, k))
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
    is R's class-token row over the patch tokens. It does not depend on the class: rollout
    shows what the class token attends to. ``discard_ratio`` zeroes that fraction of each
    layer's smallest fused attentions (never the class token's own) before adding I, as
    the widely used implementation by J. Gildenblat does; the paper has no such step
    (default 0).

    Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, section 3.
    """

    name = "attention-rollout"
    formula = (
        "the class token's row of prod_l (A_l + I)/2, A_l averaged over heads ({head_fusion:code}: mean, "
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

    def relevance(self, weights: list[Tensor], gradients: list[Tensor] | None) -> Tensor:
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
        return rollout[:, 0]


@register
class AttentionRelevance(TransformerAttention):
    """Gradient-weighted attention relevance: each layer's attention, weighted by its
    gradient for the class, accumulated over the layers with the residual connections.

    R starts as the identity; for every layer in the order of the forward pass,
    Ā_l = E_h[(∇A_l ⊙ A_l)^+] (the positive part of gradient times attention, averaged over
    heads) and R ← R + Ā_l R. The map is R's class-token row over the patch tokens. One
    forward pass and one backward pass per target, down to the first attention layer.

    Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal
    and Encoder-Decoder Transformers", ICCV 2021, eq. 5-6 (the self-attention rules).
    """

    name = "attention-relevance"
    formula = "R = I, R += E_h[(grad A_l * A_l)^+] R per layer; the class token's row"
    runs_on = "explain"
    cost = "1 forward + 1 backward to the first attention"
    uses_gradients = True

    def relevance(self, weights: list[Tensor], gradients: list[Tensor] | None) -> Tensor:
        n, _, t, _ = weights[0].shape
        relevance = torch.eye(t, device=weights[0].device).expand(n, t, t)
        assert gradients is not None  # (uses_gradients)
        for attention, gradient in zip(weights, gradients, strict=True):
            weighted = (gradient * attention).clamp_min(0).mean(dim=1)
            relevance = relevance + weighted @ relevance
        return relevance[:, 0]


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

    The readout is found for timm's ViTs (``forward_head(norm(z))``), torchvision's
    ``VisionTransformer`` and Hugging Face ViT/DeiT classifiers; for other models pass
    ``readout=`` (a function of the last block's tokens that returns the logits). It is
    checked on each call against the model's logits.

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
        self.start_layer = start_layer
        found = readout if readout is not None else find_readout(model)
        if found is None:
            raise NotApplicable(
                f"LeGrad reads every layer's tokens through the model's head, and {type(model).__name__} is none of "
                "the models whose head explain knows (timm, torchvision and Hugging Face ViTs); pass readout= (a "
                "function of the last block's tokens that returns the logits)"
            )
        self.readout: Callable[[Tensor], Tensor] = found
        self._blocks: list[nn.Module] | None = None
        self._tokens: list[Tensor] = []

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        images = check_images(images, self.model)
        self.check_applies(images)
        if self._blocks is None:
            self._blocks = [self.model.get_submodule(name) for name in transformer_blocks(self.model, images[:1])]
        self._tokens = []
        handles = [
            block.register_forward_hook(
                lambda module, args, output: self._tokens.append(output[0] if isinstance(output, tuple) else output)
            )
            for block in self._blocks
        ]
        try:
            return super()._explain(images, targets, topk=topk)
        finally:
            for handle in handles:
                handle.remove()
            self._tokens = []

    def gradients(self, capture: AttentionCapture, output, scores: Tensor, ids: Tensor, k: int) -> list[Tensor]:
        tokens = self._tokens
        if len(tokens) != len(capture.weights):
            raise ValueError(
                f"LeGrad pairs each block with its attention, and found {len(tokens)} blocks for "
                f"{len(capture.weights)} attention layers; pass readout= and check the model is a plain ViT"
            )
        layers = range(len(tokens))[self.start_layer :]
        if not layers:
            raise ValueError(f"start_layer={self.start_layer} leaves none of the {len(tokens)} layers")
        column = ids if ids.dim() == 1 else ids[:, k]
        if column.min() < 0:
            raise ValueError("LeGrad reads class logits at every layer; pass class targets, not a callable")
        logits = class_logits(output).detach()
        final = self.readout(tokens[-1])
        if (
            not isinstance(final, Tensor)
            or final.shape != logits.shape
            or not torch.allclose(
                final.detach().float(), logits.float(), rtol=1e-4, atol=1e-4 * float(logits.abs().max().clamp_min(1))
            )
        ):
            raise ValueError(
                "the readout applied to the last block's tokens does not give the model's logits; "
                "pass readout= (a function of the last block's tokens that returns the logits)"
            )
        rows = torch.arange(len(column), device=column.device)
        gradients = []
        for layer in layers:
            score = self.readout(tokens[layer]).float()[rows, column]
            (gradient,) = torch.autograd.grad(score.sum(), capture.weights[layer], retain_graph=True)
            gradients.append(gradient.float())
        return gradients

    def relevance(self, weights: list[Tensor], gradients: list[Tensor] | None) -> Tensor:
        assert gradients is not None  # (uses_gradients)
        per_layer = [g.clamp_min(0).mean(dim=(1, 2)) for g in gradients]  # (N, T) each
        return torch.stack(per_layer).mean(dim=0)


def find_readout(model: nn.Module) -> Callable[[Tensor], Tensor] | None:
    """The function from the last block's tokens to the logits, for the model families whose
    head is known; None otherwise (LeGrad then asks for ``readout=``)."""
    dynamic: Any = model  # the attributes of each family's own classes
    if hasattr(model, "forward_head") and isinstance(getattr(model, "norm", None), nn.Module):  # timm
        return lambda tokens: dynamic.forward_head(dynamic.norm(tokens))
    if (
        type(model).__name__ == "VisionTransformer" and hasattr(model, "heads") and hasattr(model, "encoder")
    ):  # torchvision
        return lambda tokens: dynamic.heads(dynamic.encoder.ln(tokens)[:, 0])
    base: Any = getattr(model, "base_model", None)
    if (
        hasattr(model, "classifier")
        and isinstance(getattr(base, "layernorm", None), nn.Module)
        and getattr(getattr(model, "config", None), "model_type", "") in ("vit", "deit")
    ):  # Hugging Face
        return lambda tokens: dynamic.classifier(base.layernorm(tokens)[:, 0])
    return None
