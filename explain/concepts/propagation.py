"""The passes of Concept Relevance Propagation: LRP, with the rules and canonizers of
:class:`~explain.LRP`, and *gates* at chosen layers.

A gate sits on a layer's output for one pass. Forward it records the activation and hands
the rest of the model a copy (so that later in-place changes leave the record alone), and
it can stop the pass there (:class:`.Gates` with ``stop=``): the layers above a concept's
layer are not needed to propagate the concept's relevance down. Backward it records the
relevance that reaches the layer (zennit's rules pass relevance where autograd passes
gradients) and multiplies it by the gate's mask, the concept's condition, before it goes on.

Two kinds of pass share one graph each:

- :meth:`.ConceptPasses.layer_pass`: the images forward, the targets' relevance back to the
  lowest gated layer (or to the input): each layer's relevance for the target;
- :meth:`.ConceptPasses.from_layer`: rows (an image per condition) forward to the layer, a
  given relevance there (a concept's share of the layer's relevance, one row per condition)
  back to the input, or to a lower gated layer.

The model is as it was afterwards: modules, hooks, flags, parameters, ``.grad``, also after
an exception (:func:`.concept_context`).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention_capture import has_attention
from ..base import NotApplicable
from ..checks import channel_hint
from ..hooks import preserved_state
from ..methods import LRP, check_canonical_output, restored_modules
from ..passes import budget_rows, timed_chunks

__all__ = [
    "ConceptPasses",
    "Gate",
    "Gates",
    "LayerPass",
    "LayerRecord",
    "Truncated",
    "concept_context",
    "row_chunks",
]


class Truncated(Exception):
    """Raised by a gate to end a forward pass at its layer."""


@dataclass(eq=False)
class LayerRecord:
    """What a gate saw in one pass: the layer's output (attached to the graph), the
    relevance that reached it, and the mask it applies."""

    name: str
    activation: Tensor | None = None
    gated: Tensor | None = None
    relevance: Tensor | None = None
    mask: Tensor | None = None
    calls: int = 0


class Gate(torch.autograd.Function):
    """A copy of a layer's output; backward, the relevance recorded and multiplied by the mask.

    The graph holds the record weakly: the record holds the gate's output, whose graph node
    would hold the record, a reference cycle that only the garbage collector's full
    collections free, which run by object counts, not memory: the passes' graphs piled up
    between them (an atlas's peak RSS was 1.8 GB after 1,000 images, 9.5 GB after 10,000)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, record: LayerRecord) -> Tensor:
        ctx.record = weakref.ref(record)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, relevance: Tensor) -> tuple[Tensor, None]:
        record = ctx.record()
        if record is None:  # the pass's gates are gone: a plain copy
            return relevance, None
        record.relevance = relevance
        return (relevance if record.mask is None else relevance * record.mask), None


class Gates:
    """Gates on ``layers`` ({name: module}) for the passes in the block, the last forward
    hooks of their modules (register the composite first); with ``stop``, the forward pass
    ends (:class:`.Truncated`) once that layer has run. Passes of other threads are left alone."""

    def __init__(self, layers: Mapping[str, nn.Module], stop: str | None = None):
        self.layers = dict(layers)
        self.stop = stop
        self.records = {name: LayerRecord(name) for name in self.layers}
        #: The records in the order their layers ran.
        self.ran: list[LayerRecord] = []
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.thread = threading.get_ident()

    def __enter__(self) -> Gates:
        try:
            for name, module in self.layers.items():
                self.handles.append(module.register_forward_hook(self._hook(self.records[name])))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def __getitem__(self, name: str) -> LayerRecord:
        return self.records[name]

    def _hook(self, record: LayerRecord) -> Callable:
        def hook(module: nn.Module, args, output):
            if threading.get_ident() != self.thread:
                return None
            record.calls += 1
            if record.calls > 1:
                raise ValueError(
                    f"layer {record.name!r} runs {record.calls} times in one forward pass (the module is reused), so "
                    "its relevance is ambiguous; pick a layer that runs once, such as the block that contains it"
                )
            if not isinstance(output, Tensor) or not output.is_floating_point():
                raise TypeError(f"layer {record.name!r} returns {type(output).__name__}; pick a layer with one tensor")
            record.activation = output
            record.gated = Gate.apply(output, record)
            self.ran.append(record)
            if record.name == self.stop:
                raise Truncated
            return record.gated

        return hook


@dataclass
class LayerPass:
    """What :meth:`.ConceptPasses.layer_pass` returns: per layer its activations and the
    targets' relevance (N, C, ...), the model output, and the input's relevance where asked."""

    activations: dict[str, Tensor]
    relevances: dict[str, Tensor]
    output: Tensor
    input_relevance: Tensor | None = None
    extra: dict = field(default_factory=dict)


@contextmanager
def concept_context(model: nn.Module) -> Iterator[None]:
    """Around a concept call: the model in eval mode with frozen parameters (holding its
    lock), gradients on even under ``torch.no_grad()`` or ``inference_mode``, and afterwards
    every module as it was (``explain.methods.relevance.restored_modules``)."""
    with ExitStack() as stack:
        stack.enter_context(preserved_state(model))
        stack.enter_context(restored_modules(model))
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        stack.enter_context(warnings.catch_warnings())
        # zennit announces the full backward hooks it replaces; they are undone after the call.
        warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook.*")
        yield


class ConceptPasses:
    """The two kinds of pass of CRP on ``model``, with the rules of ``lrp`` (an
    :class:`~explain.LRP`: its composite, epsilon, gamma and box bounds). Refuses models with
    attention layers (:class:`~explain.NotApplicable`), as LRP does."""

    def __init__(self, lrp: LRP):
        self.lrp = lrp
        self.model = lrp.model
        if has_attention(self.model):
            raise NotApplicable(
                "concept relevance runs LRP, whose rules here are for CNNs: none conserves relevance through "
                "attention (the softmax and the product of queries, keys and values); for a transformer, feature "
                "visualisation (explain.concepts.visualize) applies"
            )

    def layer_pass(
        self,
        images: Tensor,
        layers: Mapping[str, nn.Module],
        start: Callable[[Tensor], Tensor],
        *,
        reference: Tensor | None = None,
        to_input: bool = False,
    ) -> LayerPass:
        """``images`` forward with gates on ``layers``; ``start(output)``, the relevance at the
        output, back to the lowest gated layer (to the input with ``to_input``). Where a
        ``reference`` output (the plain model's) is given, the canonical model must match it."""
        model = self.model
        with self.lrp.registered(self.lrp.composite(model, images), model), Gates(layers) as gates:
            inputs = _leaf(images)
            with channel_hint(images):
                output = model(inputs)
            if not isinstance(output, Tensor):
                raise TypeError(
                    f"concept relevance needs a model that returns one tensor (logits), got {type(output).__name__}"
                )
            if reference is not None:
                check_canonical_output(output, reference, "CRP")
            missing = [name for name, record in gates.records.items() if record.gated is None]
            if missing:
                raise ValueError(f"layer(s) {missing} did not run in the forward pass; pick layers the model uses")
            lowest = gates.ran[0].activation
            assert lowest is not None  # set with gated, which every record has
            (gradient,) = torch.autograd.grad(
                output, inputs if to_input else lowest, grad_outputs=start(output.detach()).detach()
            )
            return LayerPass(
                activations={name: self._activation(record) for name, record in gates.records.items()},
                relevances={name: self._relevance(record) for name, record in gates.records.items()},
                output=output.detach(),
                input_relevance=gradient.detach() if to_input else None,
            )

    @staticmethod
    def _activation(record: LayerRecord) -> Tensor:
        assert record.activation is not None  # every gated layer ran
        return record.activation.detach()

    @staticmethod
    def _relevance(record: LayerRecord) -> Tensor:
        if record.relevance is None:
            raise ValueError(f"no relevance reached layer {record.name!r}: it does not lie on the path to the output")
        return record.relevance.detach()

    def from_layer(
        self,
        rows: Tensor,
        layer: tuple[str, nn.Module],
        relevance: Callable[[Tensor], Tensor],
        *,
        lower: Mapping[str, nn.Module] | None = None,
        masks: Mapping[str, Tensor] | None = None,
        record: str | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``rows`` (one image per condition) forward to ``layer`` (name, module), where the
        pass stops; ``relevance(activation)``, the relevance at the layer (rows, C, ...), back
        to the input, or to the lower gated layer ``record`` (one of ``lower``, whose gates
        apply ``masks``). Returns (the input's or ``record``'s relevance, the layer's activation)."""
        model, (name, module) = self.model, layer
        gated = {name: module, **(lower or {})}
        with self.lrp.registered(self.lrp.composite(model, rows), model), Gates(gated, stop=name) as gates:
            inputs = _leaf(rows)
            try:
                with channel_hint(rows):
                    model(inputs)
            except Truncated:
                pass
            top = gates[name]
            if top.gated is None or top.activation is None:
                raise ValueError(f"layer {name!r} did not run in the forward pass; pick a layer the model uses")
            for lower_name, mask in (masks or {}).items():
                gates[lower_name].mask = mask
            wrt = inputs if record is None else gates[record].activation
            if wrt is None:
                raise ValueError(f"layer {record!r} did not run before {name!r}; pick a layer below it")
            start = relevance(top.activation.detach())
            (gradient,) = torch.autograd.grad(top.gated, wrt, grad_outputs=start.detach())
            result = gradient if record is None else self._relevance(gates[record])
            return result.detach(), top.activation.detach()


def _leaf(images: Tensor) -> Tensor:
    """``images`` as a leaf that requires grad (zennit's rules hook a layer only where its
    input does), copied where they were made under ``torch.inference_mode()``."""
    return (images.clone() if images.is_inference() else images.detach()).requires_grad_()


def row_chunks(model: nn.Module, images: Tensor, total: int, given: int | None, key: Sequence = ()) -> Iterator[slice]:
    """Slices of ``total`` rows like ``images[:1]``, one inner batch each: ``given`` rows, or
    as many as the memory budget allows (:func:`~explain.passes.budget_rows`) at the fastest
    size measured on the concept passes themselves (:func:`~explain.passes.timed_chunks`,
    kept for the process per model, ``key`` and input): an LRP backward pass reruns every
    layer with modified weights, so its best batch is not the plain backward pass's."""
    if given is not None:
        sizes: Iterator[int] = iter([given] * -(-total // given))
    else:
        most = budget_rows(model, images, backward=True, total=total)
        shape = (*key, tuple(images.shape[1:]), images.dtype, str(images.device))
        sizes = timed_chunks(model, ("concepts", *shape), total, most)
    start = 0
    for size in sizes:
        yield slice(start, min(start + size, total))
        start += size
