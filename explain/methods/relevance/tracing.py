"""What one forward pass, or the autograd graph of one, shows about a model: the batch
norms that can be merged into the layer before them, the convolution that sees the
pixels, and the merges of two activations that no module (so no rule) covers."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from zennit.types import BatchNorm, ConvolutionStandard

from ...hooks import preserved_state
from ..cam_base import output_tensors

__all__ = [
    "LINEAR_STEPS",
    "PRODUCT_STEPS",
    "RESHAPING_STEPS",
    "ROUTING_STEPS",
    "RuleSpans",
    "TracedLayers",
    "nonlinear_steps",
    "on_every_path",
    "reshaped_from",
    "traced_batch_norm_pairs",
    "traced_layers",
    "unruled_steps",
    "unseen_merges",
]

# Autograd nodes that merge two activations outside any module, where no rule applies.
_UNSEEN_MERGES = frozenset({"AddBackward0", "SubBackward0", "MulBackward0"})


class TracedLayers(NamedTuple):
    """What :func:`traced_layers` found in one forward pass."""

    #: The (convolution or linear layer, batch norm) pairs a merge leaves the model's function unchanged for.
    pairs: list[tuple[nn.Module, nn.Module]]
    #: The first convolution that runs: the one that sees the pixels (not necessarily the first registered).
    first: nn.Module | None
    #: The last convolution or linear layer that runs: the classifier of a classifier.
    last: nn.Module | None


def traced_batch_norm_pairs(
    model: nn.Module, images: Tensor
) -> tuple[list[tuple[nn.Module, nn.Module]], nn.Module | None]:
    """The (convolution or linear layer, batch norm) pairs of ``model`` where the batch norm
    receives the very tensor the layer returned, unchanged in place, each called once: the
    pairs a merge leaves the model's function unchanged for; and the first convolution that
    runs (the one that sees the pixels; not necessarily the first registered). One forward
    pass on the first image, with hooks removed afterwards, finds them."""
    traced = traced_layers(model, images)
    return traced.pairs, traced.first


def traced_layers(model: nn.Module, images: Tensor) -> TracedLayers:
    """The batch norms to merge, the first convolution and the last convolution or linear
    layer to run (see :class:`TracedLayers`), from one forward pass on the first image, with
    hooks removed afterwards."""
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
    last = next((module for module in reversed(calls) if isinstance(module, (ConvolutionStandard, nn.Linear))), None)
    return TracedLayers(pairs, first, last)


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


#: Autograd steps outside any module with a rule whose gradient is already what Excitation
#: Backprop passes down: they route, select, pad or reshape values without mixing them, and
#: ReLU's zeroes only units whose winning probability is zero anyway (P(a_i) has the factor
#: a_i). zennit's ``Identity`` and ``clone`` are the wrappers its hooks put around a module's input.
ROUTING_STEPS = frozenset(
    {
        "AccumulateGrad",
        "AliasBackward0",
        "BackwardHookFunctionBackward",
        "CatBackward0",
        "CloneBackward0",
        "ConstantPadNdBackward0",
        "GatedPathBackward",
        "IdentityBackward",
        "MaxPool1DWithIndicesBackward0",
        "MaxPool2DWithIndicesBackward0",
        "MaxPool3DWithIndicesBackward0",
        "AdaptiveMaxPool1DBackward0",
        "AdaptiveMaxPool2DBackward0",
        "AdaptiveMaxPool3DBackward0",
        "PermuteBackward0",
        "ReluBackward0",
        "ReshapeAliasBackward0",
        "SelectBackward0",
        "SliceBackward0",
        "SplitBackward0",
        "SplitWithSizesBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "StackBackward0",
        "ToCopyBackward0",
        "TransposeBackward0",
        "UnbindBackward0",
        "UnsafeViewBackward0",
        "UnsqueezeBackward0",
        "ViewBackward0",
    }
)
#: The steps that only reshape or wrap a tensor: between a classifier and the model's output.
RESHAPING_STEPS = frozenset(
    {"AliasBackward0", "CloneBackward0", "IdentityBackward", "ReshapeAliasBackward0", "SqueezeBackward0"}
    | {"SqueezeBackward1", "SqueezeBackward2", "ToCopyBackward0", "UnsafeViewBackward0", "ViewBackward0"}
)


class RuleSpans:
    """While entered, records each call of ``modules`` (those with a rule) as the autograd
    node of its output and that of its input as the module received it (after the input
    wrappers of zennit's hooks, before any in-place change), so that a walk of the graph can
    step over what a rule computes. Enter it after the composite is registered."""

    def __init__(self, modules: list[nn.Module]):
        self.modules = modules
        self.spans: dict[Any, Any] = {}
        self.outputs: dict[nn.Module, Any] = {}
        self.handles: list = []
        self.pending: dict[nn.Module, list] = {}

    def __enter__(self) -> RuleSpans:
        for module in self.modules:
            self.handles.append(module.register_forward_pre_hook(self.before))
            self.handles.append(module.register_forward_hook(self.after))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def before(self, module: nn.Module, inputs) -> None:
        first = inputs[0] if inputs and isinstance(inputs[0], Tensor) else None
        self.pending.setdefault(module, []).append(None if first is None else first.grad_fn)

    def after(self, module: nn.Module, inputs, output) -> None:
        start = self.pending[module].pop()
        if isinstance(output, Tensor) and output.grad_fn is not None and start is not None:
            if output.grad_fn is not start:
                self.spans[output.grad_fn] = start
            self.outputs[module] = output.grad_fn


def unruled_steps(output: Tensor, spans: dict, stop: set) -> list[str]:
    """The steps of ``output``'s autograd graph, from the output down to the nodes in
    ``stop``, that no rule covers (outside the ``spans`` of :class:`RuleSpans`) and that are
    not in :data:`ROUTING_STEPS`: their names, without ``Backward0``, once each, sorted."""
    seen, stack, found = set(), [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in stop:
            continue
        if node in spans:
            stack.append(spans[node])
            continue
        if type(node).__name__ not in ROUTING_STEPS:
            found.add(re.sub(r"Backward\d*$", "", type(node).__name__))
        stack.extend(parent for parent, _ in node.next_functions)
    return sorted(found)


def reshaped_from(output: Tensor, node) -> bool:
    """Whether ``output`` is the output of autograd node ``node`` reshaped at most (see
    :data:`RESHAPING_STEPS`), so that its units are that node's."""
    step = output.grad_fn
    while step is not None and step is not node and type(step).__name__ in RESHAPING_STEPS:
        parents = [parent for parent, _ in step.next_functions if parent is not None]
        step = parents[0] if len(parents) == 1 else None
    return step is not None and step is node


def on_every_path(model: nn.Module, example: Tensor, names: list[str]) -> list[str]:
    """Those of the layers ``names`` whose output every path from the image to the model's
    output goes through (not a branch that a shortcut passes by), in the order given, from
    the autograd graph of one forward pass on ``example`` (parameters frozen, hooks removed
    afterwards)."""
    nodes: dict[str, Any] = {}

    def keep(name: str):
        def hook(module: nn.Module, inputs, output) -> None:
            if isinstance(output, Tensor) and output.grad_fn is not None:
                nodes[name] = output.grad_fn

        return hook

    handles = [model.get_submodule(name).register_forward_hook(keep(name)) for name in names]
    try:
        with preserved_state(model), torch.inference_mode(False), torch.enable_grad():
            image = example[:1].detach().clone().requires_grad_()  # a normal tensor, also from inference mode
            output = model(image)
    finally:
        for handle in handles:
            handle.remove()
    roots = [tensor.grad_fn for tensor in output_tensors(output) if tensor.grad_fn is not None]
    return [name for name in names if name in nodes and not _reaches(roots, image, nodes[name])]


def _reaches(roots: list, image: Tensor, blocked) -> bool:
    """Whether the graph from ``roots`` reaches ``image`` without passing node ``blocked``."""
    seen, stack = {blocked}, list(roots)
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if getattr(node, "variable", None) is image:
            return True
        stack.extend(parent for parent, _ in node.next_functions)
    return False


#: Autograd steps that are linear in the activations they take (the rest of their inputs
#: constants), or route values: their gradient times input is LRP-epsilon (epsilon -> 0)
#: over them. ReLU's gradient times input is the identity rule (relu(x) = x where it passes),
#: max pooling's routes to the winner, softmax's is the Taylor rule of AttnLRP, and batch
#: norm in eval mode is an affine map.
LINEAR_STEPS = ROUTING_STEPS | frozenset(
    {
        "AddBackward0",
        "AddBackward1",
        "AddmmBackward0",
        "AsStridedBackward0",
        "AsStridedBackward1",
        "AvgPool2DBackward0",
        "AdaptiveAvgPool2DBackward0",
        "ConvolutionBackward0",
        "CudnnBatchNormBackward0",
        "DivBackward1",
        "ExpandBackward0",
        "FlipBackward0",
        "IndexBackward0",
        "IndexSelectBackward0",
        "GatherBackward0",
        "MaskedFillBackward0",
        "MeanBackward0",
        "MeanBackward1",
        "MulBackward1",
        "NativeBatchNormBackward0",
        "NegBackward0",
        "RepeatBackward0",
        "RollBackward0",
        "RsubBackward1",
        "SoftmaxBackward0",
        "SubBackward0",
        "SubBackward1",
        "SumBackward0",
        "SumBackward1",
        "ViewAsRealBackward0",
    }
)
#: Products: linear where at most one factor depends on the input.
PRODUCT_STEPS = frozenset({"MulBackward0", "BmmBackward0", "MmBackward0", "AddmmBackward0", "BaddbmmBackward0"})


def _reaching(roots: list, leaf) -> set:
    """The autograd nodes from ``roots`` down whose graph reaches node ``leaf``."""
    reaching, done, stack = set(), set(), [(root, False) for root in roots if root is not None]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            done.add(node)
            if node is leaf or any(parent in reaching for parent, _ in node.next_functions):
                reaching.add(node)
            continue
        if node in done:
            continue
        stack.append((node, True))
        stack.extend((parent, False) for parent, _ in node.next_functions if parent is not None and parent not in done)
    return reaching


def _through_shapes(node, rules: frozenset[str]) -> bool:
    """Whether ``node`` is a step named in ``rules``, reached through reshaping steps only."""
    while node is not None and type(node).__name__ not in rules:
        parents = [parent for parent, _ in node.next_functions if parent is not None]
        if type(node).__name__ not in ROUTING_STEPS | {"ExpandBackward0"} or len(parents) != 1:
            return False
        node = parents[0]
    return node is not None


def nonlinear_steps(
    outputs: list[Tensor], inputs: Tensor, rules: frozenset[str], product_rules: frozenset[str]
) -> list[str]:
    """The steps between ``inputs`` and ``outputs`` that are neither linear in the input
    (:data:`LINEAR_STEPS`; a product or a division whose other factor does not depend on the
    input) nor a step named in ``rules`` (custom autograd functions that carry a rule), nor a
    product whose every factor that depends on the input comes from a step named in
    ``product_rules`` (a rule for products): their names, without ``Backward``, once each,
    sorted; "Mul" etc. for products of two activations."""
    roots = [tensor.grad_fn for tensor in outputs if tensor.grad_fn is not None]
    leaf = _input_node(roots, inputs)
    if leaf is None:
        return []
    reaching = _reaching(roots, leaf)
    found = set()
    for node in reaching:
        name = type(node).__name__
        active = [parent for parent, _ in node.next_functions if parent in reaching]
        if name in rules or (name in LINEAR_STEPS and name not in PRODUCT_STEPS):
            continue
        if name == "DivBackward0" and node.next_functions[1][0] not in reaching:
            continue
        if name in PRODUCT_STEPS and (len(active) <= 1 or all(_through_shapes(p, product_rules) for p in active)):
            continue
        found.add(re.sub(r"Backward\d*$", "", name))
    return sorted(found)


def _input_node(roots: list, inputs: Tensor):
    """The AccumulateGrad node of the leaf tensor ``inputs`` in the graph of ``roots``."""
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if getattr(node, "variable", None) is inputs:
            return node
        stack.extend(parent for parent, _ in node.next_functions)
    return None
