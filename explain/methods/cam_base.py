"""What every class-activation-map method shares.

A CAM method explains a score through one or more target layers. :class:`BaseCAM` picks
the layers, runs the model once through the hook engine (:meth:`BaseCAM.capture`: the
forward pass, and one backward pass per target for methods that use gradients), and turns
what it recorded into an :class:`~explain.Explanation` (:meth:`BaseCAM.explain`). A method
only says how a layer's map is made: most give per-channel terms (a weight times the
channel's activation), whose sum over channels is the map.

Two options apply to every method made of per-channel terms:

- ``eigen_smooth``: the map is the first principal component of the terms instead of their
  sum (pytorch-grad-cam's option of that name), with the sign that agrees with the sum;
- ``aug_smooth``: the images are also explained flipped and rescaled; each map is mapped
  back (flipped back, resized to the input size) and the maps are averaged.

Every CAM whose definition is per-channel weights and activations works on any number of
spatial dimensions: (N, C, H, W) images, (N, C, D, H, W) volumes and videos, (N, C, L)
signals. Averages and sums "over space" are over all the layer's spatial dimensions, and the
maps come back at the input's resolution by bilinear, trilinear or linear interpolation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import Explainer, NotApplicable, check_training_options
from ..checks import channel_hint, check_images, interpolation_mode, spatial_dims
from ..explanation import Explanation, scale_maps
from ..hooks import LayerCapture, check_layers_ran
from ..layers import LayerSpec, find_target_layer, resolve_layers
from ..targets import Targets, class_logits, custom_target, select_targets
from ..tokens import Reshape, ReshapeFunction, TokenLayout, infer_layout

__all__ = ["AUGMENTATIONS", "BaseCAM", "Captured", "explain_together", "principal_component", "safe_divide"]


def safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator, and 0 where the denominator is 0.

    >>> safe_divide(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 0.0]))
    tensor([0.5000, 0.0000])
    """
    nonzero = denominator != 0
    return torch.where(nonzero, numerator / torch.where(nonzero, denominator, 1.0), 0.0)


def agree_in_sign(projection: Tensor, evidence: Tensor) -> Tensor:
    """``projection`` (N, P), negated per row where it correlates negatively with
    ``evidence`` (N, P). A principal component's sign is arbitrary; this makes it follow the
    evidence, so a map is never inverted at random."""
    agreement = ((projection - projection.mean(1, keepdim=True)) * (evidence - evidence.mean(1, keepdim=True))).sum(1)
    return projection * torch.where(agreement < 0, -1.0, 1.0)[:, None]


def principal_component(terms: Tensor, *, sign: str = "sum") -> Tensor:
    """Projection of each location's channel vector on the first principal component.

    ``terms`` is (N, C, h, w) (or (N, C, d, h, w), (N, C, l)). With X the (h*w, C) matrix
    of one image, centred per channel, the map is X v1, v1 the first right singular vector
    of X, signed to agree with the channel sum of ``terms`` (``sign="sum"``), or so that its
    largest magnitude is positive (``sign="peak"``: negated where |min| > |max|, Seg-Eigen-CAM's
    eq. 13). Returns (N, h, w) (the input's spatial shape).

    >>> terms = torch.tensor([[[[2.0, -2.0]], [[4.0, -3.0]]]])  # C = 2 on a 1 x 2 grid
    >>> principal_component(terms).flatten().tolist()  # +-sqrt(16.25)
    [4.031128883361816, -4.031128883361816]
    """
    n, spatial = terms.shape[0], terms.shape[2:]
    matrix = terms.flatten(2).transpose(1, 2)  # (N, h*w, C)
    centred = matrix - matrix.mean(dim=1, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    projection = (centred @ vh[:, 0, :, None]).squeeze(2)
    if sign == "peak":
        flip = projection.amin(dim=1).abs() > projection.amax(dim=1).abs()
        return (projection * torch.where(flip, -1.0, 1.0)[:, None]).reshape(n, *spatial)
    return agree_in_sign(projection, matrix.sum(dim=2)).reshape(n, *spatial)


def check_image_rows(name: str, output: Tensor, images: Tensor) -> None:
    """Raise where layer ``name``'s ``output`` of a pass of ``images`` has not a row per image."""
    if output.shape[0] != images.shape[0]:
        raise ValueError(
            f"layer {name!r} outputs {output.shape[0]} rows for {images.shape[0]} images: the model folds patches "
            "into the batch there (as MobileViT's and TNT's inner transformers do), so its rows are not the images'; "
            "pass target_layer= a layer outside it (`explain layers MODEL` lists the layers)"
        )


def layer_layout(reshape: Reshape | None, model: nn.Module, name: str, output: Tensor, images: Tensor):
    """How ``output`` of layer ``name`` becomes an (N, C, h, w) grid (for volumes and signals,
    (N, C, d, h, w) or (N, C, l)): ``reshape`` as given, or the layout
    :func:`~explain.tokens.infer_layout` finds (spatial, tokens or channels-last), checked to
    leave more than one location."""
    layout: TokenLayout | ReshapeFunction
    if reshape is None:
        layout = infer_layout(tuple(output.shape), tuple(images.shape[2:]), model, name)
    elif isinstance(reshape, TokenLayout):
        layout = reshape
    else:
        layout = ReshapeFunction(reshape)
    grid = layout.to_spatial(output)
    if (
        not isinstance(grid, Tensor)
        or grid.dim() != images.dim()
        or grid.shape[0] != output.shape[0]
        or grid.shape[2:].numel() < 2
    ):
        got = tuple(grid.shape) if isinstance(grid, Tensor) else type(grid).__name__
        wanted = {3: "(N, C, l)", 4: "(N, C, h, w)", 5: "(N, C, d, h, w)"}.get(images.dim(), "spatial")
        raise ValueError(
            f"layer {name!r} outputs shape {tuple(output.shape)}, {got} as a grid; a CAM needs an {wanted} "
            "grid with more than one location: pick an earlier layer, or pass reshape="
        )
    return layout


def map_tensors(function: Callable[[Tensor], Tensor], output):
    """A model output with ``function`` applied to every tensor, whatever container holds it."""
    if isinstance(output, Tensor):
        return function(output)
    if isinstance(output, dict):
        return {key: map_tensors(function, value) for key, value in output.items()}
    if isinstance(output, tuple) and hasattr(output, "_fields"):  # a namedtuple
        return type(output)(*(map_tensors(function, value) for value in output))
    if isinstance(output, (tuple, list)):
        return type(output)(map_tensors(function, value) for value in output)
    return output


def detached(output):
    """The model output without its autograd graph, whatever container holds it."""
    return map_tensors(Tensor.detach, output)


def output_tensors(output) -> list[Tensor]:
    """The tensors of a model output, whatever container holds them, in its order.

    >>> [tuple(t.shape) for t in output_tensors({"logits": torch.zeros(2, 3), "aux": [torch.zeros(1)]})]
    [(2, 3), (1,)]
    """
    found: list[Tensor] = []

    def collect(tensor: Tensor) -> Tensor:
        found.append(tensor)
        return tensor

    map_tensors(collect, output)
    return found


@dataclass(frozen=True)
class Captured:
    """What one pass through the target layers recorded: everything most CAMs need.

    ``gradients[name]`` holds one (N, C, h, w) tensor per explained target (k with
    ``topk``), and is empty when the pass recorded no gradients. ``images`` are the checked
    input; ``custom_target`` is the callable that chose the scores, if one did. For volumes
    and signals every (h, w) here is (d, h, w) or (l,), and ``input_size`` (D, H, W) or (L,).
    """

    activations: dict[str, Tensor]
    gradients: dict[str, list[Tensor]]
    output: Tensor | dict | tuple
    targets: Tensor
    input_size: tuple[int, ...]
    images: Tensor
    custom_target: Callable[[Tensor], Tensor] | None = None
    #: What a method's own capture adds, e.g. SmoothGrad-CAM++'s averaged higher derivatives.
    extra: dict = field(default_factory=dict)
    #: Each layer's layout (:class:`~explain.tokens.TokenLayout`) and its output as the layer
    #: gave it, for methods that put a changed activation back (Ablation-CAM).
    layouts: dict = field(default_factory=dict)
    layer_outputs: dict[str, Tensor] = field(default_factory=dict)

    def in_layer_layout(self, layer: str, activations: Tensor, rows: Tensor) -> Tensor:
        """``activations`` (B, C, h, w) of images ``rows`` in ``layer``'s own layout."""
        return self.layouts[layer].to_layer(activations, self.layer_outputs[layer][rows])

    @property
    def logits(self) -> Tensor | dict | tuple:
        """What an :class:`~explain.Explanation` keeps as ``logits``: the class logits, or the
        model's output where a callable target chose the scores."""
        return self.output if self.custom_target is not None else class_logits(self.output)

    @property
    def num_targets(self) -> int:
        """Targets explained per image: 1, or k with ``topk``."""
        return 1 if self.targets.dim() == 1 else self.targets.shape[1]

    def target_ids(self, k: int) -> Tensor:
        """(N,) class ids of the k-th explained target."""
        return self.targets if self.targets.dim() == 1 else self.targets[:, k]

    def scores(self, output, rows: Tensor, *, probability: bool = False) -> Tensor:
        """Scores of the explained targets in ``output``, a model output on images derived
        from ``images[rows]`` (one output row per entry of ``rows``): (len(rows), num_targets).

        With ``probability``, class targets are scored by their softmax probability; a
        callable target's score is taken as it is. A callable target with a method
        ``score_rows(output, rows)`` is given ``rows`` too, so that it scores each output row
        against what it chose for its image (a region, a box: see :mod:`explain.tasks`).
        """
        if self.custom_target is not None:
            score_rows = getattr(self.custom_target, "score_rows", None)
            scores = self.custom_target(output) if score_rows is None else score_rows(output, rows)
            return scores[:, None].float()
        output = class_logits(output).float()
        if probability:
            output = output.softmax(dim=1)
        ids = self.targets.view(self.targets.shape[0], -1)[rows]  # (B, num_targets)
        return output.gather(1, ids)


# Test-time augmentations for aug_smooth: (horizontal flip, scale of the image side).
AUGMENTATIONS = tuple((flip, scale) for flip in (False, True) for scale in (0.9, 1.0, 1.1))


class BaseCAM(Explainer):
    """Base class of the class-activation-map methods.

    Parameters
    ----------
    model:
        A classifier returning (N, num_classes) logits (or any output, with a callable target).
    target_layer:
        A submodule, its dotted name, a list of them, or ``None`` to pick the last spatial
        layer before global pooling on the first call.
    class_names:
        Names of the classes, for targets given by name; defaults to ``model.class_names``.
    eigen_smooth:
        Map each layer by the first principal component of the method's per-channel terms
        instead of their sum.
    aug_smooth:
        Average the maps of the images as given, flipped, and rescaled by 0.9 and 1.1 (six
        passes), each mapped back onto the input; targets are those of the images as given.
        ``maps`` is that average; ``raw_layers`` stay those of the images as given. Volumes
        and videos are flipped left-right and rescaled in height and width (their slices or
        frames kept); signals raise :class:`~explain.NotApplicable`.
    reshape:
        How a target layer's output becomes an (N, C, h, w) grid: ``None`` to infer it
        (vision transformers' tokens and Swin's channels-last grids are recognised, see
        :func:`~explain.tokens.infer_layout`), an :class:`~explain.TokenLayout`, or a
        function from the layer's output to (N, C, h, w) (pytorch-grad-cam's
        ``reshape_transform``; Ablation-CAM, which must put a changed activation back, needs
        a ``TokenLayout``).
    train_mode:
        Leave the model in its mode (a model in train mode stays so: batch norm uses and
        updates the batch's statistics, dropout drops), for maps made inside a training loop.
    create_graph:
        Keep the maps (``maps``, ``raw_layers``) and the output (``logits``) attached to the
        autograd graph, differentiable with respect to the model's parameters, so that they can
        enter a loss (attention-guided training, CAM regularisation); the explainer itself
        writes no ``.grad``. Only the gradient CAMs made of one forward and one backward pass
        (``trains``) have these two options; see :doc:`/guide/training`.

    Notes
    -----
    Subclasses set ``uses_gradients`` and implement :meth:`channel_terms` (or
    :meth:`layer_map` for maps that are not a sum over channels).
    """

    needs_layer = True
    runs_on = "explain"
    #: Whether the capture needs one backward pass per target.
    uses_gradients: ClassVar[bool] = True
    #: Whether the map is clipped at zero, as most CAMs are ("ReLU(sum_k ...)").
    final_relu: ClassVar[bool] = True
    #: Whether the map is a sum of per-channel terms, so that eigen_smooth applies.
    channel_sum: ClassVar[bool] = True
    #: Whether explain_together may hand this method a pass captured for another one.
    shares_capture: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        class_names: Sequence[str] | None = None,
        eigen_smooth: bool = False,
        aug_smooth: bool = False,
        reshape: Reshape | None = None,
        train_mode: bool = False,
        create_graph: bool = False,
    ):
        super().__init__(model, class_names=class_names)
        check_training_options(type(self), {"train_mode": train_mode, "create_graph": create_graph})
        self.train_mode, self.create_graph = bool(train_mode), bool(create_graph)
        if reshape is not None and not isinstance(reshape, TokenLayout) and not callable(reshape):
            raise TypeError(f"reshape must be None, an explain.TokenLayout or a function, got {type(reshape).__name__}")
        self.reshape = reshape
        if eigen_smooth and not self.channel_sum:
            raise ValueError(f"{type(self).__name__} is not a sum over channels, so eigen_smooth does not apply to it")
        self.eigen_smooth = bool(eigen_smooth)
        self.aug_smooth = bool(aug_smooth)
        self._layers = None if target_layer is None else resolve_layers(model, target_layer)

    def target_layers(self, images: Tensor) -> dict[str, nn.Module]:
        """The layers to explain; the automatic choice is made once, on ``images[:1]``."""
        if self._layers is None:
            name = find_target_layer(self.model, images[:1])
            self._layers = {name: self.model.get_submodule(name)}
        return self._layers

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return tuple(self.target_layers(images))

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        """One forward pass (and a backward pass per target) through the target layers, the
        ``topk`` classes in one pass; with ``aug_smooth``, six."""
        if self.aug_smooth:
            return self._augmented(images, targets, topk)
        return self.explain(self.capture(images, targets, topk=topk))

    def capture(
        self, images: Tensor, targets: Targets = None, *, topk: int | None = None, gradients: bool | None = None
    ) -> Captured:
        """One forward pass through the target layers, and one backward pass per target when
        ``gradients`` (default: when this method uses them)."""
        images = check_images(images, self.model)
        self.check_applies(images)
        layers = self.target_layers(images)
        with_gradients = self.uses_gradients if gradients is None else gradients
        with LayerCapture(
            self.model, layers, gradients=with_gradients, train_mode=self.train_mode, create_graph=self.create_graph
        ) as capture:
            with channel_hint(images):
                output = self.model(images)
            scores, ids = select_targets(output, targets, topk=topk, class_names=self.class_names)
            check_layers_ran(layers, capture.activations)
            for name in layers:
                check_image_rows(name, capture.activations[name], images)
            layouts = {
                name: layer_layout(self.reshape, self.model, name, capture.activations[name], images) for name in layers
            }
            recorded: dict[str, list[Tensor]] = {}
            if with_gradients:
                scores = self.explained_scores(output, scores, ids)
                recorded = {name: [] for name in layers}
                for column in (scores if scores.dim() == 2 else scores[:, None]).unbind(dim=1):
                    for name, gradient in self.record_gradients(capture, column).items():
                        recorded[name].append(layouts[name].to_spatial(gradient))
            kept = self.create_graph  # the maps stay differentiable: nothing is detached
            outputs = {
                name: (capture.activations[name] if kept else capture.activations[name].detach()).float()
                for name in layers
            }
        activations = {name: layouts[name].to_spatial(output_) for name, output_ in outputs.items()}
        custom = custom_target(targets)
        return Captured(
            activations,
            recorded,
            output if self.create_graph else detached(output),
            ids,
            tuple(images.shape[2:]),
            images,
            custom,
            layouts=layouts,
            layer_outputs=outputs,
        )

    def explained_scores(self, output, scores: Tensor, ids: Tensor) -> Tensor:
        """The scores to differentiate, from the target scores (logits) that were selected;
        methods that explain another score of the same target change this."""
        return scores

    def record_gradients(self, capture: LayerCapture, scores: Tensor) -> dict[str, Tensor]:
        """Gradients of ``scores`` (N,) at the target layers, as the method uses them."""
        capture.backward(scores)
        return {name: gradient.float() for name, gradient in capture.gradients.items()}

    def channel_terms(self, captured: Captured, layer: str, k: int) -> Tensor:
        """(N, C, h, w) terms whose sum over channels is the map of target ``k`` at ``layer``
        ((N, C, d, h, w) or (N, C, l) for volumes and signals)."""
        raise NotImplementedError

    def layer_map(self, captured: Captured, layer: str, k: int) -> Tensor:
        """(N, h, w) map of target ``k`` at ``layer``, before the final ReLU."""
        terms = self.channel_terms(captured, layer, k)
        return principal_component(terms) if self.eigen_smooth else terms.sum(dim=1)

    def layer_maps(self, captured: Captured, layer: str) -> Tensor:
        """(N, num_targets, h, w) maps at ``layer``, before the final ReLU."""
        return torch.stack([self.layer_map(captured, layer, k) for k in range(captured.num_targets)], dim=1)

    def explain(self, captured: Captured) -> Explanation:
        """This method's maps from what :meth:`capture` recorded (by this or another method)."""
        return _explanation(self.raw_layer_maps(captured), captured, self.name, self.class_names)

    def raw_layer_maps(self, captured: Captured) -> dict[str, Tensor]:
        """Each layer's unscaled maps (after the final ReLU), (N, h, w) or (N, k, h, w) with topk."""
        raw_layers = {}
        for name in captured.activations:
            raw = self.layer_maps(captured, name)
            if self.final_relu:
                raw = F.relu(raw)
            raw_layers[name] = raw.squeeze(1) if captured.targets.dim() == 1 else raw
        return raw_layers

    def _augmented(self, images: Tensor, targets: Targets, topk: int | None) -> Explanation:
        """aug_smooth: the mean of the maps over AUGMENTATIONS, each mapped back."""
        images = check_images(images, self.model)
        spatial = spatial_dims(images)
        if spatial == 1:
            raise NotApplicable(
                "aug_smooth flips and rescales images; a signal reversed or stretched in time is another "
                "signal, so it does not apply to (N, C, L) inputs: leave aug_smooth off"
            )
        size, mode = tuple(images.shape[2:]), interpolation_mode(spatial)
        plain = self.explain(self.capture(images, targets, topk=topk))
        custom = custom_target(targets)
        fixed = custom if custom is not None else plain.targets
        total = torch.zeros_like(plain.maps)
        for flip, scale in AUGMENTATIONS:
            if not flip and scale == 1.0:
                total += plain.maps
                continue
            augmented = images.flip(-1) if flip else images
            if scale != 1.0:  # volumes keep their slices or frames
                factor = scale if spatial == 2 else (1.0, scale, scale)
                augmented = F.interpolate(augmented, scale_factor=factor, mode=mode, align_corners=False)
            maps = self.explain(self.capture(augmented, fixed)).maps
            maps = maps if maps.dim() == spatial + 2 else maps[:, None]
            maps = F.interpolate(maps, size=size, mode=mode, align_corners=False)
            total += (maps.flip(-1) if flip else maps).reshape(total.shape)
        maps = scale_maps(total / len(AUGMENTATIONS), size)
        return Explanation(maps, plain.raw_layers, plain.logits, plain.targets, self.name, self.class_names)


def _explanation(raw_layers: dict[str, Tensor], captured: Captured, method: str, class_names) -> Explanation:
    """Scale each layer's raw maps to the input size; several layers are averaged and scaled again."""
    size = captured.input_size
    maps = torch.stack([scale_maps(raw, size) for raw in raw_layers.values()]).mean(dim=0)
    if len(raw_layers) > 1:
        maps = scale_maps(maps, size)
    return Explanation(maps, raw_layers, captured.logits, captured.targets, method, class_names)


def explain_together(
    explainers: Sequence[Explainer], images: Tensor, targets: Targets = None, *, topk: int | None = None
) -> list[Explanation]:
    """Explain one batch with several explainers, sharing the passes they can share.

    CAMs of the same model and target layers start from the same activations (and, for
    gradient methods, the same gradients), so they share one forward pass and one backward
    pass per target: comparing k gradient CAMs costs what one does, and a perturbation CAM
    adds only its own perturbed passes. Explainers with passes of their own (noise samples,
    augmentations, higher derivatives) and any other explainer run on their own.

    >>> import torchvision
    >>> from explain import GradCAM, LayerCAM
    >>> model = torchvision.models.resnet18().eval()
    >>> cams = [GradCAM(model, "layer4"), LayerCAM(model, "layer4")]
    >>> gradcam, layercam = explain_together(cams, torch.rand(2, 3, 64, 64))
    >>> layercam.method, tuple(layercam.maps.shape)
    ('layercam', (2, 64, 64))
    """
    checked: dict[int, Tensor] = {}  # images checked against each model, once
    keys: list[tuple | None] = []
    for explainer in explainers:
        if not isinstance(explainer, BaseCAM) or not explainer.shares_capture or explainer.aug_smooth:
            keys.append(None)
            continue
        model = id(explainer.model)
        if model not in checked:
            checked[model] = check_images(images, explainer.model)
        layers = explainer.target_layers(checked[model])
        keys.append((model, tuple(explainer.class_names or ()), *layers.items()))
    needs_gradients = {key: False for key in keys if key is not None}
    for key, explainer in zip(keys, explainers, strict=True):
        if key is not None and isinstance(explainer, BaseCAM):  # (a key is a CAM's)
            needs_gradients[key] |= explainer.uses_gradients
    captures: dict[tuple, Captured] = {}
    results = []
    for key, explainer in zip(keys, explainers, strict=True):
        if key is None or not isinstance(explainer, BaseCAM):
            results.append(explainer(images, targets, topk=topk))
            continue
        if key not in captures:
            captures[key] = explainer.capture(images, targets, topk=topk, gradients=needs_gradients[key])
        results.append(explainer.explain(captures[key]))
    return results
