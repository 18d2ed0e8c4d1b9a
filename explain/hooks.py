"""The hook engine: capture target layers' activations and the gradients that reach them.

Every explainer in the library runs the model through :class:`LayerCapture`. It pairs a
forward hook, which stores a layer's output, with a full backward hook, which stores the
gradient of a score with respect to that output, and it leaves the model exactly as it
found it: no hooks, the same train/eval flags, the same ``requires_grad`` flags and
untouched ``.grad``, whether the call succeeds or raises.

It is also cheap. Parameters are frozen for the call and the graph starts at the first
captured layer, so nothing before that layer is recorded by autograd and backward stops
there: an explanation costs about one forward pass. (A map made for a training loss,
``create_graph=True``, gives that up: it must be differentiable in the parameters.)
"""

from __future__ import annotations

import threading
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import overload

import torch
from torch import Tensor, nn

from .concurrency import model_lock

__all__ = ["WRAPPER_PREFIXES", "LayerCapture", "check_layers_ran", "preserved_state", "unwrapped"]


def check_layers_ran(wanted: Iterable[str], ran: Container[str]) -> None:
    """Raise a ``ValueError`` that names the fix where a layer of ``wanted`` is not in ``ran``
    (the layers a forward pass went through): a layer the model does not use at inference.

    >>> check_layers_ran(["layer4"], {"layer4": 1})
    >>> check_layers_ran(["aux"], {})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: layer(s) ['aux'] did not run in the forward pass; pick layers the model uses ...
    """
    missing = [name for name in wanted if name not in ran]
    if missing:
        raise ValueError(
            f"layer(s) {missing} did not run in the forward pass; pick layers the model uses "
            "at inference (`explain layers MODEL` lists them)"
        )


#: The attribute names under which wrappers hold the model: ``nn.DataParallel`` and
#: ``DistributedDataParallel`` (``module``), ``torch.compile`` (``_orig_mod``).
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def unwrapped(model: nn.Module) -> nn.Module:
    """The model inside ``nn.DataParallel``, ``nn.parallel.DistributedDataParallel`` and
    ``torch.compile`` wrappers (any nesting of them), or ``model`` itself.

    Explanations run through the wrapped model: its hooks fire on the caller's thread and
    device (``DataParallel`` runs replicas on threads of its own, whose passes the hook
    engine leaves alone; a compiled graph runs no module hooks), with the same parameters,
    so the maps are the model's. Names of its layers may keep the wrapper's prefix
    (``module.layer4``; see :func:`~explain.layers.resolve_layers`).

    >>> inner = nn.Linear(2, 2)
    >>> unwrapped(nn.DataParallel(inner)) is inner
    True
    """
    while True:
        inner = getattr(model, "module", None)
        if not isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            inner = getattr(model, "_orig_mod", None) if type(model).__name__ == "OptimizedModule" else None
        if not isinstance(inner, nn.Module):
            return model
        model = inner


@contextmanager
def preserved_state(model: nn.Module, *, freeze: bool = True, eval_mode: bool = True) -> Iterator[None]:
    """Run a block with ``model`` in eval mode and its parameters frozen, then restore both;
    the block holds the model's lock (:func:`~explain.concurrency.model_lock`), so that
    another thread's block on the same model neither interleaves with it nor restores flags
    it changed.

    Eval mode keeps batch-norm statistics and dropout out of the explanation (and keeps the
    running statistics unchanged); freezing means backward never touches ``param.grad`` and
    no graph is recorded before the first captured layer. A block that records no graph at
    all (under ``torch.no_grad()``) may pass ``freeze=False``: frozen weights make some of
    PyTorch's CPU kernels slower (a frozen ``nn.MultiheadAttention`` off its fast path
    projects with ``bmm``, 40 instead of 14 ms a layer on ViT-B/16 at batch 4). A block run
    as part of training passes ``eval_mode=False``: the model keeps its train/eval flags.

    >>> model = nn.Sequential(nn.Linear(2, 2), nn.Dropout()).train()
    >>> with preserved_state(model):
    ...     model.training, model[0].weight.requires_grad
    (False, False)
    >>> model.training, model[0].weight.requires_grad
    (True, True)
    """
    with model_lock(model):
        yield from _preserved(model, freeze, eval_mode)


def _preserved(model: nn.Module, freeze: bool, eval_mode: bool) -> Iterator[None]:
    training = [(module, module.training) for module in model.modules()]
    # Lazy modules' parameters do not exist yet; they cannot be frozen, nor need to be.
    # Inference tensors (a model built under torch.inference_mode()) could be frozen but
    # never unfrozen again outside that mode, so they are left alone.
    requires_grad = [
        (param, param.requires_grad)
        for param in model.parameters()
        if freeze and not isinstance(param, nn.parameter.UninitializedParameter) and not param.is_inference()
    ]
    # Only what differs is set (and set back): flags of large models cost ~1 ms to write.
    try:
        if eval_mode and any(flag for _, flag in training):
            model.eval()
        for param, flag in requires_grad:
            if flag:
                param.requires_grad_(False)
        yield
    finally:
        for module, flag in training:
            if module.training != flag:
                module.training = flag
        for param, flag in requires_grad:
            if param.requires_grad != flag:
                param.requires_grad_(flag)


class _GradientProbe(nn.Module):
    """An identity run right after a target layer; it carries the full backward hook.

    The hook cannot sit on the target layer itself: PyTorch wraps a hooked module's output
    in a view, and code that later changes that output in place (``out += identity`` in a
    ResNet block, ``ReLU(inplace=True)`` after a VGG conv) then fails. The probe's output is
    cloned before the rest of the network sees it, so in-place changes land on the clone and
    the stored activation keeps the value the layer produced.
    """

    def forward(self, x: Tensor) -> Tensor:
        return x


class LayerCapture:
    """Context manager that stores activations and gradients of named layers.

    Parameters
    ----------
    model:
        The network. It is put in eval mode with frozen parameters for the duration of the
        ``with`` block and restored afterwards.
    layers:
        Mapping of a display name to a submodule of ``model`` (see
        :func:`explain.layers.resolve_layers` to build it from names).
    gradients:
        Record a graph from the layers on so that :meth:`backward` can be called, also
        inside ``torch.no_grad()`` or ``torch.inference_mode()``. Set to ``False`` for
        gradient-free methods: the forward then runs without autograd.
    train_mode:
        Leave the model's train/eval flags as they are (batch norm and dropout behave as in
        training), instead of eval mode for the block.
    create_graph:
        Keep everything differentiable, for maps that enter a training loss: the parameters
        are not frozen, the graph is recorded from the input on, and :meth:`backward` builds
        the graph of the gradients it stores (``torch.autograd.grad(create_graph=True)``,
        which writes no ``.grad``).

    Examples
    --------
    >>> model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2))
    >>> x = torch.rand(1, 3, 8, 8)
    >>> with LayerCapture(model, {"conv": model[0]}) as capture:
    ...     logits = model(x)
    ...     capture.backward(logits[:, 1])
    >>> capture.activations["conv"].shape, capture.gradients["conv"].shape
    (torch.Size([1, 4, 6, 6]), torch.Size([1, 4, 6, 6]))
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Mapping[str, nn.Module],
        *,
        gradients: bool = True,
        train_mode: bool = False,
        create_graph: bool = False,
    ):
        if not layers:
            raise ValueError("LayerCapture needs at least one layer")
        self.model = model
        self.layers = dict(layers)
        self.track_gradients = gradients
        self.train_mode = train_mode
        self.create_graph = create_graph
        self.activations: dict[str, Tensor] = {}
        self.gradients: dict[str, Tensor] = {}
        self._calls: dict[str, int] = {}
        self._probes = {name: _GradientProbe() for name in self.layers}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._context: ExitStack | None = None
        self._thread: int | None = None

    def __enter__(self) -> LayerCapture:
        if self.track_gradients:
            frozen = [name for name, param in self.model.named_parameters() if param.is_inference()]
            if frozen:
                raise ValueError(
                    f"the model's parameters (e.g. {frozen[0]!r}) are inference tensors, which "
                    "autograd cannot use: build or load the model outside torch.inference_mode() "
                    "(torch.no_grad() is fine)"
                )
        with ExitStack() as context:  # undone at once if anything below fails
            if self.track_gradients:
                # The (small) graph after the target layers is recorded even when the caller
                # works under torch.no_grad() or torch.inference_mode().
                context.enter_context(torch.inference_mode(False))
                context.enter_context(torch.enable_grad())
            context.enter_context(
                preserved_state(self.model, freeze=not self.create_graph, eval_mode=not self.train_mode)
            )
            context.callback(self._remove_hooks)
            self._thread = threading.get_ident()
            # Call counts are per forward pass of the whole model.
            self._handles.append(self.model.register_forward_pre_hook(self._start_pass))
            for name, module in self.layers.items():
                self._handles.append(module.register_forward_pre_hook(self._count_call(name)))
                self._handles.append(module.register_forward_hook(self._store_activation(name)))
                if self.track_gradients:
                    self._handles.append(self._probes[name].register_full_backward_hook(self._store_gradient(name)))
            self._context = context.pop_all()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.close()

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _own_pass(self) -> bool:
        """Whether the running forward pass is this capture's: another thread's passes
        through the model (the user's own inference meanwhile) are left alone."""
        return threading.get_ident() == self._thread

    def _start_pass(self, module: nn.Module, args) -> None:
        if self._own_pass():
            self._calls.clear()

    def _count_call(self, name: str):
        def hook(module: nn.Module, args) -> None:
            if not self._own_pass():
                return
            self._calls[name] = self._calls.get(name, 0) + 1
            if self._calls[name] > 1:
                raise ValueError(
                    f"layer {name!r} runs {self._calls[name]} times in one forward pass (the module "
                    "is reused, or recomputed by checkpointing), so its activations are ambiguous; "
                    "pick a layer that runs once, such as the block that contains it"
                )

        return hook

    def _store_activation(self, name: str):
        def hook(module: nn.Module, args, output):
            if not self._own_pass():
                return None
            if not isinstance(output, Tensor):
                raise TypeError(
                    f"layer {name!r} returns {type(output).__name__}, not a tensor; pick a layer "
                    "whose output is a single tensor"
                )
            if any(
                isinstance(arg, Tensor) and arg.untyped_storage().data_ptr() == output.untyped_storage().data_ptr()
                for arg in args
            ):
                # The layer hands back (a view of) its input, which the caller may still
                # change in place: keep a copy of the value as it is now.
                output = output.clone()
            if not self.track_gradients:
                self.activations[name] = output.detach()
                return output.clone()
            if not output.is_floating_point():
                raise TypeError(f"layer {name!r} returns {output.dtype} values, which have no gradient")
            # The first captured layer starts the graph; later ones stay connected to it so
            # that gradients reach every captured layer in one backward pass.
            activation = output if output.requires_grad else output.detach().requires_grad_()
            self.activations[name] = activation
            return self._probes[name](activation).clone()

        return hook

    def _store_gradient(self, name: str):
        # The hook closes over the dict, not over self: the graph holds the hook, and self
        # holds the graph (its activations), a cycle through autograd's C++ nodes that
        # Python's garbage collector cannot see, which kept every call's graph alive.
        gradients = self.gradients

        def hook(module: nn.Module, grad_input, grad_output) -> None:
            gradients[name] = grad_output[0]

        return hook

    def reset(self) -> None:
        """Forget what the last forward pass stored, before running another one."""
        self.activations.clear()
        self.gradients.clear()
        self._calls.clear()

    @overload
    def backward(self, scores: Tensor) -> None: ...

    @overload
    def backward(self, scores: Tensor, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]: ...

    def backward(self, scores: Tensor, inputs: Sequence[Tensor] = ()) -> tuple[Tensor, ...] | None:
        """Back-propagate ``scores`` to the captured layers and store their gradients.

        ``scores`` holds one score per image (or is a scalar); images are independent in
        eval mode, so their sum yields each image's own gradient in one pass. (A model whose
        eval-mode output mixes the images of a batch, such as batch norm without running
        statistics, must be explained one image at a time.) The graph is kept, so
        ``backward`` can be called again for another target. Where ``inputs`` are given
        (tensors that require grad, such as the images, for methods that need the input
        gradient too), their gradients are returned.
        """
        if not self.track_gradients:
            raise RuntimeError("this LayerCapture was made with gradients=False")
        check_layers_ran(self.layers, self.activations)
        if not scores.requires_grad:
            raise ValueError(
                "the scores do not depend on the captured layers; check that the target "
                "layers lie on the path to the model's output"
            )
        self.gradients.clear()
        activations = [self.activations[name] for name in self.layers]
        # The probes' backward hooks fill self.gradients; autograd.grad only drives the pass
        # (and, unlike .backward(), accumulates nothing into any .grad).
        extra = tuple(inputs)
        grads = torch.autograd.grad(
            scores.sum(), [*extra, *activations], retain_graph=True, create_graph=self.create_graph, allow_unused=True
        )
        if self.create_graph:  # the gradients as autograd returns them, attached to their graph
            self.gradients.update(
                (n, g) for n, g in zip(self.layers, grads[len(extra) :], strict=True) if g is not None
            )
        unused = [name for name in self.layers if name not in self.gradients]
        if unused:
            raise ValueError(f"the scores do not depend on layer(s) {unused}; pick layers on the path to the output")
        if extra:
            return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(extra, grads, strict=False))
        return None
