"""Layer and neuron attributions: how the units of a hidden layer take part in the explained
score, or which pixels make one unit fire, computed by captum.

- :class:`LayerIntegratedGradients`: Integrated Gradients in the layer's activation space;
- :class:`LayerConductance`: the flow of the score through each unit along the input path;
- :class:`InternalInfluence`: the gradient at the layer averaged along the input path;
- :class:`LayerGradientXActivation`: the layer's activation times its gradient.

Each explains through one ``target_layer``, picked as the CAMs pick theirs by default
(:func:`~explain.find_target_layer`). Without ``neuron``, ``raw`` holds the attributions of
the layer's units on its grid, (N, C, h, w) (the patch tokens of a vision transformer's layer
as a grid, as the CAMs read them), and ``maps`` are their channels reduced (``reduction``),
upsampled bilinearly to the input as the CAMs' maps are (``resolution="input"``, the
default: what overlays, metrics and the command line take) or left on the layer's grid
(``resolution="layer"``: (N, h, w) maps, which the metrics refuse). With ``neuron=c`` (channel
``c``, its activation summed over the positions) or ``neuron=(c, i, j)`` (one unit; ``(c, l)``
on signals, ``(c, d, i, j)`` on volumes), the attributions are of the input, (N, C, H, W), to
that neuron's activation, which is then the explained score in place of a class (the
explanation's targets are ``-1``); :class:`LayerConductance` with ``neuron`` explains the class
score through that neuron, as its paper defines neuron conductance.

Steps along the path run in inner batches of at most ``internal_batch_size`` rows, by
default sized from the memory budget.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import ClassVar

import captum.attr as captum_attr
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import register
from ..checks import channel_hint, check_images, interpolation_mode, positive_int
from ..explanation import Explanation
from ..hooks import LayerCapture, check_layers_ran
from ..layers import LayerSpec, find_target_layer, resolve_layers
from ..passes import advance
from ..targets import CUSTOM_TARGET, Targets
from .attribution_base import (
    Batched,
    ScoredModel,
    WithBaseline,
    attribute_in_groups,
    normalize_maps,
    reduce_channels,
)
from .cam_base import check_image_rows, layer_layout
from .captum_adapter import path_points
from .path_attribution import QUADRATURES

__all__ = [
    "RESOLUTIONS",
    "InternalInfluence",
    "LayerConductance",
    "LayerGradientXActivation",
    "LayerIntegratedGradients",
    "NeuronSelector",
]

#: Where the maps of layer attributions lie: upsampled to the input, or on the layer's grid.
RESOLUTIONS = ("input", "layer")

Neuron = int | tuple[int, ...]


def checked_neuron(neuron) -> Neuron | None:
    """``neuron=`` checked: None, a channel index, or a tuple of a channel and a position."""
    if neuron is None:
        return None
    if isinstance(neuron, int) and not isinstance(neuron, bool) and neuron >= 0:
        return neuron
    if (
        isinstance(neuron, Sequence)
        and len(neuron) >= 2
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in neuron)
    ):
        return tuple(neuron)
    raise ValueError(
        f"neuron must be a channel index (an int >= 0) or a channel and a position, such as (c, i, j) on an "
        f"image's layer; got {neuron!r}"
    )


class NeuronSelector:
    """captum's ``neuron_selector`` for ``neuron=``: from the output (B, ...) of layer
    ``name``, in its own layout (tokens, channels-last), the neuron's activation (B,): a
    channel's summed over its positions, or one unit's.

    >>> select = NeuronSelector(1, nn.Identity(), "", torch.zeros(1, 3, 4, 4))
    >>> select(torch.arange(16.0).view(1, 1, 4, 4).repeat(1, 2, 1, 1)).tolist()
    [120.0]
    """

    def __init__(self, neuron: Neuron, model: nn.Module, name: str, images: Tensor):
        self.neuron, self.model, self.name, self.images = neuron, model, name, images[:1]

    def grid(self, output: Tensor) -> Tensor:
        """The layer's output as its (B, C, h, w) grid, checked to hold the neuron."""
        grid = layer_layout(None, self.model, self.name, output, self.images).to_spatial(output)
        index = (self.neuron,) if isinstance(self.neuron, int) else self.neuron
        if len(index) not in (1, grid.dim() - 1) or any(
            i >= size for i, size in zip(index, grid.shape[1:], strict=False)
        ):
            shown = " x ".join(map(str, grid.shape[2:]))
            raise ValueError(
                f"neuron={self.neuron!r} is not in layer {self.name!r}, whose grid holds {grid.shape[1]} channels of "
                f"{shown}: give a channel below {grid.shape[1]}, or a channel and a position ({grid.dim() - 1} indices)"
            )
        return grid

    def __call__(self, output: Tensor) -> Tensor:
        grid = self.grid(output)
        if isinstance(self.neuron, int):
            return grid[:, self.neuron].flatten(1).sum(1)
        unit: tuple[slice | int, ...] = (slice(None), *self.neuron)
        return grid[unit]


@contextmanager
def probed(layer: nn.Module) -> Iterator[nn.Module]:
    """An identity module run on ``layer``'s output for the block, for captum to hook in the
    layer's place. Its output is cloned before the rest of the network sees it, so code that
    changes the layer's output in place (``out += identity`` after a ResNet block's last batch
    norm, ``ReLU(inplace=True)``) changes the clone, even where captum replaces the probe's
    output with a leaf tensor of its own (layer Integrated Gradients' interpolated activations)."""
    probe = nn.Identity()
    handle = layer.register_forward_hook(lambda module, args, output: probe(output).clone())
    try:
        yield probe
    finally:
        handle.remove()


class _ThroughLayer(Batched):
    """An attribution through one target layer: of its units, or of the input to one neuron."""

    family = "layer attribution"
    needs_layer = True
    #: Whether ``neuron=`` explains the class score through the neuron (conductance) rather
    #: than the neuron's activation.
    neuron_explains_class: ClassVar[bool] = False
    #: What ``neuron=`` attributes, in one line, as the guide's table of layer methods shows it.
    neuron_formula: ClassVar[str] = ""

    def __init__(
        self, model: nn.Module, target_layer: LayerSpec = None, *, neuron=None, resolution: str = "input", **options
    ):
        super().__init__(model, **options)
        self.neuron = checked_neuron(neuron)
        if resolution not in RESOLUTIONS:
            raise ValueError(f"unknown resolution {resolution!r}; use one of {', '.join(RESOLUTIONS)}")
        if self.neuron is not None and resolution != "input":
            raise ValueError("with neuron=, the attributions are of the input: resolution='layer' does not apply")
        self.resolution = resolution
        self._layer: tuple[str, nn.Module] | None = None
        if target_layer is not None:
            layers = resolve_layers(model, target_layer)
            if len(layers) != 1:
                raise ValueError(f"{self.name} explains through one target layer; got {len(layers)}: {list(layers)}")
            self._layer = next(iter(layers.items()))

    @property
    def explains_class(self) -> bool:
        """Whether a call explains class targets (else: the neuron's activation, and takes none)."""
        return self.neuron is None or self.neuron_explains_class

    def target_layer(self, images: Tensor) -> tuple[str, nn.Module]:
        """The layer's name and module; the automatic choice is made once, on ``images[:1]``."""
        if self._layer is None:
            name = find_target_layer(self.model, images[:1])
            self._layer = (name, self.model.get_submodule(name))
        return self._layer

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return ("input",) if self.neuron is not None else (self.target_layer(images)[0],)

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        """Explain ``targets`` as every attribution does; with ``neuron=`` (but for
        conductance), the neuron's activation, and no targets."""
        self._check_no_targets(targets, topk)
        return super()._explain(images, targets, topk=topk)

    def _check_no_targets(self, targets: Targets, topk: int | None) -> None:
        if not self.explains_class and (targets is not None or topk is not None):
            raise ValueError(
                f"{self.name} with neuron= explains that neuron's activation, not a class: pass no targets nor topk "
                "(layer-conductance with neuron= explains a class through the neuron)"
            )

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        name, module = self.target_layer(images)
        with probed(module) as probe:
            if self.neuron is not None:
                select = NeuronSelector(self.neuron, self.model, name, images)
                return self.neuron_attribution(scored, images, k, probe, select)
            attributions = self.layer_attribution(scored, images, k, probe)
        return layer_layout(None, self.model, name, attributions, images).to_spatial(attributions)

    def layer_attribution(self, scored: ScoredModel, images: Tensor, k: int, layer: nn.Module) -> Tensor:
        """Attributions of target ``k`` to the layer's units, in the layer's own layout."""
        raise NotImplementedError

    def neuron_attribution(
        self, scored: ScoredModel, images: Tensor, k: int, layer: nn.Module, select: NeuronSelector
    ) -> Tensor:
        """Attributions (N, C, H, W) of the input to the neuron ``select`` picks."""
        raise NotImplementedError

    def explanation(self, raw: Tensor, scored: ScoredModel) -> Explanation:
        if self.neuron is not None:
            explanation = super().explanation(raw, scored)
            if self.neuron_explains_class:
                return explanation
            return replace(explanation, targets=torch.full_like(explanation.targets, CUSTOM_TARGET))
        assert self._layer is not None and scored.output is not None  # resolved by the call
        spatial = raw.dim() - 2 - (scored.resolved_ids.dim() - 1)
        reduced = reduce_channels(raw, self.reduction, spatial)
        if self.resolution == "input":
            grid = reduced.reshape(-1, 1, *reduced.shape[-spatial:]).float()
            size = scored.input_size
            upsampled = F.interpolate(grid, size=size, mode=interpolation_mode(spatial), align_corners=False)
            reduced = upsampled.reshape(*reduced.shape[:-spatial], *size)
        maps = normalize_maps(reduced, self.clip_percentile, spatial)
        return Explanation(
            maps.float(),
            {self._layer[0]: raw},
            scored.output,
            scored.resolved_ids,
            self.name,
            self.class_names,
            signed=self.reduction == "sum" and not self.nonnegative,
        )

    def check(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> None:
        """Also run the model once through the layer: it must run once per pass and return
        one tensor, with more than one location, that holds ``neuron``."""
        images = check_images(images, self.model)
        self.check_applies(images)
        name, module = self.target_layer(images)
        with LayerCapture(self.model, {name: module}, gradients=False) as capture, channel_hint(images):
            self.model(images[:1])
        check_layers_ran([name], capture.activations)
        check_image_rows(name, capture.activations[name], images[:1])
        layer_layout(None, self.model, name, capture.activations[name], images[:1])  # raises where no grid fits
        if self.neuron is not None:
            NeuronSelector(self.neuron, self.model, name, images).grid(capture.activations[name])
        self._check_no_targets(targets, topk)
        if self.explains_class:
            super().check(images, targets, topk=topk)


class _AlongPath(_ThroughLayer, WithBaseline):
    """A layer attribution integrated along the straight path from a baseline to the image."""

    cost = "1 forward + {n_steps} forward + backward"

    def __init__(self, model: nn.Module, target_layer: LayerSpec = None, *, n_steps: int = 50, **options):
        super().__init__(model, target_layer, **options)
        self.n_steps = positive_int("n_steps", n_steps)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_steps)

    def path_groups(self, images: Tensor, points: int) -> tuple[int, list[slice]]:
        """Rows per inner batch, and the groups of images that captum runs together (captum
        runs at least all the images it is given in each pass: fewer rows than ``points``
        path points per image, the images go in groups)."""
        rows = self.rows(images, len(images) * points)
        step = max(1, rows // 2) if points > self.n_steps else rows  # conductance: two points at least
        return rows, [slice(i, i + step) for i in range(0, len(images), step)]


class _Quadrature(_AlongPath):
    """A path integral by one of captum's quadratures (``method``, Gauss-Legendre by default):
    of the layer's units by ``captum_method``, of a neuron by captum's NeuronIntegratedGradients."""

    #: captum's layer attribution that integrates along the path.
    captum_method: ClassVar[type]
    #: Whether a neuron's integral is multiplied by (x - x') (Integrated Gradients) or not.
    multiply_by_inputs: ClassVar[bool]

    def __init__(self, model: nn.Module, target_layer: LayerSpec = None, *, method: str = "gausslegendre", **options):
        super().__init__(model, target_layer, **options)
        if method not in QUADRATURES:
            raise ValueError(f"unknown method {method!r}; use one of {', '.join(QUADRATURES)}")
        self.method = method

    def layer_attribution(self, scored: ScoredModel, images: Tensor, k: int, layer: nn.Module) -> Tensor:
        rows, groups = self.path_groups(images, self.n_steps)
        baselines, target = self.baselines(scored, images), scored.target(k)
        method = self.captum_method(scored, layer)
        return attribute_in_groups(
            method,
            images,
            baselines,
            target,
            groups,
            n_steps=self.n_steps,
            method=self.method,
            internal_batch_size=rows,
        )

    def neuron_attribution(self, scored, images, k, layer, select) -> Tensor:
        """captum's NeuronIntegratedGradients of the neuron, times (x - x') where
        ``multiply_by_inputs``."""
        rows, groups = self.path_groups(images, self.n_steps)
        baselines = self.baselines(scored, images)
        method = captum_attr.NeuronIntegratedGradients(scored, layer, multiply_by_inputs=self.multiply_by_inputs)
        return attribute_in_groups(
            method,
            images,
            baselines,
            None,
            groups,
            select,
            n_steps=self.n_steps,
            method=self.method,
            internal_batch_size=rows,
        )


@register
class LayerIntegratedGradients(_Quadrature):
    """Layer Integrated Gradients: Integrated Gradients of the score in a layer's activations.

    (a - a') * the integral over t in [0, 1] of dS/da at a' + t (a - a'), where a and a' are the
    layer's activations on the image and on the baseline and S runs the rest of the model from
    the interpolated activation; the attributions sum to S(x) - S(x') (completeness) up to the
    ``n_steps``-point quadrature (``method``, Gauss-Legendre by default). With ``neuron=``,
    Integrated Gradients of the neuron's activation with respect to the input.

    Sundararajan et al., "Axiomatic Attribution for Deep Networks", ICML 2017, eq. 1, applied to
    a layer's activations (captum's LayerIntegratedGradients; NeuronIntegratedGradients with
    ``neuron=``). The baseline as for :class:`~explain.IntegratedGradients`.
    """

    name = "layer-ig"
    formula = "(a - a') ⊙ ∫ dS/da along a' → a, {n_steps:code}"
    runs_on = "captum `LayerIntegratedGradients`, `NeuronIntegratedGradients`"
    neuron_formula = "IG of the neuron w.r.t. the input"
    cost = "3 forward + {n_steps} forward + backward"
    captum_method = captum_attr.LayerIntegratedGradients
    multiply_by_inputs = True

    def planned_passes(self, images: Tensor) -> int:
        # captum's layer IG runs the images and the baselines once more, for their activations
        return len(images) * (1 + self.n_steps + (2 if self.neuron is None else 0))


@register
class InternalInfluence(_Quadrature):
    """Internal influence: the gradient of the score at a layer, averaged along the path
    from a baseline to the image.

    The integral over t in [0, 1] of dS/da at the layer's activation a for the input
    x' + t (x - x'), by an ``n_steps``-point quadrature (``method``), with no (a - a') factor;
    with ``neuron=``, that of the neuron's activation with respect to the input (Integrated
    Gradients without its (x - x') factor).

    Right before global average pooling the gradient is the same at every position, so the
    map is blank there (``raw`` still gives each channel's influence): pick an earlier layer
    for a map.

    Leino et al., "Influence-Directed Explanations for Deep Convolutional Networks", ITC 2018,
    def. 3 (the distribution of interest: the straight path from the baseline), through captum's
    InternalInfluence (NeuronIntegratedGradients with ``multiply_by_inputs=False`` for a neuron).
    """

    name = "internal-influence"
    formula = "∫ dS/da(x_t) along x' → x"
    runs_on = "captum `InternalInfluence`, `NeuronIntegratedGradients`"
    neuron_formula = "IG of the neuron without its (x - x') factor"
    captum_method = captum_attr.InternalInfluence
    multiply_by_inputs = False


@register
class LayerConductance(_AlongPath):
    """Conductance: the flow of the score through each unit of a layer along the path from
    a baseline to the image.

    The sum over t of dS/dy at x' + t (x - x') times the change of the unit's activation y to
    the next point, over ``n_steps`` equal steps of [0, 1] (a Riemann-Stieltjes sum of the
    integral of dS/dy dy/dt); a layer's conductances add up to S(x) - S(x') up to that sum's
    error. With ``neuron=``, neuron conductance: (x - x') times the integral of dS/dy dy/dx
    for the class score S through that neuron, summed over a channel's neurons for a channel
    (by the trapezoid rule).

    Dhamdhere, Sundararajan and Yan, "How Important Is a Neuron?", ICLR 2019, eq. 2 (neuron)
    and 3 (layer); captum's LayerConductance and NeuronConductance, on a uniform partition of
    the path (captum's default Gauss-Legendre nodes leave out its ends, [0, t_0] and [t_n, 1]).
    Captum's NeuronConductance multiplies the summed gradients of a channel's neurons, which is
    not their conductances' sum: a channel's runs here as that sum, computed in one backward
    pass from the layer's gradients.
    """

    name = "layer-conductance"
    formula = "Σ_t dS/da(x_t) ⊙ (a(x_{{t+1}}) - a(x_t)) along x' → x, {n_steps:code} equal steps"
    runs_on = "captum `LayerConductance`, `NeuronConductance`; a channel's in explain"
    neuron_formula = "the class score's conductance through the neuron (a channel's: the sum over its neurons)"
    cost = "1 forward + {n_steps:+1} forward + backward"
    neuron_explains_class = True

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_steps + (1 if self.neuron is None else 0))

    def layer_attribution(self, scored: ScoredModel, images: Tensor, k: int, layer: nn.Module) -> Tensor:
        rows, groups = self.path_groups(images, self.n_steps + 1)
        baselines, target = self.baselines(scored, images), scored.target(k)
        method = captum_attr.LayerConductance(scored, layer)
        # captum's conductance needs two path points of each image a pass; the groups hold
        # rows // 2 images, so only a budget of one row needs raising
        return attribute_in_groups(
            method,
            images,
            baselines,
            target,
            groups,
            n_steps=self.n_steps,
            method="riemann_trapezoid",
            internal_batch_size=max(rows, 2),
        )

    def neuron_attribution(self, scored, images, k, layer, select) -> Tensor:
        if isinstance(select.neuron, int):
            return self.channel_conductance(scored, images, k, layer, select)
        rows, groups = self.path_groups(images, self.n_steps)
        baselines, target = self.baselines(scored, images), scored.target(k)
        method = captum_attr.NeuronConductance(scored, layer)
        return attribute_in_groups(
            method,
            images,
            baselines,
            target,
            groups,
            select,
            n_steps=self.n_steps,
            method="riemann_trapezoid",
            internal_batch_size=rows,
        )

    def channel_conductance(
        self, scored: ScoredModel, images: Tensor, k: int, layer: nn.Module, select: NeuronSelector
    ) -> Tensor:
        """(x - x') * sum_t w_t sum_p dS/dy_p dy_p/dx at x' + t (x - x'), y_p the channel's
        neurons: each point's layer gradient dS/dy, held fixed, weights the channel's
        activations, whose gradient with respect to the input is the sum over p."""
        step_sizes, alphas = path_points("riemann_trapezoid", self.n_steps)
        baselines = self.baselines(scored, images)
        pairs = [(i, s) for i in range(len(images)) for s in range(self.n_steps)]
        rows = self.rows(images, len(pairs))
        total = torch.zeros_like(images)
        with LayerCapture(self.model, {"layer": layer}) as capture:
            for start in range(0, len(pairs), rows):
                owners = torch.tensor([i for i, _ in pairs[start : start + rows]], device=images.device)
                shape = (-1,) + (1,) * (images.dim() - 1)
                alpha = images.new_tensor([alphas[s] for _, s in pairs[start : start + rows]]).view(shape)
                weight = images.new_tensor([step_sizes[s] for _, s in pairs[start : start + rows]]).view(shape)
                points = (baselines[owners] + alpha * (images[owners] - baselines[owners])).requires_grad_(True)
                capture.reset()
                advance(len(owners))
                capture.backward(scored.explained_scores(scored.model(points), k, owners))
                gradient = select.grid(capture.gradients["layer"])[:, select.neuron].detach()
                channel = select.grid(capture.activations["layer"])[:, select.neuron]
                (change,) = torch.autograd.grad((gradient * channel).sum(), points)
                total.index_add_(0, owners, (weight * change).to(total.dtype))
        return total * (images - baselines)


@register
class LayerGradientXActivation(_ThroughLayer):
    """Layer Gradient x Activation: a layer's activation times the gradient of the score
    with respect to it, a * dS/da.

    Each unit's first-order contribution to the score (Input x Gradient at a hidden layer);
    with ``neuron=``, the input times the gradient of the neuron's activation, x * dy/dx.

    Shrikumar et al., "Not Just a Black Box: Learning Important Features Through Propagating
    Activation Differences", arXiv:1605.01713, 2016, applied to a layer (captum's
    LayerGradientXActivation; NeuronGradient times the input with ``neuron=``).
    """

    name = "layer-gradxact"
    formula = "a ⊙ dS/da"
    runs_on = "captum `LayerGradientXActivation`, `NeuronGradient`"
    neuron_formula = "x ⊙ d(neuron)/dx"
    cost = "1 forward + 1 backward"
    single_pass = True

    def layer_attribution(self, scored: ScoredModel, images: Tensor, k: int, layer: nn.Module) -> Tensor:
        return captum_attr.LayerGradientXActivation(scored, layer).attribute(images, target=scored.target(k))

    def neuron_attribution(self, scored, images, k, layer, select) -> Tensor:
        return images * captum_attr.NeuronGradient(scored, layer).attribute(images, select)
