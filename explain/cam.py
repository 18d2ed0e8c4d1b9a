"""The Grad-CAM family: class-activation maps from a layer's activations and gradients.

Each method is one small function of ``activations`` A and ``gradients`` G, both
(N, C, h, w), where G = dS/dA is the gradient of the explained score S (a logit) with
respect to A. :class:`GradientCAM` runs the model once through the hook engine, calls the
function, applies the family's final ReLU, and scales the result to the input size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Explainer, channel_hint, check_images, register
from .explanation import Explanation, scale_maps
from .hooks import LayerCapture
from .layers import LayerSpec, find_target_layer, on_input_grid, resolve_layers
from .targets import Targets, select_targets

__all__ = [
    "Captured",
    "EigenGradCAM",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "GradientCAM",
    "HiResCAM",
    "LayerCAM",
    "XGradCAM",
    "explain_together",
]


def _safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator, and 0 where the denominator is 0."""
    nonzero = denominator != 0
    return torch.where(nonzero, numerator / torch.where(nonzero, denominator, 1.0), 0.0)


def _check_spatial(activations: dict[str, Tensor], images: Tensor) -> None:
    for name, activation in activations.items():
        shape = tuple(activation.shape)
        if activation.dim() != 4 or activation.shape[-2:].numel() < 2:
            raise ValueError(
                f"layer {name!r} outputs shape {shape}; a CAM needs an (N, C, h, w) "
                "output with more than one location: pick an earlier convolutional layer"
            )
        # (N, h, w, C), as Swin and ConvNeXt-style blocks keep it, would be read as C = h.
        if not on_input_grid(shape, images) and on_input_grid((shape[0], shape[3], shape[1], shape[2]), images):
            raise ValueError(
                f"layer {name!r} outputs shape {shape}, which looks channels-last (N, h, w, C); a CAM "
                "needs (N, C, h, w): pick the layer that permutes it back, or a convolution "
                "(`explain layers MODEL` lists the spatial ones)"
            )


def _detached(output):
    """The model output without its autograd graph, whatever container holds it."""
    if isinstance(output, Tensor):
        return output.detach()
    if isinstance(output, dict):
        return {key: _detached(value) for key, value in output.items()}
    if isinstance(output, tuple) and hasattr(output, "_fields"):  # a namedtuple
        return type(output)(*(_detached(value) for value in output))
    if isinstance(output, (tuple, list)):
        return type(output)(_detached(value) for value in output)
    return output


class GradientCAM(Explainer):
    """Base class of the gradient-weighted CAMs; subclasses define :meth:`cam`.

    Parameters
    ----------
    model:
        A classifier returning (N, num_classes) logits (or any output, with a callable target).
    target_layer:
        A submodule, its dotted name, a list of them, or ``None`` to pick the last spatial
        layer before global pooling on the first call.
    class_names:
        Names of the classes, for targets given by name; defaults to ``model.class_names``.
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        class_names: Sequence[str] | None = None,
    ):
        super().__init__(model, class_names=class_names)
        self._layers = None if target_layer is None else resolve_layers(model, target_layer)

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        """Map (N, h, w) before the final ReLU, from A and G of shape (N, C, h, w)."""
        raise NotImplementedError

    def target_layers(self, images: Tensor) -> dict[str, nn.Module]:
        """The layers to explain; the automatic choice is made once, on ``images[:1]``."""
        if self._layers is None:
            name = find_target_layer(self.model, images[:1])
            self._layers = {name: self.model.get_submodule(name)}
        return self._layers

    def __call__(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        """Explain ``targets`` (default: each image's top class) for a batch of images.

        ``targets`` is a class id, a class name, a list with one of those per image, or a
        callable ``f(output) -> (N,) scores``; ``topk=k`` explains each image's k best classes
        in one pass and gives maps of shape (N, k, H, W).
        """
        return self.explain(self.capture(images, targets, topk=topk))

    def capture(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Captured:
        """One forward pass, and one backward pass per target, through the target layers."""
        images = check_images(images, self.model)
        layers = self.target_layers(images)
        with LayerCapture(self.model, layers) as capture:
            with channel_hint(images):
                output = self.model(images)
            scores, ids = select_targets(output, targets, topk=topk, class_names=self.class_names)
            _check_spatial(capture.activations, images)
            gradients: dict[str, list[Tensor]] = {name: [] for name in layers}
            for column in (scores if scores.dim() == 2 else scores[:, None]).unbind(dim=1):
                capture.backward(column)
                for name in layers:
                    gradients[name].append(capture.gradients[name].float())
            activations = {name: capture.activations[name].detach().float() for name in layers}
        return Captured(activations, gradients, _detached(output), ids, tuple(images.shape[-2:]))

    def explain(self, captured: Captured) -> Explanation:
        """This method's maps from what :meth:`capture` recorded (by this or another method)."""
        raw_layers = {
            name: torch.stack([F.relu(self.cam(activation, g)) for g in captured.gradients[name]], dim=1)
            for name, activation in captured.activations.items()
        }
        if captured.targets.dim() == 1:
            raw_layers = {name: raw.squeeze(1) for name, raw in raw_layers.items()}
        size = captured.input_size
        maps = torch.stack([scale_maps(raw, size) for raw in raw_layers.values()]).mean(dim=0)
        if len(raw_layers) > 1:
            maps = scale_maps(maps, size)
        return Explanation(maps, raw_layers, captured.output, captured.targets, self.name, self.class_names)


@dataclass(frozen=True)
class Captured:
    """Activations and gradients at the target layers: everything a gradient CAM needs.

    ``gradients[name]`` holds one (N, C, h, w) tensor per explained target (k with ``topk``).
    """

    activations: dict[str, Tensor]
    gradients: dict[str, list[Tensor]]
    output: Tensor | dict | tuple
    targets: Tensor
    input_size: tuple[int, int]


def explain_together(
    explainers: Sequence[Explainer], images: Tensor, targets: Targets = None, *, topk: int | None = None
) -> list[Explanation]:
    """Explain one batch with several explainers, sharing the passes they can share.

    Gradient CAMs of the same model and target layers are functions of the same activations
    and gradients, so they share one forward pass and one backward pass per target:
    comparing k methods costs what one does. Any other explainer runs on its own.

    >>> import torchvision
    >>> model = torchvision.models.resnet18().eval()
    >>> cams = [GradCAM(model, "layer4"), LayerCAM(model, "layer4")]
    >>> gradcam, layercam = explain_together(cams, torch.rand(2, 3, 64, 64))
    >>> layercam.method, tuple(layercam.maps.shape)
    ('layercam', (2, 64, 64))
    """
    checked: dict[int, Tensor] = {}  # images checked against each model, once
    captures: dict[tuple, Captured] = {}
    results = []
    for explainer in explainers:
        if not isinstance(explainer, GradientCAM):
            results.append(explainer(images, targets, topk=topk))
            continue
        model = id(explainer.model)
        if model not in checked:
            checked[model] = check_images(images, explainer.model)
        layers = explainer.target_layers(checked[model])
        key = (model, tuple(explainer.class_names or ()), *layers.items())
        if key not in captures:
            captures[key] = explainer.capture(images, targets, topk=topk)
        results.append(explainer.explain(captures[key]))
    return results


@register
class GradCAM(GradientCAM):
    """Grad-CAM: activations weighted by their spatially averaged gradients.

    L = ReLU(sum_k a_k A^k), with a_k = 1/Z sum_ij G^k_ij (Z = h*w).

    Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", ICCV 2017, eq. 1-2.
    """

    name = "gradcam"

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        weights = gradients.mean(dim=(2, 3), keepdim=True)
        return (weights * activations).sum(dim=1)


@register
class GradCAMPlusPlus(GradientCAM):
    """Grad-CAM++: per-pixel weighting of positive gradients by higher-order terms.

    L = ReLU(sum_k w_k A^k), w_k = sum_ij alpha^k_ij ReLU(G^k_ij),
    alpha^k_ij = G^2 / (2 G^2 + sum_ab A^k_ab G^3), with alpha = 0 where the denominator is 0.
    The powers of G stand for the second and third derivatives under the paper's
    exponential-score assumption (its eq. 19); the exp(S) factor it adds to w_k is the
    same for every channel and vanishes when the map is scaled.

    Chattopadhay et al., "Grad-CAM++: Generalized Gradient-based Visual Explanations for
    Deep Convolutional Networks", WACV 2018.
    """

    name = "gradcam++"

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        g2 = gradients.pow(2)
        g3 = gradients.pow(3)
        activation_sums = activations.sum(dim=(2, 3), keepdim=True)
        alpha = _safe_divide(g2, 2 * g2 + activation_sums * g3)
        weights = (alpha * F.relu(gradients)).sum(dim=(2, 3), keepdim=True)
        return (weights * activations).sum(dim=1)


@register
class XGradCAM(GradientCAM):
    """XGrad-CAM: gradients averaged with the activations' own spatial weights.

    L = ReLU(sum_k w_k A^k), w_k = sum_ij (A^k_ij / sum_ab A^k_ab) G^k_ij, with w_k = 0
    for a channel whose activations sum to 0.

    Fu et al., "Axiom-based Grad-CAM: Towards Accurate Visualization and Explanation of
    CNNs", BMVC 2020, eq. 12.
    """

    name = "xgradcam"

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        weights = _safe_divide(
            (gradients * activations).sum(dim=(2, 3), keepdim=True),
            activations.sum(dim=(2, 3), keepdim=True),
        )
        return (weights * activations).sum(dim=1)


@register
class HiResCAM(GradientCAM):
    """HiResCAM: element-wise gradient times activation, summed over channels.

    L = ReLU(sum_k G^k * A^k). Unlike Grad-CAM it does not average gradients over space, so
    the map is the exact contribution of each location to the score when the head is linear.

    Draelos & Carin, "Use HiResCAM instead of Grad-CAM for faithful explanations of
    convolutional neural networks", arXiv:2011.08891 (2020).
    """

    name = "hirescam"

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        return (gradients * activations).sum(dim=1)


@register
class LayerCAM(GradientCAM):
    """LayerCAM: activations weighted location by location by their positive gradients.

    L = ReLU(sum_k ReLU(G^k) * A^k).

    Jiang et al., "LayerCAM: Exploring Hierarchical Class Activation Maps for Localization",
    IEEE Transactions on Image Processing 30, 2021, eq. 6-7.
    """

    name = "layercam"

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        return (F.relu(gradients) * activations).sum(dim=1)


@register
class GradCAMElementWise(GradientCAM):
    """Grad-CAM element-wise: ReLU of gradient times activation, then summed over channels.

    L = sum_k ReLU(G^k * A^k): like HiResCAM, but negative contributions of one channel
    cannot cancel positive ones of another.

    The element-wise Grad-CAM variant of pytorch-grad-cam (J. Gildenblat and contributors,
    https://github.com/jacobgil/pytorch-grad-cam, 2021).
    """

    name = "gradcam-elementwise"

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        return F.relu(gradients * activations).sum(dim=1)


@register
class EigenGradCAM(GradientCAM):
    """EigenGrad-CAM: first principal component of gradient times activation.

    With X the (h*w, C) matrix of G * A, centred per channel, L = ReLU(X v1) where v1 is the
    first right singular vector of X. A singular vector's sign is arbitrary; it is chosen
    here so that the map correlates positively with sum_k G^k * A^k, which makes the result
    deterministic. The first component follows what dominates the layer more than the class:
    on the bundled model its maps for different classes are often nearly the same.

    Eigen-CAM: Muhammad & Yeasin, "Eigen-CAM: Class Activation Map using Principal
    Components", IJCNN 2020; applied to G * A as in pytorch-grad-cam's EigenGradCAM.
    """

    name = "eigengradcam"

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        n, c, h, w = activations.shape
        product = (gradients * activations).flatten(2).transpose(1, 2)  # (N, h*w, C)
        centred = product - product.mean(dim=1, keepdim=True)
        _, _, vh = torch.linalg.svd(centred, full_matrices=False)
        projection = (centred @ vh[:, 0, :, None]).squeeze(2)  # (N, h*w)
        evidence = product.sum(dim=2)
        agreement = ((projection - projection.mean(1, keepdim=True)) * (evidence - evidence.mean(1, keepdim=True))).sum(1)
        sign = torch.where(agreement < 0, -1.0, 1.0)
        return (projection * sign[:, None]).reshape(n, h, w)
