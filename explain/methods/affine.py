"""Whether a traced module is affine in one of its inputs: f(x) = L(x) + b, L linear.

Where the layers after a target layer are affine (a global average pool and a linear
classifier, as after a ResNet's ``layer4`` or an EfficientNet's last block), a perturbation
method needs the output of k + 1 inputs, not of every combination of them: the output of
sum_j m_j x_j + x_0 is f(x_0) + sum_j m_j (f(x_0 + x_j) - f(x_0)) for any weights m.

The test is structural and conservative: every operation that reads a value depending on
the input must be one that is affine in it (a convolution, a linear layer, batch norm and
dropout in eval mode, average pooling, a reshape, a sum of such values, a product with a
value that does not depend on it). A module whose type is not one of these (a subclass
included: timm's ``BatchNormAct2d`` is a batch norm with an activation) is traced in turn
and checked the same way; anything else (a ReLU, a max pool, a product of two such values,
code that cannot be traced) makes the answer False, never a guess.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

__all__ = ["is_affine", "split_affine"]

_MODULES = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.Flatten,
    nn.Unflatten,
    nn.Identity,
)
_EVAL_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.Dropout, nn.Dropout1d, nn.Dropout2d)
_FUNCTIONS = {  # affine in their first argument, the others held fixed
    torch.flatten,
    torch.reshape,
    torch.mean,
    torch.sum,
    torch.transpose,
    torch.permute,
    torch.squeeze,
    torch.unsqueeze,
    F.linear,
    F.conv1d,
    F.conv2d,
    F.conv3d,
    F.avg_pool2d,
    F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d,
    operator.neg,
    operator.getitem,
}
_SUMS = {torch.add, torch.sub, operator.add, operator.sub, torch.cat}  # affine in every term
_SCALINGS = {operator.mul, torch.mul, operator.truediv, torch.div}
_METHODS = {  # affine in the tensor they are called on, the arguments held fixed
    "flatten",
    "view",
    "reshape",
    "mean",
    "sum",
    "permute",
    "transpose",
    "contiguous",
    "squeeze",
    "unsqueeze",
    "expand",
    "float",
}
_METHOD_SUMS = {"add", "sub"}  # affine in the tensor and the term
_SHAPES = {"size", "dim"}  # what these return does not vary with the input's values


def is_affine(module: fx.GraphModule, input_name: str, depth: int = 3) -> bool:
    """Whether ``module``'s output is affine in its placeholder ``input_name`` (the other
    inputs held fixed), judged from its graph (see the module docstring).

    >>> tail = fx.symbolic_trace(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)))
    >>> is_affine(tail, "input")
    True
    >>> is_affine(fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU())), "input")
    False
    """
    kinds = _kinds(module, input_name, depth)
    return kinds is not None and not kinds[1]


def _shape_only(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target in _SHAPES:
        return True
    return node.op == "call_function" and node.target is getattr and node.args[1:] in (("shape",), ("ndim",))


def _affine_node(module: fx.GraphModule, node: fx.Node, inputs: list, varying: set, depth: int) -> bool:
    """Whether ``node`` is affine in the values of ``varying`` it reads (``inputs``)."""
    first = node.args[0] if node.args else node.kwargs.get("input")
    first_varies = isinstance(first, fx.Node) and first in varying
    others = _nodes_in([node.args[1:], {key: v for key, v in node.kwargs.items() if key != "input"}], varying)
    if node.op == "call_module":
        return first_varies and not others and _affine_module(module.get_submodule(str(node.target)), depth)
    if node.op == "call_function" and node.target in _SCALINGS:
        # a product with (or a division by) a value that does not vary with the input
        dividing = node.target in (operator.truediv, torch.div)
        rounding = node.kwargs.get("rounding_mode") is not None or len(node.args) > 2
        once = len(_nodes_in([node.args, node.kwargs], varying)) == 1  # x * x reads x twice
        return once and not (dividing and (not first_varies or rounding))
    if node.op == "call_function" and node.target is F.dropout:
        return node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True) is False and not others
    if node.op == "call_function" and node.target in _SUMS:  # the terms may vary, nothing else
        fixed = node.args[1:] if node.target is torch.cat else node.args[2:]
        return not _nodes_in([fixed, node.kwargs], varying)
    if node.op == "call_function":
        return node.target in _FUNCTIONS and first_varies and not others
    if node.op == "call_method":
        if node.target in _METHOD_SUMS:
            return not _nodes_in([node.args[2:], node.kwargs], varying)
        return node.target in _METHODS and first_varies and not others
    return False


def _nodes_in(arguments, varying: set) -> list[fx.Node]:
    """The nodes of ``varying`` among ``arguments`` (nested lists, tuples and dicts)."""
    found: list[fx.Node] = []
    fx.node.map_arg(arguments, lambda node: found.append(node) if node in varying else None)
    return found


def _affine_module(module: nn.Module, depth: int) -> bool:
    if type(module) in _MODULES:  # the types themselves: a subclass may add an activation
        return True
    if type(module) in _EVAL_MODULES:  # batch norm: its running statistics, not the batch's
        return not module.training and getattr(module, "running_mean", 0) is not None
    if depth <= 0:
        return False
    try:
        traced = fx.symbolic_trace(module)
    except Exception:  # code the trace cannot follow: not known to be affine
        return False
    names = [node.target for node in traced.graph.nodes if node.op == "placeholder"]
    return len(names) == 1 and is_affine(traced, str(names[0]), depth - 1)


def split_affine(module: fx.GraphModule, input_name: str) -> tuple[fx.GraphModule, fx.GraphModule] | None:
    """``module`` as two parts where it starts with operations affine in its input
    ``input_name`` and then goes on with others (a convolution and batch norm, then a
    ReLU): ``head`` takes ``module``'s inputs and returns the tuple of values the affine
    start passes on (each affine in the input), ``rest`` takes those values and
    ``module``'s other inputs and returns its output. None where there is no such start
    (the first operation on the input is not affine), where the whole module is affine
    (:func:`is_affine` says so), or where the module cannot be traced into its operations.

    Since each passed value is affine in the input, the values for a weighted sum of
    inputs are the same weighted sum of their values (the weights summing to 1 with the
    base input): ``rest`` is all that must run for each of many such sums.
    """
    try:
        graph = fx.Tracer().trace(module)  # into every module but torch.nn's own
    except Exception:  # code the trace cannot follow: no split
        return None
    expanded = fx.GraphModule(module, graph)
    kinds = _kinds(expanded, input_name)
    if kinds is None:
        return None
    affine, nonlinear = kinds
    if _changed_in_place_then_read(expanded, affine):
        return None  # the head would read a value the rest changes first
    output = next(node for node in graph.nodes if node.op == "output")
    passed = [node for node in graph.nodes if node in affine and any(user in nonlinear for user in node.users)]
    results = [node for node in output.all_input_nodes if node in affine or node in nonlinear]  # (of a dict too)
    if not results or any(node in affine for node in results) or all(node.op == "placeholder" for node in passed):
        return None  # no output past a non-affine operation, one that is affine, or no affine start
    inputs = [node for node in graph.nodes if node.op == "placeholder"]
    others = [node for node in inputs if node.target != input_name]
    try:
        head = _part(expanded, inputs, lambda node: node in affine, passed, tuple_output=True)
        rest = _part(expanded, passed + others, lambda node: node in nonlinear, [output.args[0]], tuple_output=False)
    except _NoSplit:
        return None
    return head, rest


def _changed_in_place_then_read(module: fx.GraphModule, affine: set[fx.Node]) -> bool:
    """Whether an operation changes a value of ``affine`` in place (``torch.relu_(y)``,
    ``y.add_(1)``, an ``inplace=True`` function or module) that a later node reads: fx keeps
    the later readers on the value's node, so a head run before the rest would read it
    unchanged."""
    order = {node: i for i, node in enumerate(module.graph.nodes)}
    for node in module.graph.nodes:
        changed = node.args[0] if node.args else None
        if not isinstance(changed, fx.Node) or changed not in affine or not _in_place(module, node):
            continue
        if any(order[user] > order[node] for user in changed.users if user is not node):
            return True
    return False


def _in_place(module: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return bool(getattr(module.get_submodule(str(node.target)), "inplace", False))
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return node.kwargs.get("inplace") is True or (name.endswith("_") and not name.endswith("__"))


class _NoSplit(Exception):
    """The rest reads the input other than through the values passed on."""


def _kinds(module: fx.GraphModule, input_name: str, depth: int = 0) -> tuple[set[fx.Node], set[fx.Node]] | None:
    """The nodes affine in the input (reached from it through affine operations only) and
    those past a non-affine one; None where the module has no such input. ``depth``: how
    many levels of modules kept whole are traced in turn to be judged."""
    affine: set[fx.Node] = set()
    nonlinear: set[fx.Node] = set()
    for node in module.graph.nodes:
        if node.op == "placeholder":
            if node.target == input_name:
                affine.add(node)
            continue
        sources = [source for source in node.all_input_nodes if source in affine or source in nonlinear]
        if not sources or _shape_only(node) or node.op == "output":
            continue
        if all(s in affine for s in sources) and _affine_node(module, node, sources, affine, depth):
            affine.add(node)
        else:
            nonlinear.add(node)
    return (affine, nonlinear) if any(n.op == "placeholder" for n in affine) else None


def _part(module: fx.GraphModule, inputs: list[fx.Node], keep, outputs: list, tuple_output: bool) -> fx.GraphModule:
    """A graph of ``module``'s nodes that ``keep`` accepts, from ``inputs`` (as placeholders)
    to ``outputs``; the values neither kept nor an input (constants, shapes) computed again."""
    graph = fx.Graph()
    env = {node: graph.placeholder(f"input_{i}") for i, node in enumerate(inputs)}

    def copy(node: fx.Node) -> fx.Node:
        if node not in env:
            if node.op == "placeholder":  # read past the split (the input's shape, say): none here
                raise _NoSplit
            for source in node.all_input_nodes:
                copy(source)
            env[node] = graph.node_copy(node, lambda n: env[n])
        return env[node]

    for node in module.graph.nodes:
        if keep(node) and node.op not in ("placeholder", "output"):
            copy(node)
    results = [fx.node.map_arg(value, copy) for value in outputs]  # (a dict or tuple output too)
    graph.output(tuple(results) if tuple_output else results[0])
    return fx.GraphModule(module, graph)
