"""Which tokens a vision transformer's head reads, for the transformer attention methods.

Attention rollout and attention relevance (``explain.methods.transformer_attention``)
turn the attention of every layer into a matrix R whose row i says how much each input
token contributes to the last layer's token i. The map is the row of what the head reads:

- a class-token head (ViT, DeiT, CLIP's image encoder, DINOv2): the class token's row,
  ``R[0]`` (Abnar & Zuidema 2020; Chefer et al. 2021); DeiT's distilled head reads the
  class and the distillation token: the mean of their rows;
- an average-pooled head (timm's ``global_pool='avg'``, BEiT's and Data2Vec's mean
  pooling, SigLIP, I-JEPA and CLIP classifiers): the pooled output is the mean of the tokens
  it averages, and R is linear in the last layer's tokens, so its row is the mean of their
  rows, ``(1/|P|) sum_{i in P} R[i]``;
- an attention-pooled head (timm's ``global_pool='map'``, SigLIP's multihead attention
  pooling): the pool's latent query mixes the tokens by its attention weights a, so its row
  is ``a R`` (a averaged over the heads and latent queries; over the patch tokens alone
  where the pool leaves the register tokens out), as if the query were one more class token
  attending once more.

LeGrad reads every layer's tokens through the head instead (:func:`find_readout`): the
model's own final norm, pooling and classifier where they are known (timm's
``forward_head``, torchvision's ViT, Hugging Face's ViT and DeiT), and for any other model
a replay of the model with its last block's output replaced by the given tokens, which
computes exactly what the model does after that block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..targets import class_logits
from ..tokens import TokenLayout

__all__ = ["find_readout", "pooled_tokens", "readout_row", "replay_readout"]

#: Hugging Face classifiers that average all their tokens (no class token), and those that
#: average the patch tokens after a class token.
_HF_MEAN_ALL = ("ijepa", "siglip", "siglip2")
_HF_MEAN_PATCHES = ("clip", "metaclip_2")


def pooled_tokens(model: nn.Module) -> str | None:
    """What the model's head reads, where the model says: ``"class"`` (the class token),
    ``"patches"`` (the mean of the tokens after the prefix), ``"all"`` (the mean of every
    token); None where it does not say.

    >>> import timm
    >>> pooled_tokens(timm.create_model("vit_tiny_patch16_224", global_pool="avg", img_size=32))
    'patches'
    """
    pool = getattr(model, "global_pool", None)
    if isinstance(pool, str):  # timm
        if pool == "token":
            return "class"
        if pool in ("avg", "max", "avgmax"):
            return "all" if getattr(model, "pool_include_prefix", False) else "patches"
        return None
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", "")
    if config is None or not type(model).__name__.endswith("ForImageClassification"):
        return None
    if getattr(config, "use_mean_pooling", False):
        return "patches"
    if model_type in _HF_MEAN_ALL:
        return "all"
    return "patches" if model_type in _HF_MEAN_PATCHES else None


def readout_row(
    model: nn.Module, layout: TokenLayout, pooling: list[Tensor], n: int, t: int, device: torch.device
) -> Tensor:
    """(N, T) weights of the last layer's tokens in what the head reads (see the module's
    description); ``pooling`` holds the attention of an attention-pooled head, if recorded.
    ``ValueError`` where that attention is not over the T tokens of the layers."""
    if pooling:
        last = pooling[-1]
        if last.shape[0] == n and last.shape[-1] == t - layout.prefix:  # the pool reads the patches alone
            weights = last.detach().float().mean(dim=(1, 2)).to(device)
            row = torch.zeros(n, t, device=device)
            row[:, layout.prefix :] = weights / weights.sum(dim=1, keepdim=True)
            return row
        if last.shape[0] != n or last.shape[-1] != t:
            raise ValueError(
                f"the model's last attention has {last.shape[-2]} queries over {last.shape[-1]} tokens, not over the "
                f"{t} tokens of its self-attention layers (class attention over the class token and the patches, as "
                "in CaiT); the rollout of its layers does not reach its output"
            )
        weights = last.detach().float().mean(dim=(1, 2)).to(device)
        return weights / weights.sum(dim=1, keepdim=True)
    row = torch.zeros(n, t, device=device)
    reads = pooled_tokens(model) or ("class" if layout.prefix >= 1 else "all")
    if reads == "class":
        classes = 2 if _distilled(model, layout) else 1
        row[:, :classes] = 1 / classes
    elif reads == "patches":
        assert layout.grid is not None  # a token layout
        count = layout.grid[0] * layout.grid[1]
        row[:, layout.prefix : layout.prefix + count] = 1 / count
    else:
        row[:] = 1 / t
    return row


def _distilled(model: nn.Module, layout: TokenLayout) -> bool:
    """Whether the head reads a distillation token beside the class token (DeiT's)."""
    if layout.prefix < 2:
        return False
    names = (name for name, _ in model.named_parameters())
    return any(name.endswith(("dist_token", "distillation_token")) for name in names)


def find_readout(model: nn.Module) -> Callable[[Tensor], Tensor] | None:
    """The function from the last block's tokens to the logits, for the model families whose
    head is known; None otherwise (LeGrad then replays the model, see :func:`replay_readout`)."""
    dynamic: Any = model  # the attributes of each family's own classes
    if hasattr(model, "forward_head") and isinstance(getattr(model, "norm", None), nn.Module):  # timm
        return lambda tokens: dynamic.forward_head(dynamic.norm(tokens))
    if (
        type(model).__name__ == "VisionTransformer" and hasattr(model, "heads") and hasattr(model, "encoder")
    ):  # torchvision
        return lambda tokens: dynamic.heads(dynamic.encoder.ln(tokens)[:, 0])
    base: Any = getattr(model, "base_model", None)
    if (
        type(model).__name__ in ("ViTForImageClassification", "DeiTForImageClassification")
        and isinstance(getattr(base, "layernorm", None), nn.Module)
        and hasattr(model, "classifier")
    ):  # Hugging Face
        return lambda tokens: dynamic.classifier(base.layernorm(tokens)[:, 0])
    return None


def replay_readout(model: nn.Module, block: nn.Module, images: Tensor, output: int = 0) -> Callable[[Tensor], Tensor]:
    """The logits of ``model`` on ``images`` with ``block``'s output (its ``output``-th tensor,
    where it returns several) replaced by the given tokens: what the model computes after
    that block, whatever its head (one forward pass per call; nothing before the block
    depends on the tokens, so the graph starts there)."""

    def readout(tokens: Tensor) -> Tensor:
        def replace(module: nn.Module, args, result):
            if isinstance(result, Tensor):
                return tokens
            items = list(result)
            position = [i for i, item in enumerate(items) if isinstance(item, Tensor)][output]
            items[position] = tokens
            return type(result)(items) if not hasattr(result, "_fields") else type(result)(*items)

        handle = block.register_forward_hook(replace)
        try:
            return class_logits(model(images))
        finally:
            handle.remove()

    return readout
