"""Feature visualisation: the data-free reference of a concept, an image optimised to
activate it.

Olah et al., "Feature Visualization", Distill 2017: gradient ascent on the mean activation
of a channel (or a neuron, or a direction) over a batch of randomly transformed views of
the image, in a decorrelated Fourier parameterisation (``method="fourier"``); Fel et al.,
"Unlocking Feature Visualization for Deeper Networks with MAgnitude Constrained
Optimization", NeurIPS 2023: the phase alone, under a fixed natural magnitude spectrum, on
random crops with noise (``method="maco"``), which stays readable on deep CNNs and vision
transformers. See :mod:`explain.concepts.parameterization` for the images and views.

Objectives on a layer's output a (N, C, h, w), or a transformer's tokens read as that grid
(:class:`~explain.TokenLayout`): a channel c, mean_p a_c(p); a neuron (c, y, x), a_c(y, x);
a direction v, mean_p v . a(p). Each step runs every objective's views as one batch,
forward to the layer only (the layers above it are not needed), and back.

A unit that no view activates passes no gradient through its ReLU, and an image that
starts grey (the Fourier image does) may never activate it. As lucid does by default
(``render_vis(relu_gradient_override=True)``, ``redirected_relu_grad``), the ReLU modules'
backward pass is redirected while optimising (``redirect_relu=True``): for an image whose
ReLU passes no gradient at all, the gradient is let through wherever it would not push a
negative input lower (:class:`.RedirectedReLU`).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import positive_int
from ..concurrency import model_lock
from ..hooks import preserved_state
from ..layers import resolve_layers
from ..methods import mean_and_std
from ..passes import Passes, call_settings
from ..tokens import infer_layout
from .parameterization import FourierImage, MagnitudeImage, random_crops, robust_views
from .propagation import Gates, Truncated

__all__ = [
    "METHODS",
    "FeatureVisualization",
    "Objective",
    "RedirectedReLU",
    "check_objectives",
    "redirected_relus",
    "visualize",
]

#: The parameterisations: Olah et al.'s decorrelated Fourier image, and MaCo.
METHODS = ("fourier", "maco")


class RedirectedReLU(torch.autograd.Function):
    """The output of a ReLU on ``x``, whose backward pass is lucid's ``redirected_relu_grad``:
    per image, the ReLU's gradient (zero where x < 0); where that is zero everywhere, the
    incoming gradient g instead, except where x < 0 and g > 0 (gradient descent would push x
    lower still)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, output: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return output.clone()

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        negative = x < 0
        relu = torch.where(negative, torch.zeros_like(gradient), gradient)
        redirected = torch.where(negative & (gradient > 0), torch.zeros_like(gradient), gradient)
        flowing = relu.flatten(1).norm(dim=1) > 0
        return torch.where(flowing.view(-1, *(1,) * (x.dim() - 1)), relu, redirected), None


@contextlib.contextmanager
def redirected_relus(model: nn.Module) -> Iterator[None]:
    """The ``nn.ReLU`` modules of ``model`` with :class:`.RedirectedReLU`'s backward pass for
    this thread's passes in the block (an in-place ReLU works on a copy); hooks removed after."""
    thread, inputs = threading.get_ident(), {}

    def before(module: nn.Module, args):
        if threading.get_ident() != thread:
            return None
        inputs[module] = args[0]
        return (args[0].clone(),) if module.inplace else None

    def after(module: nn.Module, args, output):
        if threading.get_ident() != thread:
            return None
        return RedirectedReLU.apply(inputs.pop(module), output)

    handles = []
    try:
        for module in model.modules():
            if isinstance(module, nn.ReLU):
                handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class Objective:
    """What to maximise at a layer: a ``channel``'s mean activation, one neuron of it at
    ``position`` (y, x on the layer's grid), or the mean projection on a ``direction``."""

    channel: int = -1
    position: tuple[int, int] | None = None
    direction: Tensor | None = None

    @staticmethod
    def parse(spec) -> Objective:
        """A channel id, (channel, y, x), a direction (a 1-D float tensor) or an Objective.

        >>> Objective.parse(4), Objective.parse((4, 2, 3)).label
        (Objective(channel=4, position=None, direction=None), '4@(2, 3)')
        """
        if isinstance(spec, Objective):
            return spec
        if isinstance(spec, Tensor) and spec.is_floating_point() and spec.dim() == 1:
            return Objective(direction=spec.detach())
        if isinstance(spec, numbers.Integral) and not isinstance(spec, bool) and int(spec) >= 0:
            return Objective(channel=int(spec))
        if isinstance(spec, Sequence) and len(spec) == 3 and all(isinstance(v, numbers.Integral) for v in spec):
            return Objective(channel=int(spec[0]), position=(int(spec[1]), int(spec[2])))
        raise ValueError(
            f"an objective is a channel id, (channel, y, x) for a neuron, or a direction (a 1-D float tensor); "
            f"got {spec!r}"
        )

    @property
    def label(self) -> str:
        if self.direction is not None:
            return "direction"
        return f"{self.channel}" + (f"@{self.position}" if self.position else "")

    def __call__(self, grid: Tensor) -> Tensor:
        """(N,) the objective on a layer's output as a grid (N, C, h, w)."""
        if self.direction is not None:
            if self.direction.numel() != grid.shape[1]:
                raise ValueError(
                    f"the direction has {self.direction.numel()} values; the layer {grid.shape[1]} channels"
                )
            return torch.einsum("nc...,c->n...", grid, self.direction.to(grid)).flatten(1).mean(dim=1)
        if not 0 <= self.channel < grid.shape[1]:
            raise ValueError(f"channel {self.channel} out of range: the layer has {grid.shape[1]} channels")
        if self.position is None:
            return grid[:, self.channel].flatten(1).mean(dim=1)
        y, x = self.position
        if not (0 <= y < grid.shape[2] and 0 <= x < grid.shape[3]):
            raise ValueError(f"position {self.position} lies off the layer's {tuple(grid.shape[2:])} grid")
        return grid[:, self.channel, y, x]


@dataclass(frozen=True)
class FeatureVisualization:
    """Images that maximise objectives: ``images`` (K, 3, H, W) in [0, 1], one per objective
    (``labels``); ``values`` (K,) each objective on its image seen whole (resized to the
    model's input); ``history`` (steps, K) the mean objective over the views at each step;
    ``transparency`` (K, 1, H, W), MaCo's accumulated ``|gradient|`` of the image (None for
    ``fourier``), which shows where the image matters."""

    layer: str
    method: str
    labels: tuple[str, ...]
    images: Tensor
    values: Tensor
    history: Tensor
    transparency: Tensor | None = None

    def figure(self, columns: int | None = None):
        """A matplotlib figure of the images, titled by objective."""
        import matplotlib.pyplot as plt

        columns = columns or min(len(self.labels), 6)
        rows = -(-len(self.labels) // columns)
        figure, axes = plt.subplots(
            rows, columns, figsize=(2.2 * columns, 2.4 * rows), squeeze=False, layout="constrained"
        )
        for axis in axes.flat:
            axis.axis("off")
        for axis, label, image in zip(axes.flat, self.labels, self.images, strict=False):
            axis.imshow(image.permute(1, 2, 0).cpu().numpy())
            axis.set_title(f"{self.layer}:{label}", fontsize=8)
        return figure


def visualize(
    model: nn.Module,
    layer: str | nn.Module,
    objectives,
    *,
    method: str = "fourier",
    size: int | tuple[int, int] | None = None,
    input_size: int | tuple[int, int] | None = None,
    steps: int = 256,
    views: int | None = None,
    lr: float | None = None,
    magnitude: Tensor | None = None,
    normalization=None,
    redirect_relu: bool = True,
    seed: int = 0,
    max_memory=None,
    progress=None,
) -> FeatureVisualization:
    """Images that maximise ``objectives`` (one or a list: a channel id, (channel, y, x), a
    direction) at ``layer`` of ``model``: ``steps`` of gradient ascent, every objective's
    ``views`` transformed copies (``fourier``: padded, jittered, scaled, rotated; 8 by
    default) or random crops (``maco``: 32 by default) in one batch per step.

    ``input_size`` is what the model takes (default 224, or what a timm model says);
    ``size`` the optimised image's (default: the input size for ``fourier``, 512 / 224 of it
    for ``maco``, whose crops are resized to the input). ``lr``: Adam's step (0.05,
    lucent's) for ``fourier``, NAdam's (1.0, MaCo's) for ``maco``. ``magnitude``: MaCo's
    spectrum (see :func:`~explain.concepts.natural_magnitude`; the 1 / f
    power law by default). Views are normalised by ``normalization`` (mean, std; default: a
    timm model's, else ImageNet's) before the model. ``redirect_relu``: the ReLUs' gradient
    redirected while optimising (see :mod:`explain.concepts.visualization`). Seeded; the
    model is left as it was.
    """
    if method not in METHODS:
        raise ValueError(f"method is one of {', '.join(METHODS)}, got {method!r}")
    ((name, module),) = resolve_layers(model, layer).items()
    specs = objectives if isinstance(objectives, list) else [objectives]
    goals = [Objective.parse(spec) for spec in specs]
    settings = _settings(model, method, size, input_size, views, lr)
    steps = positive_int("steps", steps)
    device = next(iter(model.parameters()), torch.zeros(())).device
    generator = torch.Generator(device=device).manual_seed(int(seed))
    height, width = settings["size"]
    image: FourierImage | MagnitudeImage
    if method == "fourier":
        image = FourierImage(len(goals), height, width, generator=generator, device=device)
    else:
        image = MagnitudeImage(len(goals), height, width, magnitude=magnitude, generator=generator, device=device)
    mean, std = (t.to(device).view(1, -1, 1, 1) for t in mean_and_std(model, normalization))
    run = _Ascent(model, (name, module), goals, lambda x: (x - mean) / std, settings, generator)
    with (
        model_lock(model),
        call_settings(max_memory, progress),
        preserved_state(model),
        torch.inference_mode(False),
        torch.enable_grad(),
    ):
        with redirected_relus(model) if redirect_relu else contextlib.nullcontext():
            history, transparency = run.optimise(image, steps)
        final = image().detach()
        with torch.no_grad():
            values = run.values(final)
    return FeatureVisualization(
        name, method, tuple(g.label for g in goals), final, values, history, transparency if method == "maco" else None
    )


def check_objectives(
    model: nn.Module, layer: str | nn.Module, objectives, *, input_size=None, normalization=None
) -> tuple[int, int, int]:
    """The grid (C, h, w) that :func:`.visualize` reads ``objectives`` on at ``layer``, from
    one forward pass of a grey image (to the layer only, without gradients): a ``ValueError``
    that names the mistake where an objective does not fit the layer (a channel out of range,
    a neuron off its grid, a direction of another length), the layer does not run, or its
    output cannot be read as a grid. What a caller checks before it spends steps on them."""
    ((name, module),) = resolve_layers(model, layer).items()
    specs = objectives if isinstance(objectives, list) else [objectives]
    goals = [Objective.parse(spec) for spec in specs]
    settings = _settings(model, "fourier", None, input_size, None, None)
    device = next(iter(model.parameters()), torch.zeros(())).device
    mean, std = (t.to(device).view(1, -1, 1, 1) for t in mean_and_std(model, normalization))
    run = _Ascent(model, (name, module), goals, lambda x: (x - mean) / std, settings, None)
    grey = torch.full((1, 3, *settings["input_size"]), 0.5, device=device)
    with model_lock(model), preserved_state(model), torch.no_grad():
        grid = run.layer_grid(run.normalise(grey))
    for goal in goals:
        goal(grid)
    return int(grid.shape[1]), int(grid.shape[2]), int(grid.shape[3])


def _settings(model: nn.Module, method: str, size, input_size, views, lr) -> dict:
    """The sizes, views and step of a call, defaults filled in."""
    if input_size is None:
        config = getattr(model, "pretrained_cfg", None) or {}
        input_size = tuple(config.get("input_size", (3, 224, 224))[1:])
    input_size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    if size is None:
        size = input_size if method == "fourier" else tuple(math.ceil(s * 512 / 224) for s in input_size)
    size = (size, size) if isinstance(size, int) else tuple(size)
    return {
        "method": method,
        "size": (positive_int("size", size[0]), positive_int("size", size[1])),
        "input_size": (positive_int("input_size", input_size[0]), positive_int("input_size", input_size[1])),
        "views": positive_int("views", views if views is not None else 8 if method == "fourier" else 32),
        "lr": float(lr if lr is not None else 0.05 if method == "fourier" else 1.0),
    }


class _Ascent:
    """The optimisation loop of :func:`.visualize`."""

    def __init__(self, model, layer, goals, normalise: Callable[[Tensor], Tensor], settings: dict, generator):
        self.model, self.layer, self.goals, self.normalise = model, layer, goals, normalise
        self.settings, self.generator = settings, generator

    def layer_grid(self, inputs: Tensor) -> Tensor:
        """The layer's output for ``inputs``, as a grid (N, C, h, w); the pass stops there."""
        name, module = self.layer
        with Gates({name: module}, stop=name) as gates, contextlib.suppress(Truncated):
            self.model(inputs)
        output = gates[name].activation
        if output is None:
            raise ValueError(f"layer {name!r} did not run in the forward pass; pick a layer the model uses")
        if output.dim() == 2:  # a dense layer's units: a 1 x 1 grid
            return output[:, :, None, None]
        if output.dim() == 4 and output.shape[-1] * output.shape[-2] < 2:
            return output
        return infer_layout(tuple(output.shape), tuple(inputs.shape[2:]), self.model, name).to_spatial(output)

    def scores(self, views: Tensor, copies: int) -> Tensor:
        """(K,) each objective's mean over its ``copies`` views (rows in objective order)."""
        grid = self.layer_grid(self.normalise(views))
        per_goal = grid.unflatten(0, (len(self.goals), copies))
        return torch.stack([goal(rows).mean() for goal, rows in zip(self.goals, per_goal, strict=True)])

    def views(self, images: Tensor, step: int, steps: int) -> Tensor:
        copies, size = self.settings["views"], self.settings["input_size"]
        if self.settings["method"] == "fourier":
            return robust_views(images, copies, size, self.generator)
        box = 0.5 + (0.05 - 0.5) * step / max(steps - 1, 1)  # MaCo's box size: 50 % down to 5 %
        return random_crops(images, copies, size, self.generator, box=box, noise=0.08)

    def optimise(self, image, steps: int) -> tuple[Tensor, Tensor | None]:
        optimiser_class = torch.optim.Adam if self.settings["method"] == "fourier" else torch.optim.NAdam
        optimiser = optimiser_class(image.parameters(), lr=self.settings["lr"])
        history, transparency = [], None
        with Passes("visualize", steps * len(self.goals) * self.settings["views"]) as passes:
            for step in range(steps):
                pixels = image()
                scores = self.scores(self.views(pixels, step, steps), self.settings["views"])
                optimiser.zero_grad()
                (gradient,) = torch.autograd.grad(-scores.sum(), pixels, retain_graph=True)
                pixels.backward(gradient)
                optimiser.step()
                history.append(scores.detach())
                magnitude = gradient.abs().sum(dim=1, keepdim=True)
                transparency = magnitude if transparency is None else transparency + magnitude
                passes.advance(len(self.goals) * self.settings["views"])
        return torch.stack(history), transparency

    def values(self, images: Tensor) -> Tensor:
        """(K,) each objective on its image, resized to the model's input."""
        resized = torch.nn.functional.interpolate(
            images, size=self.settings["input_size"], mode="bilinear", align_corners=False
        )
        grid = self.layer_grid(self.normalise(resized))
        return torch.stack([goal(grid[k : k + 1])[0] for k, goal in enumerate(self.goals)])
