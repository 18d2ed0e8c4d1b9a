"""Finding target layers: by module, by dotted name, or automatically (for a CNN, a vision
transformer, or the backbone of a segmentation or detection model)."""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from .blocks import Call, block_layer, is_norm, residual_token_calls, token_blocks, trace_calls
from .detectors import backbone_roots
from .hooks import WRAPPER_PREFIXES, unwrapped
from .model_tasks import task_of
from .tokens import on_input_grid

__all__ = [
    "LayerInfo",
    "LayerSpec",
    "backbone_layer",
    "candidate_layers",
    "find_target_layer",
    "module_calls",
    "resolve_layers",
    "transformer_blocks",
]

LayerSpec = str | nn.Module | Sequence[str | nn.Module] | None

# Modules that pool or resample rather than compute features; a CAM on their output adds nothing.
_POOLING = (
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.Upsample,
)

#: Backbone parts that serve the detection head rather than compute the image's features:
#: feature pyramids and SSD's extra layers.
_HEAD_PARTS = ("fpn", "extra")


@dataclass(frozen=True)
class LayerInfo:
    """A module that produced a spatial (N, C, H, W) output in a forward pass."""

    name: str
    module_type: str
    shape: tuple[int, ...]


def resolve_layers(model: nn.Module, spec: LayerSpec) -> dict[str, nn.Module]:
    """Turn a layer spec (module, dotted name, or a list of them) into ``{name: module}``.

    Names are those of the model inside a ``DataParallel``, ``DistributedDataParallel`` or
    ``torch.compile`` wrapper (:func:`~explain.hooks.unwrapped`); a name with the wrapper's
    prefix (``module.layer4``) is found too.

    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    >>> list(resolve_layers(model, ["0", model[1]]))
    ['0', '1']
    """
    model = unwrapped(model)
    if isinstance(spec, (str, nn.Module)):
        specs = [spec]
    elif isinstance(spec, Sequence):
        specs = list(spec)
    else:
        raise TypeError(f"target_layer is a module, a dotted name or a list of them, not {type(spec).__name__}")
    if not specs:
        raise ValueError("target_layer is an empty list; pass a layer name, a module, or None for automatic")
    names = {module: name for name, module in model.named_modules()}
    layers: dict[str, nn.Module] = {}
    for item in specs:
        if isinstance(item, nn.Module):
            if item not in names:
                raise ValueError(f"the {type(item).__name__} given as target_layer is not a submodule of the model")
            layers[names[item] or "<model>"] = item
        elif isinstance(item, str):
            layers[item] = _get_submodule(model, item, list(names.values()))
        else:
            raise TypeError(f"a target layer is a module or a dotted name, not {type(item).__name__}")
    return layers


def _get_submodule(model: nn.Module, name: str, all_names: list[str]) -> nn.Module:
    for candidate in (name, *(name[len(p) :] for p in WRAPPER_PREFIXES if name.startswith(p))):
        try:
            return model.get_submodule(candidate)
        except AttributeError:
            pass
    close = difflib.get_close_matches(name, [n for n in all_names if n], n=5, cutoff=0.6)
    if not close:
        close = [n for n in all_names if n and "." not in n][:8]
        hint = f"top-level layers are: {', '.join(close)}"
    else:
        hint = f"did you mean: {', '.join(close)}?"
    raise ValueError(f"model has no layer named {name!r}; {hint} (`explain layers MODEL` lists candidates)")


def module_calls(model: nn.Module, example: Tensor) -> list[tuple[str, nn.Module, tuple[int, ...] | None]]:
    """(name, module, output shape) of every submodule call of one forward pass of
    ``example``, in the order the calls complete (a block after its children); the output
    shape is None where a module returns no tensor, or one that does not depend on the image
    (the text tower of a CLIP model whose text :class:`~explain.ImageInput` holds fixed).

    Dependence is read from autograd: the parameters are frozen for the pass and the image
    requires grad, so an output requires grad exactly where the image reaches it."""
    return [(call.name, call.module, call.shape) for call in trace_calls(model, example)]


def candidate_layers(model: nn.Module, example: Tensor) -> list[LayerInfo]:
    """Run ``model`` once on ``example`` and list, in execution order, every layer with a
    spatial output: an (N, C, h, w) tensor on the input's grid (h or w above one, neither
    larger than the input's, about the input's aspect ratio); for volumes and signals an
    (N, C, d, h, w) or (N, C, l) tensor with more than one location, no side larger than the
    input's. Token tensors of vision transformers and channels-last (N, h, w, C) outputs are
    not spatial by that rule.

    Layers that run more than once per forward pass (reused modules) are left out: their
    activations are ambiguous.
    """
    return [info for _, info in _candidates(module_calls(model, example), example)]


def _candidates(trace, example: Tensor) -> list[tuple[int, LayerInfo]]:
    calls = Counter(name for name, _, _ in trace)
    # Inside an attention module a 4-D output is an attention matrix (N, heads, T, T), not a grid.
    attention = tuple(
        name + "."
        for name, module, _ in trace
        if isinstance(module, nn.MultiheadAttention) or "Attention" in type(module).__name__
    )
    return [
        (position, LayerInfo(name, type(module).__name__, shape))
        for position, (name, module, shape) in enumerate(trace)
        if calls[name] == 1
        and on_input_grid(shape, example)
        and shape is not None
        and shape[0] == example.shape[0]  # a batch of patches folded into the images' is no grid of theirs
        and not name.startswith(attention)
    ]


def transformer_blocks(model: nn.Module, example: Tensor) -> list[str]:
    """Names of the transformer blocks of ``model`` in the order they run (one dry forward
    pass on ``example``): residual modules over tokens that hold a norm (see
    :func:`~explain.blocks.token_blocks`).

    >>> import torch, torchvision
    >>> vit = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    >>> transformer_blocks(vit, torch.rand(1, 3, 32, 32))
    ['encoder.layers.encoder_layer_0', 'encoder.layers.encoder_layer_1']
    """
    example = example[:1]
    return [call.name for call in token_blocks(trace_calls(model, example), example)]


def backbone_layer(model: nn.Module, example: Tensor) -> str:
    """The target layer for CAMs of a segmentation or detection model: the last layer of its
    backbone (:func:`~explain.detectors.backbone_roots`) whose output is one spatial
    (N, C, h, w) tensor, feature pyramids and SSD's extra layers left out (their outputs are
    dicts or lists, or serve the head).

    Picks ``backbone.layer4`` in torchvision's ResNet segmentation models,
    ``backbone.body.layer4`` in ResNet-FPN detectors, the last MobileNet block in the
    MobileNet ones, ``backbone.features`` in SSD300-VGG16, SPPF (``model.model.9``) in a
    wrapped YOLOv8, the last ResNet stage in a wrapped DETR. One forward pass on
    ``example`` finds it; layers that run more than once in a pass are left out.
    """
    roots = backbone_roots(model)
    if not roots:
        raise ValueError(
            f"{type(model).__name__} has no `backbone` to pick a target layer from; pass target_layer "
            "explicitly (`explain layers MODEL` lists the layers)"
        )
    calls = [(name, shape) for name, _, shape in module_calls(model, example[:1]) if _in_backbone(name, roots)]
    counts = Counter(name for name, _ in calls)
    spatial = [
        name
        for name, shape in calls
        if shape is not None and len(shape) == 4 and shape[-2] * shape[-1] > 1 and counts[name] == 1
    ]
    if not spatial:
        raise ValueError(
            f"no layer of {type(model).__name__}'s backbone outputs one spatial tensor; pass target_layer "
            "explicitly (`explain layers MODEL` lists the layers)"
        )
    return spatial[-1]


def _in_backbone(name: str, roots: tuple[str, ...]) -> bool:
    """Whether the module ``name`` lies in one of the backbone's ``roots``, outside its
    feature pyramid and extra layers."""
    for root in roots:
        if name == root:
            return True
        if name.startswith(root + "."):
            return name[len(root) + 1 :].split(".")[0] not in _HEAD_PARTS
    return False


def find_target_layer(model: nn.Module, example: Tensor) -> str:
    """Pick the target layer a person would pick: for a CNN, the last spatial layer before
    global pooling (the usual Grad-CAM choice); for a vision transformer, the first norm of
    its last block (``blocks.11.norm1`` in timm's ViT, ``encoder.layers.encoder_layer_11.ln_1``
    in torchvision's, ``features.7.1.norm1`` in torchvision's Swin).

    One dry forward pass on ``example`` (a single image is enough) records which layers
    produce spatial outputs (see :func:`candidate_layers`); pooling layers are skipped, and
    when a block and its last child produce the same output the block wins, being the name
    a person would pick (``layer4`` rather than ``layer4.2.relu`` in a ResNet).

    Transformer blocks are recognised by what they do (:func:`~explain.blocks.token_blocks`):
    a module over tokens (or a channels-last grid) that adds its input to what it computes
    and holds a norm of any kind (LayerNorm, RMSNorm, LeViT's BatchNorm, ResMLP's affine
    map); the model's final norms are never a block. A model with such blocks is explained
    at the first norm of its last block (:func:`~explain.blocks.block_layer`), even where a
    spatial view of it follows (Swin's final norm, permuted), since past that norm no patch
    token reaches a class token and the map would be blank; a layer that computes on a
    spatial grid after the last block (convolutions after a transformer stage) is taken
    instead. Layers whose batch is a multiple of the images' (MobileViT and TNT fold patches
    into the batch) are never picked. A spatial layer followed only by a head over tokens
    (an attention pool, a channels-last norm) is accepted; one followed by residual token
    modules without a norm raises, naming ``target_layer``.

    torchvision's segmentation and detection models are explained at their backbone's last
    spatial layer (:func:`~explain.tasks.backbone_layer`), not at their heads. The same
    rule picks ``layer4`` in torchvision's video models (r3d_18, mc3_18, r2plus1d_18) and
    the last 1-D convolution block before pooling in a 1-D CNN.
    """
    example = example[:1]
    model = unwrapped(model)
    if task_of(model) is not None:
        return backbone_layer(model, example)
    trace = trace_calls(model, example)
    candidates = [
        (position, info)
        for position, info in _candidates([(c.name, c.module, c.shape) for c in trace], example)
        if not isinstance(model.get_submodule(info.name), _POOLING)
    ]
    chosen = _block_choice(trace, example, candidates)
    if chosen is not None:
        return chosen
    after = trace[candidates[-1][0] + 1 :] if candidates else trace
    residual = residual_token_calls(after, example)
    if residual:
        call = residual[0]
        raise ValueError(
            f"the model works on token sequences ({call.name!r} adds its input to what it computes over "
            f"{call.first_shape} tokens), as vision transformers do, but none of its blocks holds a norm to "
            "pick a target layer from; pass target_layer explicitly (`explain layers MODEL` lists the layers)"
        )
    if not candidates:
        layout = {3: "(N, C, l)", 4: "(N, C, h, w)", 5: "(N, C, d, h, w)"}.get(example.dim(), "spatial")
        raise ValueError(f"found no layer with a spatial {layout} output; pass target_layer explicitly")
    return candidates[-1][1].name


def _block_choice(trace: list[Call], example: Tensor, candidates: list[tuple[int, LayerInfo]]) -> str | None:
    """The layer in the last transformer block (None where there is none, or where a layer
    that computes on a spatial grid runs after it)."""
    blocks = token_blocks(trace, example)
    if not blocks:
        return None
    end = next(position for position, call in enumerate(trace) if call is blocks[-1])
    computing = [
        info
        for position, info in candidates
        if position > end
        and not blocks[-1].name.startswith(info.name + ".")
        and not is_norm(trace[position].module)
        and any(True for _ in trace[position].module.parameters())
    ]
    if computing:
        return None
    return block_layer(trace, blocks, len(blocks) - 1)
