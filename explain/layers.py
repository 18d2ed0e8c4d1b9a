"""Finding target layers: by module, by dotted name, or automatically (for a CNN, a vision
transformer, or the backbone of a segmentation or detection model)."""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .checks import channel_hint
from .detectors import backbone_roots
from .hooks import preserved_state
from .model_tasks import task_of
from .tokens import infer_layout, on_input_grid

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

    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    >>> list(resolve_layers(model, ["0", model[1]]))
    ['0', '1']
    """
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
    try:
        return model.get_submodule(name)
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
    trace = []
    # Autograd cannot record through inference tensors (nor from integer input): then every output counts.
    tracked = example.is_floating_point() and not any(
        param.is_inference()
        for param in model.parameters()
        if not isinstance(param, nn.parameter.UninitializedParameter)
    )

    def record(name: str):
        def hook(module: nn.Module, args, output) -> None:
            seen = isinstance(output, Tensor) and (output.requires_grad or not tracked)
            trace.append((name, module, tuple(output.shape) if seen else None))

        return hook

    with preserved_state(model), torch.inference_mode(False), torch.set_grad_enabled(tracked), channel_hint(example):
        handles = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if n]
        try:
            model(example.detach().clone().requires_grad_(tracked).clone())
        finally:
            for handle in handles:
                handle.remove()
    return trace


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
    return [
        (position, LayerInfo(name, type(module).__name__, shape))
        for position, (name, module, shape) in enumerate(trace)
        if calls[name] == 1 and on_input_grid(shape, example)
    ]


def _is_sequence_output(shape: tuple[int, ...] | None, example: Tensor) -> bool:
    """Whether ``shape`` looks like what a transformer block outputs: (N, tokens, C), or a
    channels-last (N, h, w, C) grid of the input (of an image: a signal's layers are (N, C, l))."""
    if shape is None or example.dim() != 4:
        return False
    if len(shape) == 3:
        return shape[1] > 1
    return (
        len(shape) == 4
        and not on_input_grid(shape, example)
        and on_input_grid((shape[0], shape[3], shape[1], shape[2]), example)
    )


def _block_norms(trace, example: Tensor) -> list[list[str]]:
    """The transformer blocks of a traced forward pass, in the order they run, each as the
    names of its LayerNorms over tokens (or a channels-last grid), in the order they run.
    A block is a module with two or more such norms."""
    calls = Counter(name for name, _, _ in trace)
    norms: dict[str, list[str]] = {}
    for name, module, shape in trace:
        if calls[name] != 1 or not isinstance(module, nn.LayerNorm) or not _is_sequence_output(shape, example):
            continue
        try:
            infer_layout(shape, (example.shape[-2], example.shape[-1]))
        except ValueError:
            continue
        norms.setdefault(name.rpartition(".")[0], []).append(name)
    return [names for names in norms.values() if len(names) >= 2]


def transformer_blocks(model: nn.Module, example: Tensor) -> list[str]:
    """Names of the transformer blocks of ``model`` in the order they run (one dry forward
    pass on ``example``): the modules with two or more LayerNorms over tokens.

    >>> import torchvision
    >>> vit = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    >>> transformer_blocks(vit, torch.rand(1, 3, 32, 32))
    ['encoder.layers.encoder_layer_0', 'encoder.layers.encoder_layer_1']
    """
    return [names[0].rpartition(".")[0] for names in _block_norms(module_calls(model, example[:1]), example[:1])]


def _transformer_layer(trace, example: Tensor) -> str | None:
    """The first norm of the last transformer block: the usual target of a CAM on a vision
    transformer. In a class-token model the patch tokens reach the logits only through the
    last block's attention, which reads that norm's output; after it, a patch token's
    gradient is zero. A block is a module with two or more norms (``norm1``/``norm2``,
    ``ln_1``/``ln_2``, ``layernorm_before``/``layernorm_after``) whose outputs are tokens
    or a channels-last grid."""
    blocks = _block_norms(trace, example)
    return blocks[-1][0] if blocks else None


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
    a person would pick (``layer4`` rather than ``layer4.2.relu`` in a ResNet). A model with
    transformer blocks (two LayerNorms over tokens or a channels-last grid) is explained at
    the first norm of its last block, even where a spatial layer follows (Swin's final
    norm, permuted), since past that norm no patch token reaches the class token and the
    map would be blank. torchvision's segmentation and detection models are explained at
    their backbone's last spatial layer (:func:`~explain.tasks.backbone_layer`), not at their
    heads. The same rule picks ``layer4`` in torchvision's video models (r3d_18, mc3_18,
    r2plus1d_18) and the last 1-D convolution block before pooling in a 1-D CNN.
    """
    example = example[:1]
    if task_of(model) is not None:
        return backbone_layer(model, example)
    trace = module_calls(model, example)
    chosen = _transformer_layer(trace, example)
    if chosen is not None:
        return chosen
    candidates = [
        (position, info)
        for position, info in _candidates(trace, example)
        if not isinstance(model.get_submodule(info.name), _POOLING)
    ]
    after = trace[candidates[-1][0] + 1 :] if candidates else trace
    sequences = [(name, shape) for name, _, shape in after if _is_sequence_output(shape, example)]
    if sequences:
        name, shape = sequences[0]
        raise ValueError(
            f"the model works on token sequences ({name!r} outputs {shape}), as vision transformers do, but "
            "no transformer block with two LayerNorms was found to pick a target layer from; pass "
            "target_layer explicitly (`explain layers MODEL` lists the layers)"
        )
    if not candidates:
        layout = {3: "(N, C, l)", 4: "(N, C, h, w)", 5: "(N, C, d, h, w)"}.get(example.dim(), "spatial")
        raise ValueError(f"found no layer with a spatial {layout} output; pass target_layer explicitly")
    return candidates[-1][1].name
