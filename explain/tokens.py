"""Token layers as spatial maps: the layouts of vision transformers' layer outputs.

A CAM works on a layer output of shape (N, C, h, w). Vision transformers keep theirs as
tokens, (N, T, C): a few *prefix* tokens (class, distillation, register tokens) followed by
one token per patch in raster order; Swin keeps a channels-last grid, (N, h, w, C).
:class:`TokenLayout` says where a layer's patch grid lies in its output, and moves values
both ways: to the (N, C, h, w) grid the CAMs use, and back into the layer's own layout (for
methods that replay a changed activation through the rest of the model).

:func:`infer_layout` finds the layout from the output's shape, the input's size and what
the model says about itself (timm's ``num_prefix_tokens`` and ``patch_embed.patch_size``,
torchvision's ``VisionTransformer.patch_size`` and class token, a Hugging Face config's
``patch_size``); where that is not enough it raises, naming the ``reshape=`` argument.

>>> layout = TokenLayout("tokens", prefix=1, grid=(2, 3))
>>> tokens = torch.arange(7.0).view(1, 7, 1)        # [class, p00, p01, p02, p10, p11, p12]
>>> layout.to_spatial(tokens)[0, 0]
tensor([[1., 2., 3.],
        [4., 5., 6.]])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["Reshape", "ReshapeFunction", "TokenLayout", "infer_layout", "model_token_hints", "on_input_grid"]

KINDS = ("spatial", "tokens", "channels-last")
#: At most this many prefix tokens are tried when the model does not say how many it has
#: (class + distillation + 4 registers = 6; some models have 8 registers).
MAX_PREFIX = 10


@dataclass(frozen=True)
class TokenLayout:
    """Where a layer's patch grid lies in its output.

    ``kind`` is ``"spatial"`` for (N, C, h, w), ``"channels-last"`` for (N, h, w, C), or
    ``"tokens"`` for (N, T, C) whose tokens ``prefix .. prefix + h*w`` are the patches of
    the ``grid`` (h, w) in raster order; the tokens before them (class, distillation,
    registers) and any after them are not on the grid.
    """

    kind: str = "tokens"
    prefix: int = 0
    grid: tuple[int, int] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "tokens" and (self.grid is None or len(self.grid) != 2 or min(self.grid) < 1):
            raise ValueError(f"a token layout needs grid=(h, w), the patch grid's rows and columns; got {self.grid!r}")
        if isinstance(self.prefix, bool) or not isinstance(self.prefix, int) or self.prefix < 0:
            raise ValueError(
                f"prefix must be the number of tokens before the patches (an int >= 0), got {self.prefix!r}"
            )

    def to_spatial(self, output: Tensor) -> Tensor:
        """The layer output as an (N, C, h, w) grid (a view where the layout allows)."""
        if self.kind == "spatial":
            return output
        if self.kind == "channels-last":
            return output.permute(0, 3, 1, 2)
        assert self.grid is not None  # __post_init__ requires one for tokens
        h, w = self.grid
        if output.dim() != 3 or output.shape[1] < self.prefix + h * w:
            raise ValueError(
                f"tokens of shape {tuple(output.shape)} do not hold {self.prefix} prefix tokens and a "
                f"{h} x {w} patch grid"
            )
        patches = output[:, self.prefix : self.prefix + h * w]
        return patches.transpose(1, 2).reshape(output.shape[0], output.shape[2], h, w)

    def to_layer(self, spatial: Tensor, like: Tensor) -> Tensor:
        """``spatial`` (B, C, h, w) back in the layer's layout; tokens off the grid are taken
        from ``like`` (the layer's output for the same B images)."""
        if self.kind == "spatial":
            return spatial
        if self.kind == "channels-last":
            return spatial.permute(0, 2, 3, 1)
        assert self.grid is not None  # __post_init__ requires one for tokens
        h, w = self.grid
        out = like.clone()
        out[:, self.prefix : self.prefix + h * w] = spatial.flatten(2).transpose(1, 2)
        return out


@dataclass(frozen=True)
class ReshapeFunction:
    """A layout given as a function from the layer's output to its (N, C, h, w) grid; it
    has no inverse."""

    function: Callable[[Tensor], Tensor]

    def to_spatial(self, output: Tensor) -> Tensor:
        return self.function(output)

    def to_layer(self, spatial: Tensor, like: Tensor) -> Tensor:
        raise ValueError(
            "a reshape function cannot put a changed activation back into the layer's layout, which "
            "this method needs; pass reshape=explain.TokenLayout(kind, prefix=P, grid=(h, w)) instead"
        )


#: A layout, or a function from the layer's output to its (N, C, h, w) grid (it has no
#: inverse, so methods that replay a changed activation refuse it).
Reshape = TokenLayout | Callable[[Tensor], Tensor]


def _pair(value) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value, value
    try:
        a, b = (int(v) for v in value)
    except (TypeError, ValueError):
        return None
    return a, b


def model_token_hints(model: nn.Module) -> tuple[int | None, tuple[int, int] | None]:
    """What the model says about its tokens: (prefix tokens, patch size), each None when
    it does not say.

    Read from timm (``num_prefix_tokens``, ``patch_embed.patch_size``), torchvision's
    ``VisionTransformer`` (``patch_size``, one class token) and Hugging Face models (a
    ``config`` with ``patch_size``; one class token for ViT, two for DeiT's distilled
    models, and the config's ``num_register_tokens`` after them), looking at the model and
    its direct children (wrappers).

    >>> import torchvision
    >>> model_token_hints(torchvision.models.VisionTransformer(32, 8, 1, 2, 16, 32))
    (1, (8, 8))
    """
    for candidate in (model, *model.children()):
        prefix = getattr(candidate, "num_prefix_tokens", None)
        embed = getattr(candidate, "patch_embed", None)
        if prefix is not None and embed is not None:  # timm
            return int(prefix), _pair(getattr(embed, "patch_size", None))
        if type(candidate).__name__ == "VisionTransformer" and hasattr(candidate, "class_token"):  # torchvision
            return 1, _pair(getattr(candidate, "patch_size", None))
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "patch_size"):  # Hugging Face
        names = {name for name, _ in model.named_parameters()}
        prefix = None
        if any(name.endswith("embeddings.cls_token") for name in names):
            prefix = 1 + any(name.endswith("embeddings.distillation_token") for name in names)
            prefix += int(getattr(config, "num_register_tokens", 0) or 0)
        elif getattr(config, "model_type", "") in ("swin", "swinv2", "convnext", "convnextv2"):
            prefix = 0
        return prefix, _pair(config.patch_size)
    return None, None


def _aspect_fits(h: int, w: int, height: int, width: int) -> bool:
    """Whether an h x w grid is what a patch size p makes of a height x width input: p
    pixels per token on both sides, rounded down (a patch embedding) or up (padded
    convolutions)."""
    return any(
        (height // p, width // p) == (h, w) or (-(-height // p), -(-width // p)) == (h, w)
        for p in range(1, max(height, width) + 1)
    )


def _grids(count: int, height: int, width: int) -> list[tuple[int, int]]:
    """The h x w grids of ``count`` cells (more than one) that fit a height x width input."""
    return [
        (h, count // h)
        for h in range(1, count + 1)
        if count % h == 0 and count > 1 and _aspect_fits(h, count // h, height, width)
    ]


def infer_layout(
    shape: tuple[int, ...], input_size: tuple[int, ...], model: nn.Module | None = None, layer: str = ""
) -> TokenLayout:
    """The layout of a layer output of ``shape`` for inputs of ``input_size`` (H, W).

    For volumes (D, H, W) and signals (L,) the output must be spatial, (N, C, d, h, w) or
    (N, C, l): tokens and channels-last layouts are the vision transformers' of images.

    (N, h, w, C) with (h, w) on the input's grid (and not (C, h) read as a grid) is
    channels-last; any other 4-D output is (N, C, h, w). (N, T, C) tokens are a patch grid
    after some prefix tokens: with the model's patch size p, the grid is (H // p, W // p)
    and the prefix T - h*w (up to 10, whatever the model's own count: a trunk may run before
    the class token joins); otherwise the model's prefix count (or the fewest, up to 10,
    that leave a grid of the input's aspect ratio) fixes it. A ``ValueError`` names ``reshape=`` where no layout fits.

    >>> infer_layout((2, 197, 768), (224, 224))
    TokenLayout(kind='tokens', prefix=1, grid=(14, 14))
    >>> infer_layout((2, 7, 7, 768), (224, 224))
    TokenLayout(kind='channels-last', prefix=0, grid=None)
    """
    where = f"layer {layer!r}" if layer else "the layer"
    if len(input_size) != 2:
        return _spatial_layout(shape, input_size, where)
    height, width = input_size
    fix = (
        "pass reshape=explain.TokenLayout('tokens', prefix=P, grid=(h, w)) (P tokens before the patches, an "
        "h x w patch grid), or a function from the layer's output to (N, C, h, w)"
    )
    single = ValueError(
        f"{where} outputs shape {tuple(shape)}; a CAM needs an (N, C, h, w) output with more than "
        "one location, or a transformer's (N, tokens, C): pick an earlier convolutional layer"
    )
    if len(shape) not in (3, 4):
        raise single
    if len(shape) == 4:
        example = _example(height, width)
        if not on_input_grid(shape, example) and on_input_grid((shape[0], shape[3], shape[1], shape[2]), example):
            return TokenLayout("channels-last")
        if shape[-1] * shape[-2] < 2:
            raise single
        return TokenLayout("spatial")
    tokens = shape[1]
    prefix, patch = model_token_hints(model) if model is not None else (None, None)
    if patch is not None:
        # The patch grid the model's patch size makes of the input fixes the prefix, also where
        # it differs from the model's count: CaiT's and XCiT's trunks run before their class
        # token joins (none), and register tokens come on top of a class token.
        grid = (height // patch[0], width // patch[1])
        rest = tokens - grid[0] * grid[1]
        if 0 <= rest <= MAX_PREFIX:
            return TokenLayout("tokens", rest, grid)
    for count in [prefix] if prefix is not None else range(MAX_PREFIX + 1):
        if count >= tokens:
            continue
        grids = _grids(tokens - count, height, width)
        if grids:
            # Of the grids that fit, the one whose aspect ratio is nearest the input's.
            best = min(grids, key=lambda g: abs(math.log(g[0] / g[1] * width / height)))
            return TokenLayout("tokens", count, best)
    raise ValueError(
        f"{where} outputs {tuple(shape)} tokens whose patch grid could not be found for a {height} x "
        f"{width} input. Where they have no place in the image (a Perceiver's latents, a Q-Former's "
        "queries), pass target_layer= a layer whose output is on the image's grid (`explain layers MODEL` "
        f"lists the layers); where they are patches, {fix}"
    )


def _spatial_layout(shape: tuple[int, ...], input_size: tuple[int, ...], where: str) -> TokenLayout:
    """The layout of a volume's or a signal's layer: spatial, with more than one location."""
    spatial = len(input_size)
    if len(shape) != spatial + 2 or math.prod(shape[2:]) < 2:
        kind = "(N, C, d, h, w)" if spatial == 3 else "(N, C, l)"
        raise ValueError(
            f"{where} outputs shape {tuple(shape)}; a CAM of {'volumes' if spatial == 3 else 'signals'} needs a "
            f"{kind} output with more than one location: pick an earlier convolutional layer"
        )
    return TokenLayout("spatial")


def on_input_grid(shape: tuple[int, ...] | None, example: Tensor) -> bool:
    """Whether ``shape`` is (N, C, h, w) with (h, w) a downscaled grid of ``example``'s pixels
    (for volumes and signals: (N, C, d, h, w) or (N, C, l), no side larger than the input's,
    more than one location)."""
    if shape is None:
        return False
    if example.dim() != 4:
        sides = shape[2:]
        return (
            len(shape) == example.dim()
            and math.prod(sides) > 1
            and all(side <= whole for side, whole in zip(sides, example.shape[2:], strict=True))
        )
    if len(shape) != 4:
        return False
    height, width = example.shape[-2:]
    h, w = shape[-2:]
    if max(h, w) < 2 or h > height or w > width:
        return False
    # Strided layers round each side, which on a small grid can move the aspect ratio far
    # (48 x 256 -> 2 x 8 in a ResNet), so one cell of slack is allowed too.
    return (
        abs(h / w - height / width) <= 0.25 * height / width
        or abs(h - w * height / width) <= 1
        or abs(w - h * width / height) <= 1
    )


def _example(height: int, width: int) -> Tensor:
    return torch.empty(1, 1, height, width, device="meta")
