"""Gradient CAMs: maps from a layer's activations A and the gradients G = dS/dA of the
explained score S.

Each method is one small function of (A, G), both (N, C, h, w) (or (N, C, d, h, w) for
volumes and videos, (N, C, l) for signals: "spatial" sums and means run over every axis
after the channels): ``contributions`` gives the per-channel terms whose sum over channels is
the map before the final ReLU. Smoothed and
second-order variants (SmoothGrad-CAM++, Shapley-CAM) and the contrastive Finer-CAM run
passes of their own; the others share one forward and one backward pass per target.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention_capture import explicit_attention_kernels
from ..base import register, registered_class
from ..checks import positive_int, spatial_axes
from ..hooks import check_layers_ran
from ..layers import LayerSpec
from ..targets import Targets, class_logits
from .cam_base import BaseCAM, Captured, principal_component, safe_divide

__all__ = [
    "EigenGradCAM",
    "FinerCAM",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "GradientCAM",
    "HiResCAM",
    "LayerCAM",
    "SegEigenCAM",
    "ShapleyCAM",
    "SmoothGradCAMPlusPlus",
    "XGradCAM",
]


class GradientCAM(BaseCAM):
    """Base class of the gradient-weighted CAMs; subclasses define :meth:`contributions`.

    Those made of one forward and one backward pass (``trains``) also make maps inside a
    training loop: ``train_mode=`` and ``create_graph=`` (see :class:`~explain.BaseCAM`)."""

    family = "gradient CAM"
    cost = "1 forward + 1 backward to the layer"
    trains = True

    @staticmethod
    def contributions(activations: Tensor, gradients: Tensor) -> Tensor:
        """Per-channel terms (N, C, h, w) from A and G of shape (N, C, h, w)."""
        raise NotImplementedError

    @classmethod
    def cam(cls, activations: Tensor, gradients: Tensor) -> Tensor:
        """Map (N, h, w) before the final ReLU, from A and G of shape (N, C, h, w)."""
        return cls.contributions(activations, gradients).sum(dim=1)

    def channel_terms(self, captured: Captured, layer: str, k: int) -> Tensor:
        return self.contributions(captured.activations[layer], captured.gradients[layer][k])

    def layer_map(self, captured: Captured, layer: str, k: int) -> Tensor:
        if self.channel_sum:
            return super().layer_map(captured, layer, k)
        return self.cam(captured.activations[layer], captured.gradients[layer][k])


def gradcam_plus_plus_weights(activations: Tensor, first: Tensor, second: Tensor, third: Tensor) -> Tensor:
    """Grad-CAM++ channel weights (N, C, 1, 1) (a 1 per spatial axis) from A and the first three derivatives of the
    score with respect to A: w_k = sum_ij alpha^k_ij ReLU(d1), alpha = d2 / (2 d2 + sum_ab A_ab d3),
    with alpha = 0 where the denominator is 0."""
    space = spatial_axes(activations)
    alpha = safe_divide(second, 2 * second + activations.sum(dim=space, keepdim=True) * third)
    return (alpha * F.relu(first)).sum(dim=space, keepdim=True)


@register
class GradCAM(GradientCAM):
    """Grad-CAM: activations weighted by their spatially averaged gradients.

    L = ReLU(sum_k a_k A^k), with a_k = 1/Z sum_ij G^k_ij (Z = h*w; for volumes the mean
    over d*h*w locations, for signals over l).

    Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", ICCV 2017, eq. 1-2.
    """

    name = "gradcam"
    formula = "sum_k mean(G^k) A^k"

    @staticmethod
    def contributions(activations: Tensor, gradients: Tensor) -> Tensor:
        return gradients.mean(dim=spatial_axes(gradients), keepdim=True) * activations


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
    formula = "sum_k (sum_ij alpha^k_ij ReLU(G^k_ij)) A^k, alpha = G²/(2G² + sum A·G³)"

    @staticmethod
    def contributions(activations: Tensor, gradients: Tensor) -> Tensor:
        return gradcam_plus_plus_weights(activations, gradients, gradients.pow(2), gradients.pow(3)) * activations


@register
class XGradCAM(GradientCAM):
    """XGrad-CAM: gradients averaged with the activations' own spatial weights.

    L = ReLU(sum_k w_k A^k), w_k = sum_ij (A^k_ij / sum_ab A^k_ab) G^k_ij, with w_k = 0
    for a channel whose activations sum to 0.

    Fu et al., "Axiom-based Grad-CAM: Towards Accurate Visualization and Explanation of
    CNNs", BMVC 2020, eq. 12.
    """

    name = "xgradcam"
    formula = "sum_k (sum_ij A^k_ij G^k_ij / sum_ij A^k_ij) A^k"

    @staticmethod
    def contributions(activations: Tensor, gradients: Tensor) -> Tensor:
        space = spatial_axes(activations)
        weights = safe_divide(
            (gradients * activations).sum(dim=space, keepdim=True),
            activations.sum(dim=space, keepdim=True),
        )
        return weights * activations


@register
class HiResCAM(GradientCAM):
    """HiResCAM: element-wise gradient times activation, summed over channels.

    L = ReLU(sum_k G^k * A^k). Unlike Grad-CAM it does not average gradients over space, so
    the map is the exact contribution of each location to the score when the head is linear.

    Draelos & Carin, "Use HiResCAM instead of Grad-CAM for faithful explanations of
    convolutional neural networks", arXiv:2011.08891 (2020).
    """

    name = "hirescam"
    formula = "sum_k G^k ⊙ A^k"

    @staticmethod
    def contributions(activations: Tensor, gradients: Tensor) -> Tensor:
        return gradients * activations


@register
class LayerCAM(GradientCAM):
    """LayerCAM: activations weighted location by location by their positive gradients.

    L = ReLU(sum_k ReLU(G^k) * A^k).

    Jiang et al., "LayerCAM: Exploring Hierarchical Class Activation Maps for Localization",
    IEEE Transactions on Image Processing 30, 2021, eq. 6-7.
    """

    name = "layercam"
    formula = "sum_k ReLU(G^k) ⊙ A^k"

    @staticmethod
    def contributions(activations: Tensor, gradients: Tensor) -> Tensor:
        return F.relu(gradients) * activations


@register
class GradCAMElementWise(GradientCAM):
    """Grad-CAM element-wise: ReLU of gradient times activation, then summed over channels.

    L = sum_k ReLU(G^k * A^k): like HiResCAM, but negative contributions of one channel
    cannot cancel positive ones of another.

    The element-wise Grad-CAM variant of pytorch-grad-cam (J. Gildenblat and contributors,
    https://github.com/jacobgil/pytorch-grad-cam, 2021).
    """

    name = "gradcam-elementwise"
    formula = "sum_k ReLU(G^k ⊙ A^k)"

    @staticmethod
    def contributions(activations: Tensor, gradients: Tensor) -> Tensor:
        return F.relu(gradients * activations)


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
    formula = "first principal component of G ⊙ A"
    channel_sum = False
    trains = False  # a singular vector's gradient is unstable where singular values are close

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        return principal_component(gradients * activations)


@register
class SegEigenCAM(GradientCAM):
    """Seg-Eigen-CAM: first principal component of abs(gradient) times activation, its peak positive.

    With X the (h*w, C) matrix of abs(G) ⊙ A (eq. 10: the gradient's magnitude, location by
    location, so that negative gradients count too), centred per channel, P = X v1, v1 the
    first right singular vector of X (eq. 11-12); P is negated where abs(min P) > max P (eq. 13,
    the sign correction: the salient region is the component's largest magnitude) and
    L = ReLU(P). Made for segmentation models, with a ``SegmentationTarget`` (a class's score
    summed over its pixels); any differentiable score works.

    Chung & Ying, "Seg-Eigen-CAM: Eigen-Value-Based Visual Explanations for Semantic
    Segmentation Models", Applied Sciences 15(13), 7562, 2025, eq. 10-13.
    """

    name = "segeigencam"
    formula = "first principal component of abs(G) ⊙ A, negated where abs(min) > max"
    channel_sum = False
    trains = False  # a singular vector's gradient is unstable where singular values are close

    @staticmethod
    def cam(activations: Tensor, gradients: Tensor) -> Tensor:
        return principal_component(gradients.abs() * activations, sign="peak")


@register
class SmoothGradCAMPlusPlus(GradientCAM):
    """SmoothGrad-CAM++: Grad-CAM++ with its derivatives averaged over noisy copies of the input.

    For n = ``n_samples`` copies x + delta_i, delta_i ~ N(0, noise^2) per pixel of the
    preprocessed input: D1 = mean_i G_i, D2 = mean_i G_i^2, D3 = mean_i G_i^3 (the second and
    third derivatives under Grad-CAM++'s exponential-score assumption);
    alpha = D2 / (2 D2 + sum_ab A_ab D3), w_k = sum_ij alpha_ij ReLU(D1_ij), and
    L = ReLU(sum_k w_k A^k) with A from the image as given. The targets are those of the image
    as given. ``noise`` is an absolute standard deviation (as captum's NoiseTunnel takes it);
    n = 4 and noise = 0.3 follow torchcam; ``seed`` makes the noise repeatable. Costs n + 1
    forward passes and n backward passes.

    Omeiza et al., "Smooth Grad-CAM++: An Enhanced Inference Level Visualization Technique
    for Deep Convolutional Neural Network Models", arXiv:1908.01224 (2019).
    """

    name = "smoothgradcam++"
    formula = "Grad-CAM++ with G, G², G³ averaged over {n_samples:code} noisy inputs ({noise:code} = std)"
    cost = "1 forward + {n_samples} forward + backward to the layer"
    shares_capture = False
    trains = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        n_samples: int = 4,
        noise: float = 0.3,
        seed: int = 0,
        **options,
    ):
        super().__init__(model, target_layer, **options)
        self.n_samples, self.noise, self.seed = positive_int("n_samples", n_samples), float(noise), int(seed)

    def planned_passes(self, images: Tensor) -> int:
        """The image as given, then ``n_samples`` noisy copies (forward and backward)."""
        return len(images) * (1 + self.n_samples)

    def capture(
        self, images: Tensor, targets: Targets = None, *, topk: int | None = None, gradients: bool | None = None
    ) -> Captured:
        # The image as given supplies A and the targets; only the noisy copies need gradients.
        clean = super().capture(images, targets, topk=topk, gradients=False)
        fixed = clean.custom_target if clean.custom_target is not None else clean.targets
        moments: dict[int, dict[str, list[Tensor]]] = {1: {}, 2: {}, 3: {}}
        generator = torch.Generator(clean.images.device).manual_seed(self.seed)
        for _ in range(self.n_samples):
            noise = torch.randn(clean.images.shape, generator=generator, device=clean.images.device)
            sample = super().capture(clean.images + self.noise * noise.to(clean.images.dtype), fixed)
            for name, grads in sample.gradients.items():
                for power in (1, 2, 3):
                    sums = moments[power].setdefault(name, [torch.zeros_like(g) for g in grads])
                    for k, g in enumerate(grads):
                        sums[k] += g.pow(power) / self.n_samples
        return Captured(
            clean.activations,
            moments[1],
            clean.output,
            clean.targets,
            clean.input_size,
            clean.images,
            clean.custom_target,
            extra={"second": moments[2], "third": moments[3]},
            layouts=clean.layouts,
            layer_outputs=clean.layer_outputs,
        )

    def channel_terms(self, captured: Captured, layer: str, k: int) -> Tensor:
        activations = captured.activations[layer]
        first = captured.gradients[layer][k]
        second, third = captured.extra["second"][layer][k], captured.extra["third"][layer][k]
        return gradcam_plus_plus_weights(activations, first, second, third) * activations


@register
class ShapleyCAM(GradientCAM):
    """Shapley-CAM: Grad-CAM with a second-order correction from the Hessian.

    w_k = mean_ij (G - 1/2 H A)^k_ij, with H A the Hessian of the score with respect to A
    times A (a Hessian-vector product, one double-backward pass); L = ReLU(sum_k w_k A^k).
    The score is the paper's ReST, y_c + log softmax(y)_c (the logit minus the
    cross-entropy), per image; ``rest=False`` explains the logit instead. Where the layers
    after A are piecewise linear (ReLU, pooling, a linear head) and the score is the logit,
    H = 0 and the map equals Grad-CAM's. For a callable target, its score is used as it is.

    Cai et al., "CAMs as Shapley Value-based Explainers", arXiv:2501.06261 (2025), eq. 11-13.
    """

    name = "shapleycam"
    formula = "sum_k mean(G - ½ H·A)^k A^k, H the Hessian; score ReST = y_c + log p_c"
    cost = "1 forward + 1 double backward to the layer"
    shares_capture = False
    trains = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        rest: bool = True,
        **options,
    ):
        super().__init__(model, target_layer, **options)
        self.rest = bool(rest)

    contributions = staticmethod(GradCAM.contributions)

    def capture(
        self, images: Tensor, targets: Targets = None, *, topk: int | None = None, gradients: bool | None = None
    ) -> Captured:
        # Fused attention kernels have no second derivative; the explicit one has.
        with explicit_attention_kernels(self.model):
            return super().capture(images, targets, topk=topk, gradients=gradients)

    def explained_scores(self, output, scores: Tensor, ids: Tensor) -> Tensor:
        if not self.rest or (ids == -1).any():
            return scores
        log_probabilities = class_logits(output).float().log_softmax(dim=1)
        rows = torch.arange(len(ids), device=ids.device)
        picked = log_probabilities[rows[:, None], ids] if ids.dim() == 2 else log_probabilities[rows, ids]
        return scores + picked.to(scores.dtype)

    def record_gradients(self, capture, scores: Tensor) -> dict[str, Tensor]:
        names = list(capture.layers)
        check_layers_ran(names, capture.activations)
        activations = [capture.activations[name] for name in names]
        first = torch.autograd.grad(scores.sum(), activations, create_graph=True, retain_graph=True, allow_unused=True)
        unused = [name for name, gradient in zip(names, first, strict=True) if gradient is None]
        if unused:
            raise ValueError(f"the scores do not depend on layer(s) {unused}; pick layers on the path to the output")
        recorded = {}
        for name, activation, gradient in zip(names, activations, first, strict=True):
            if gradient.requires_grad:
                try:
                    (hvp,) = torch.autograd.grad(
                        gradient, activation, grad_outputs=activation.detach(), retain_graph=True, allow_unused=True
                    )
                except RuntimeError as error:
                    if "not implemented" not in str(error):
                        raise
                    raise ValueError(
                        f"Shapley-CAM needs second derivatives of the layers after {name!r}, and PyTorch "
                        f"has none for one of them ({error}); pick a later target layer, or Grad-CAM"
                    ) from None
            else:  # the score is linear in this activation
                hvp = None
            hvp = torch.zeros_like(gradient) if hvp is None else hvp
            recorded[name] = (gradient - 0.5 * hvp).detach().float()
        return recorded


@register
class FinerCAM(GradientCAM):
    """Finer-CAM: a gradient CAM of the target's score against its most similar classes.

    The explained score is sum_d p_d (y_c - alpha y_d) / sum_d p_d over the comparison
    classes d: the classes whose logits are nearest to y_c, at ranks ``comparison``
    (default 1, 2, 3; rank 0 is c itself), p the softmax probabilities (differentiated too,
    as in the authors' code). The map is the ``base`` method's (default Grad-CAM) for that
    score, so it shows what sets the class apart from its look-alikes. alpha = 1 by default.
    Ranks beyond the number of classes are left out (with one class, the score is y_c).

    Zhang et al., "Finer-CAM: Spotting the Difference Reveals Finer Details for Visual
    Explanation", CVPR 2025, arXiv:2501.11309; https://github.com/Imageomics/Finer-CAM.
    """

    name = "finercam"
    formula = "Grad-CAM of sum_d p_d (y_c - alpha y_d) / sum_d p_d, d the classes nearest to c"
    cost = "1 forward + 1 backward to the layer"
    shares_capture = False
    trains = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        alpha: float = 1.0,
        comparison: Sequence[int] = (1, 2, 3),
        base: str = "gradcam",
        **options,
    ):
        super().__init__(model, target_layer, **options)
        base_class = registered_class(base)
        if not issubclass(base_class, GradientCAM) or not base_class.channel_sum or base_class.shares_capture is False:
            raise ValueError(f"Finer-CAM's base must be a plain gradient CAM such as gradcam or layercam, not {base!r}")
        ranks = list(comparison)
        if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
            raise ValueError(
                f"comparison holds ranks of similar classes, ints >= 1 (1 = the nearest); got {comparison!r}"
            )
        self.alpha, self.comparison, self.base = float(alpha), ranks, base_class
        self.contributions = base_class.contributions  # type: ignore[method-assign]  # the base CAM's rule

    def explained_scores(self, output, scores: Tensor, ids: Tensor) -> Tensor:
        if (ids == -1).any():
            raise ValueError("Finer-CAM compares class logits; pass class targets, not a callable")
        output = class_logits(output)
        if not isinstance(output, Tensor) or output.dim() != 2:
            raise ValueError("Finer-CAM compares class logits, and the model does not return (N, num_classes) logits")
        ranks = [rank for rank in self.comparison if rank < output.shape[1]]
        if not ranks:  # a single class: nothing to compare with
            return scores
        columns = ids if ids.dim() == 2 else ids[:, None]
        logits = output.float()
        probabilities = logits.softmax(dim=1)
        per_target = []
        for c in columns.unbind(dim=1):
            own = logits.gather(1, c[:, None])
            distance = (logits - own).abs().scatter(1, c[:, None], -1.0)  # c itself comes first
            similar = distance.argsort(dim=1, stable=True)[:, ranks]
            p = probabilities.gather(1, similar)
            per_target.append((p * (own - self.alpha * logits.gather(1, similar))).sum(1) / p.sum(1))
        finer = torch.stack(per_target, dim=1).to(scores.dtype)
        return finer if ids.dim() == 2 else finer[:, 0]
