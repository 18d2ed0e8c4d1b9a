"""What one forward pass, or the autograd graph of one, shows about a model: the batch
norms that can be merged into the layer before them, the convolution that sees the
pixels, and the merges of two activations that no module (so no rule) covers."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from zennit.types import BatchNorm, ConvolutionStandard

__all__ = ["traced_batch_norm_pairs", "unseen_merges"]

# Autograd nodes that merge two activations outside any module, where no rule applies.
_UNSEEN_MERGES = frozenset({"AddBackward0", "SubBackward0", "MulBackward0"})


def traced_batch_norm_pairs(
    model: nn.Module, images: Tensor
) -> tuple[list[tuple[nn.Module, nn.Module]], nn.Module | None]:
    """The (convolution or linear layer, batch norm) pairs of ``model`` where the batch norm
    receives the very tensor the layer returned, unchanged in place, each called once: the
    pairs a merge leaves the model's function unchanged for; and the first convolution that
    runs (the one that sees the pixels; not necessarily the first registered). One forward
    pass on the first image, with hooks removed afterwards, finds them."""
    producers: dict[int, tuple[nn.Module, Tensor, int]] = {}
    calls: dict[nn.Module, int] = {}
    pairs = []

    def record(module: nn.Module, inputs, output) -> None:
        calls[module] = calls.get(module, 0) + 1
        if isinstance(output, Tensor):
            producers[id(output)] = (module, output, output._version)

    def match(module: nn.Module, inputs) -> None:
        if not inputs:
            return
        layer, output, version = producers.get(id(inputs[0]), (None, None, None))
        if output is inputs[0] and version == output._version and isinstance(layer, (ConvolutionStandard, nn.Linear)):
            pairs.append((layer, module))

    norms = [
        module
        for module in model.modules()
        if isinstance(module, BatchNorm)
        and module.affine
        and module.running_mean is not None
        and module.running_var is not None
    ]
    leaves = [module for module in model.modules() if next(module.children(), None) is None]
    handles = [module.register_forward_pre_hook(match) for module in norms]
    handles += [module.register_forward_hook(record) for module in {*leaves, *norms}]
    try:
        with torch.no_grad():
            model(images[:1])
    finally:
        for handle in handles:
            handle.remove()
    pairs = [(layer, norm) for layer, norm in pairs if calls.get(layer) == 1 and calls.get(norm) == 1]
    first = next((module for module in calls if isinstance(module, ConvolutionStandard)), None)
    return pairs, first


def unseen_merges(output: Tensor) -> int:
    """How many additions, subtractions or products of two activations outside any module
    (functional residual additions, gates) the graph of ``output`` holds: relevance is
    copied through them, not divided."""
    seen, stack, count = set(), [output.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        parents = [parent for parent, _ in node.next_functions if parent is not None]
        count += type(node).__name__ in _UNSEEN_MERGES and len(parents) > 1
        stack.extend(parents)
    return count
