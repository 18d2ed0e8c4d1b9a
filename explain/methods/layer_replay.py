"""Run only the part of a model that comes after one layer, on new values of that layer's output.

Perturbation CAMs such as Ablation-CAM change a layer's activation once per channel and need
the model's output for each change. Running the whole model each time repeats the layers
before the target, which do not change: :class:`LayerReplay` runs them once and replays the
rest.

The split uses torch.fx. The model is traced with every module that does not contain the
target layer kept whole (a leaf), so only the forward code of the layer's ancestors (the
model, the stage, the block) must be traceable, which holds for torchvision's and timm's
CNNs. What the rest of the network needs from before the layer (a residual branch's input,
say) is recorded in one pass and repeated for each replayed row. Before it is used, the
replay is checked against the model's own output, on the images in another order and
another batch size; where tracing fails or the check does not pass, every replay is a whole
forward pass with the layer's output replaced (``reason`` says why).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import suppress

import torch
import torch.fx as fx
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from .affine import is_affine, split_affine
from .cam_base import map_tensors

__all__ = ["LayerReplay"]


class _Done(Exception):
    """Stops the recording pass once everything the replay needs is known."""


class _SplitTracer(fx.Tracer):
    def __init__(self, ancestors: set[int]):
        super().__init__()
        self.ancestors = ancestors

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return id(module) not in self.ancestors


class _Recorder(fx.Interpreter):
    """Runs the traced model and keeps the values of ``wanted`` nodes, then stops."""

    def __init__(self, module: fx.GraphModule, wanted: list[fx.Node]):
        super().__init__(module)
        self.wanted = set(wanted)
        self.values: dict[fx.Node, object] = {}

    def run_node(self, node: fx.Node):
        value = super().run_node(node)
        if node in self.wanted:
            self.values[node] = value
            if len(self.values) == len(self.wanted):
                raise _Done
        return value


def _close(a, b) -> bool:
    left, _ = tree_flatten(a)
    right, _ = tree_flatten(b)
    if len(left) != len(right):
        return False
    for x, y in zip(left, right, strict=True):
        if isinstance(x, Tensor) != isinstance(y, Tensor):
            return False
        if isinstance(x, Tensor):
            if x.shape != y.shape:
                return False
            x, y = x.float(), y.float()
            scale = float(y.abs().max()) if y.numel() else 0.0
            if not torch.allclose(x, y, rtol=1e-4, atol=1e-5 * max(scale, 1.0)):
                return False
    return True


class LayerReplay:
    """The layers after ``layer_name``, as a function of that layer's output.

    Call :meth:`prepare` once per batch of images (inside ``torch.inference_mode()`` and
    with the model in eval mode), then call the instance on activations for any rows of
    that batch, as often as needed.
    """

    def __init__(self, model: nn.Module, layer_name: str):
        self.model = model
        self.layer_name = layer_name
        self.layer = model.get_submodule(layer_name)
        self.reason: str | None = None
        self._warned = False
        self._split: tuple[fx.GraphModule, fx.GraphModule, list[fx.Node]] | None = None
        self._frontier: list[Tensor] = []
        self._images: Tensor | None = None
        self._dtype = torch.float32
        try:
            self._split = self._build()
        except Exception as error:  # untraceable code: replay by whole forward passes instead
            self.reason = f"the model could not be split at {layer_name!r} ({type(error).__name__}: {error})"

    @property
    def split(self) -> bool:
        """Whether replays run only the layers after the target (else whole forward passes)."""
        return self._split is not None and self.reason is None

    @property
    def affine(self) -> bool:
        """Whether the layers after the target are affine in its output (for the model's
        present train/eval mode: batch norm counts only in eval), so that the output of any
        weighted sum of activations follows from the outputs of its terms
        (:func:`~explain.methods.affine.is_affine`)."""
        return self.split and self._split is not None and is_affine(self._split[1], "activation")

    def affine_start(self) -> tuple[Callable, Callable] | None:
        """Where the layers after the target start with operations affine in its output and
        go on with others (a convolution and batch norm, then a ReLU): ``(head, rest)``,
        ``head(activations, rows)`` the values that start passes on (a tuple, each affine in
        the activations) and ``rest(values, rows)`` the model output from them (it may change
        the values in place, as an in-place ReLU does)
        (:func:`~explain.methods.affine.split_affine`). None where there is no such start,
        or the replay is not split."""
        if not self.split or self._split is None:
            return None
        parts = split_affine(self._split[1], "activation")
        if parts is None:
            return None
        head, rest = parts

        def run_head(activations: Tensor, rows: Tensor):
            return head(activations.to(self._dtype, copy=True), *(value[rows] for value in self._frontier))

        def run_rest(values, rows: Tensor):
            return rest(*values, *(value[rows] for value in self._frontier))

        return run_head, run_rest

    def _build(self) -> tuple[fx.GraphModule, fx.GraphModule, list[fx.Node]]:
        parts = self.layer_name.split(".")
        ancestors = {id(self.model)} | {id(self.model.get_submodule(".".join(parts[:i]))) for i in range(1, len(parts))}
        graph = _SplitTracer(ancestors).trace(self.model)
        full = fx.GraphModule(self.model, graph)
        nodes = list(graph.nodes)
        calls = [n for n in nodes if n.op == "call_module" and n.target == self.layer_name]
        if len(calls) != 1:
            raise ValueError(f"the layer is called {len(calls)} times in the traced forward")
        (layer_node,) = calls
        after = {layer_node}
        for node in nodes[nodes.index(layer_node) + 1 :]:
            if any(source in after for source in node.all_input_nodes):
                after.add(node)
        output = next(n for n in nodes if n.op == "output")
        if output not in after:
            raise ValueError("the model output does not depend on the layer")
        varying = set()  # nodes that depend on the model input
        for node in nodes:
            if node.op == "placeholder" or any(source in varying for source in node.all_input_nodes):
                varying.add(node)
        # what the tail reads from before the layer (the layer's own input only where a later
        # node reads it too: the tail starts from the layer's output)
        frontier = [
            n
            for n in nodes
            if n not in after and n in varying and any(user in after and user is not layer_node for user in n.users)
        ]

        tail = fx.Graph()
        env = {layer_node: tail.placeholder("activation")}
        for i, node in enumerate(frontier):
            env[node] = tail.placeholder(f"before_{i}")

        def copy(node: fx.Node) -> fx.Node:
            if node not in env:  # a constant: computed again in the tail
                for source in node.all_input_nodes:
                    copy(source)
                env[node] = tail.node_copy(node, lambda n: env[n])
            return env[node]

        for node in nodes:
            if node in after and node is not layer_node:
                for source in node.all_input_nodes:
                    copy(source)
                env[node] = tail.node_copy(node, lambda n: env[n])
        return full, fx.GraphModule(self.model, tail), [layer_node, *frontier]

    def prepare(self, images: Tensor, activation: Tensor, reference) -> None:
        """Record what the replay needs for ``images``, whose layer output is ``activation``
        and whose model output is ``reference``, and check the replay against it."""
        self._images = images
        self._frontier = []
        self._dtype = images.dtype  # the model's, which check_images made the images'
        if self._split is None:
            self._warn()
            return
        full, _, wanted = self._split
        recorder = _Recorder(full, wanted)
        # record where the tail reads values from before the layer, or where the caller's
        # activation may not be the layer's own (another dtype: a float32 copy of a bf16 layer)
        if len(wanted) > 1 or not isinstance(activation, Tensor) or activation.dtype != images.dtype:
            with suppress(_Done):
                recorder.run(images)
        layer_value = recorder.values.get(wanted[0], activation)
        if not isinstance(layer_value, Tensor):
            self.reason = f"layer {self.layer_name!r} does not return a tensor"
            self._warn()
            return
        self._dtype = layer_value.dtype
        n = images.shape[0]
        frontier = [recorder.values[node] for node in wanted[1:]]
        if not all(isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == n for v in frontier):
            self.reason = "a value the later layers take from before the layer is not one row per image"
            self._warn()
            return
        self._frontier = [value for value in frontier if isinstance(value, Tensor)]  # (all of them)
        self.reason = None
        rows = torch.cat([torch.arange(n - 1, -1, -1), torch.zeros(1, dtype=torch.long)]).to(images.device)
        same = _close(self(activation, torch.arange(n, device=images.device)), reference)
        reordered = _close(self(activation[rows], rows), map_tensors(lambda tensor: tensor[rows], reference))
        if not (same and reordered):
            self.reason = "replaying the later layers did not reproduce the model's output"
            self._frontier = []
        self._warn()

    def _warn(self) -> None:
        if self.reason is not None and not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.reason}; each replay runs the whole model instead (slower, same result)",
                RuntimeWarning,
                stacklevel=4,
            )

    def __call__(self, activations: Tensor, rows: Tensor):
        """The model output for images ``rows`` (of the prepared batch) with the layer's
        output replaced by ``activations`` (one per row)."""
        # A copy: the later layers may change their input in place (ReLU(inplace=True), +=).
        activations = activations.to(self._dtype, copy=True)
        if self.split:
            assert self._split is not None  # (split)
            _, tail, _ = self._split
            return tail(activations, *(value[rows] for value in self._frontier))
        assert self._images is not None, "prepare() the images first"
        handle = self.layer.register_forward_hook(lambda module, args, output: activations)
        try:
            return self.model(self._images[rows])
        finally:
            handle.remove()
