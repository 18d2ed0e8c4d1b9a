"""Finding target layers: by module, by dotted name, or automatically."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

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


def candidate_layers(model: nn.Module, example: Tensor) -> list[LayerInfo]:
    """Run ``model`` once on ``example`` and list, in execution order, every layer with a
    spatial output: a 4-D tensor whose height or width exceeds one.

    Layers that run more than once per forward pass (reused modules) are left out: their
    activations are ambiguous.
    """
    seen: dict[str, LayerInfo] = {}
    calls: dict[str, int] = {}
    order: list[str] = []

    def record(name: str):
        def hook(module: nn.Module, args, output) -> None:
            calls[name] = calls.get(name, 0) + 1
            if isinstance(output, Tensor) and output.dim() == 4 and max(output.shape[2:]) > 1:
                seen[name] = LayerInfo(name, type(module).__name__, tuple(output.shape))
                order.append(name)

        return hook

    handles = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if n]
    try:
        with preserved_state(model), torch.no_grad():
            model(example)
    finally:
        for handle in handles:
            handle.remove()
    return [seen[name] for name in order if calls[name] == 1]


def find_target_layer(model: nn.Module, example: Tensor) -> str:
    """Pick the last spatial layer before global pooling: the usual Grad-CAM choice.

    One dry forward pass on ``example`` (a single image is enough) records which layers
    produce (N, C, H, W) outputs with H or W above one; pooling layers are skipped, and when
    a block and its last child produce the same output the block wins, being the name a
    person would pick (``layer4`` rather than ``layer4.2.relu`` in a ResNet).
    """
    candidates = [info for info in candidate_layers(model, example[:1])
                  if not isinstance(model.get_submodule(info.name), _POOLING)]
    if not candidates:
        raise ValueError(
            "found no layer with a spatial (N, C, H, W) output; pass target_layer explicitly "
            "(vision transformers need a layer name and a reshape of their tokens)"
        )
    return candidates[-1].name
