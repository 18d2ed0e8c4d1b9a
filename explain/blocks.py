"""Transformer blocks recognised by what they do, in one traced forward pass.

A vision transformer's block takes the tokens, (N, T, C) or a channels-last (N, h, w, C)
grid, and returns tokens of the same shape, adding what it computes to its input (the
residual connection: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``), and it
normalises on the way: LayerNorm, RMSNorm, a BatchNorm over the tokens (LeViT), an affine
map (ResMLP). :func:`trace_calls` records every module call of one forward pass, with
whether its output is its input plus something (read from the autograd graph: the output's
``grad_fn`` is a sum that reaches the input's through sums alone), and :func:`token_blocks`
picks the blocks: residual modules over tokens that hold a norm, one image's tokens per
row (a module whose batch is a multiple of the images' folds patches into the batch, as
MobileViT and TNT do, and is left out), innermost first (a stage of one block is not a
second block). The model itself and modules that are not called (a list of final norms)
are never blocks.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .checks import channel_hint
from .hooks import preserved_state
from .tokens import on_input_grid

__all__ = ["Call", "block_layer", "is_norm", "is_token_shape", "residual_token_calls", "token_blocks", "trace_calls"]

#: Type names of normalisations: LayerNorm, RMSNorm, BatchNorm1d, GroupNorm, LeViT's
#: LinearNorm, ResMLP's Affine, and the libraries' own variants.
_NORM = re.compile(r"Norm|Affine")
#: How many sums a residual path may pass through from a block's output to its input
#: (two in a pre-norm block: the MLP's sum after the attention's).
_RESIDUAL_DEPTH = 3


@dataclass(frozen=True)
class Call:
    """One module call of a traced forward pass.

    ``shape`` is the output's shape where the module returns one tensor that depends on
    the image (None otherwise); ``first_shape`` that of the first tensor it returns (also
    from a tuple); ``input_shape`` that of its only tensor argument (None where it takes
    none or several); ``residual`` whether its output is its input plus something.
    """

    name: str
    module: nn.Module
    shape: tuple[int, ...] | None
    first_shape: tuple[int, ...] | None
    input_shape: tuple[int, ...] | None
    residual: bool
    output: int = 0


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` normalises (by its type's name: ``*Norm*``, ``Affine``)."""
    return bool(_NORM.search(type(module).__name__))


def is_token_shape(shape: tuple[int, ...] | None, example: Tensor) -> bool:
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


def _first_tensor(value) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((item for item in value if isinstance(item, Tensor)), None)
    return None


def _reaches(node, target, depth: int) -> bool:
    """Whether the sum ``node`` reaches ``target`` through sums alone, within ``depth``."""
    if node is None or depth < 1 or not type(node).__name__.startswith("AddBackward"):
        return False
    return any(child is target or _reaches(child, target, depth - 1) for child, _ in node.next_functions)


def trace_calls(model: nn.Module, example: Tensor) -> list[Call]:
    """Every submodule call of one forward pass of ``example``, in the order the calls
    complete (a block after its children). Dependence on the image and the residual test
    are read from autograd: the parameters are frozen for the pass and the image requires
    grad, so an output requires grad exactly where the image reaches it. A call is residual
    where its output is a sum that reaches, through sums alone, its input or the output of
    one of its own children (a block that first adds a convolutional position encoding)."""
    trace: list[Call] = []
    frames: list[tuple[list, list]] = []
    # Autograd cannot record through inference tensors (nor from integer input): then every output counts.
    tracked = example.is_floating_point() and not any(
        param.is_inference()
        for param in model.parameters()
        if not isinstance(param, nn.parameter.UninitializedParameter)
    )

    def before(module: nn.Module, args) -> None:
        tensors = [arg for arg in args if isinstance(arg, Tensor)]
        frames.append(([(tuple(t.shape), t.grad_fn) for t in tensors], []))

    def record(name: str):
        def hook(module: nn.Module, args, output) -> None:
            inputs, children = frames.pop()
            outputs = [t for t in (output if isinstance(output, (tuple, list)) else (output,)) if isinstance(t, Tensor)]
            live = [t for t in outputs if t.requires_grad or not tracked]
            if frames:
                frames[-1][1].extend(t.grad_fn for t in live if t.grad_fn is not None)
            index, residual = _residual_output(live, inputs, children, example)
            first = live[index] if live else None
            shape = None if first is None else tuple(first.shape)
            single = shape if isinstance(output, Tensor) and live else None
            input_shape = next((s for s, _ in inputs if s == shape), inputs[0][0] if len(inputs) == 1 else None)
            trace.append(Call(name, module, single, shape, input_shape, residual, index))

        return hook

    with preserved_state(model), torch.inference_mode(False), torch.set_grad_enabled(tracked), channel_hint(example):
        handles = []
        for name, module in model.named_modules():
            if name:
                handles.append(module.register_forward_pre_hook(before))
                handles.append(module.register_forward_hook(record(name)))
        try:
            model(example.detach().clone().requires_grad_(tracked).clone())
        finally:
            for handle in handles:
                handle.remove()
    return trace


def _residual_output(outputs: list[Tensor], inputs: list, children: list, example: Tensor) -> tuple[int, bool]:
    """Which of a call's output tensors carries its tokens, and whether it is residual: the
    last output over one image's tokens that is a sum reaching, through sums alone, the
    input of its shape or the output of one of the call's children (TNT's blocks take and
    return the pixel and the patch tokens; the patch tokens are the image's)."""
    for index in reversed(range(len(outputs))):
        tensor = outputs[index]
        shape = tuple(tensor.shape)
        if not is_token_shape(shape, example) or shape[0] != example.shape[0]:
            continue
        sources = [node for input_shape, node in inputs if input_shape == shape] + children
        if any(_reaches(tensor.grad_fn, source, _RESIDUAL_DEPTH) for source in sources if source is not None):
            return index, True
    return 0, False


def _holds_norm(module: nn.Module) -> bool:
    return any(is_norm(inner) for inner in module.modules() if inner is not module)


def token_blocks(trace: list[Call], example: Tensor) -> list[Call]:
    """The transformer blocks of a traced pass, in the order they run: modules called once
    whose output (or first output) is tokens of their input's shape, one image per row,
    that add their input to what they compute and hold a norm; of nested ones the innermost."""
    calls = Counter(call.name for call in trace)
    found = [
        call
        for call in trace
        if calls[call.name] == 1
        and call.residual
        and call.first_shape == call.input_shape
        and is_token_shape(call.first_shape, example)
        and call.first_shape is not None
        and call.first_shape[0] == example.shape[0]
        and _holds_norm(call.module)
    ]
    names = {call.name for call in found}
    return [call for call in found if not any(other.startswith(call.name + ".") for other in names)]


def residual_token_calls(trace: list[Call], example: Tensor) -> list[Call]:
    """Calls that add their input to what they compute over one image's tokens, norm or not
    (transformer or MLP blocks the norm rule of :func:`token_blocks` does not see)."""
    return [
        call
        for call in trace
        if call.residual
        and call.first_shape == call.input_shape
        and is_token_shape(call.first_shape, example)
        and call.first_shape is not None
        and call.first_shape[0] == example.shape[0]
    ]


def block_layer(trace: list[Call], blocks: list[Call], index: int) -> str | None:
    """The layer to explain a model at, in its block ``blocks[index]``: the block's first
    norm (a module without children) whose output is the block's tokens (what its attention reads); where it has none
    at the top (LeViT adds each half-block to its input without one), the previous block,
    whose output is this block's input; else the block itself (where it returns a tensor)."""
    block = blocks[index]
    calls = Counter(call.name for call in trace)
    for call in trace:
        if (
            call.name.startswith(block.name + ".")
            and is_norm(call.module)
            and next(call.module.children(), None) is None
            and calls[call.name] == 1
            and call.shape is not None
            and call.shape == block.first_shape
        ):
            return call.name
    if index > 0 and blocks[index - 1].shape is not None and blocks[index - 1].shape == block.input_shape:
        return blocks[index - 1].name
    return block.name if block.shape is not None else None
