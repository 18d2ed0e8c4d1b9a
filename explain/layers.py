"""Finding target layers: by module, by dotted name, or automatically."""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import channel_hint
from .hooks import preserved_state

__all__ = ["LayerInfo", "LayerSpec", "candidate_layers", "find_target_layer", "resolve_layers"]

LayerSpec = str | nn.Module | Sequence[str | nn.Module] | None

# Modules that pool or resample rather than compute features; a CAM on their output adds nothing.
_POOLING = (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.AvgPool2d, nn.Upsample)


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
                raise ValueError(
                    f"the {type(item).__name__} given as target_layer is not a submodule of the model"
                )
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
    raise ValueError(
        f"model has no layer named {name!r}; {hint} (`explain layers MODEL` lists candidates)"
    )


def on_input_grid(shape: tuple[int, ...] | None, example: Tensor) -> bool:
    """Whether ``shape`` is (N, C, h, w) with (h, w) a downscaled grid of ``example``'s pixels."""
    if shape is None or len(shape) != 4:
        return False
    height, width = example.shape[-2:]
    h, w = shape[-2:]
    if max(h, w) < 2 or h > height or w > width:
        return False
    # Strided layers round each side, which on a small grid can move the aspect ratio far
    # (48 x 256 -> 2 x 8 in a ResNet), so one cell of slack is allowed too.
    return (abs(h / w - height / width) <= 0.25 * height / width
            or abs(h - w * height / width) <= 1 or abs(w - h * width / height) <= 1)


def _trace(model: nn.Module, example: Tensor) -> list[tuple[str, nn.Module, tuple[int, ...] | None]]:
    """(name, module, output shape) of every submodule call of one forward pass, in the
    order the calls complete (a block after its children)."""
    trace = []

    def record(name: str):
        def hook(module: nn.Module, args, output) -> None:
            trace.append((name, module, tuple(output.shape) if isinstance(output, Tensor) else None))

        return hook

    handles = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if n]
    try:
        with preserved_state(model), torch.no_grad(), channel_hint(example):
            model(example)
    finally:
        for handle in handles:
            handle.remove()
    return trace


def candidate_layers(model: nn.Module, example: Tensor) -> list[LayerInfo]:
    """Run ``model`` once on ``example`` and list, in execution order, every layer with a
    spatial output: an (N, C, h, w) tensor on the input's grid (h or w above one, neither
    larger than the input's, about the input's aspect ratio). Token tensors of vision
    transformers and channels-last (N, h, w, C) outputs are not spatial by that rule.

    Layers that run more than once per forward pass (reused modules) are left out: their
    activations are ambiguous.
    """
    return [info for _, info in _candidates(_trace(model, example), example)]


def _candidates(trace, example: Tensor) -> list[tuple[int, LayerInfo]]:
    calls = Counter(name for name, _, _ in trace)
    return [
        (position, LayerInfo(name, type(module).__name__, shape))
        for position, (name, module, shape) in enumerate(trace)
        if calls[name] == 1 and on_input_grid(shape, example)
    ]


def find_target_layer(model: nn.Module, example: Tensor) -> str:
    """Pick the last spatial layer before global pooling: the usual Grad-CAM choice.

    One dry forward pass on ``example`` (a single image is enough) records which layers
    produce spatial outputs (see :func:`candidate_layers`); pooling layers are skipped, and
    when a block and its last child produce the same output the block wins, being the name
    a person would pick (``layer4`` rather than ``layer4.2.relu`` in a ResNet).
    """
    example = example[:1]
    trace = _trace(model, example)
    candidates = [(position, info) for position, info in _candidates(trace, example)
                  if not isinstance(model.get_submodule(info.name), _POOLING)]
    if not candidates:
        raise ValueError(
            "found no layer with a spatial (N, C, H, W) output; pass target_layer explicitly"
        )
    position, chosen = candidates[-1]
    tokens = [(name, shape) for name, _, shape in trace[position + 1:]
              if shape is not None and len(shape) == 3 and shape[1] > 1]
    if tokens:
        name, shape = tokens[0]
        raise ValueError(
            f"after {chosen.name!r} the model works on token sequences ({name!r} outputs {shape}), "
            "as vision transformers do, so no layer suits an automatic CAM; pass target_layer "
            "explicitly"
        )
    return chosen.name
