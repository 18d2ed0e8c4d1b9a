"""Gradient attributions: maps of the input from the gradient of the explained score,
computed by captum.

What this module adds to captum:

- Guided Backprop and Deconvolution are guided at every ReLU-like module
  (:data:`RELU_LIKE`: ReLU6, LeakyReLU, SiLU, GELU, Hardswish, ... and timm's own
  activation modules), not only at ``nn.ReLU``, where captum stops: on a ReLU6 network such
  as the bundled EfficientNet-Lite0, captum's versions silently equal the plain gradient;
- DeepLift and DeepLiftShap apply the rescale rule at every element-wise activation
  (captum's only at ReLU, ELU, LeakyReLU, Sigmoid, Tanh, Softplus), which is what makes
  completeness hold on ReLU6 models, and support an activation module used more than once
  in a forward pass (torchvision's ResNet blocks call their ReLU twice);
- every method that multiplies the batch (IG steps, noise samples, Shap baselines) runs it
  in internal batches of at most ``internal_batch_size`` rows, with the same result
  (GradientShap: draws from the same distribution, as captum draws per call);
- random draws are seeded per image (``seed``), so an image's map does not depend on the
  other images of its batch.

Activations applied as functions inside ``forward`` (``F.relu(x)``, as torchvision's
Inception and GoogLeNet do) are not modules, so no hook reaches them: there, Guided
Backprop and Deconvolution follow the plain gradient and DeepLift the gradient rule.
"""

from __future__ import annotations

from typing import Any, ClassVar

import captum.attr as captum_attr
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import register
from ..baselines import make_baselines, seeded
from ..checks import checked_number, interpolation_mode, positive_int
from ..layers import LayerSpec
from .attribution_base import Attribution, Batched, ScoredModel, WithBaseline, rows_per_pass, slice_target
from .captum_adapter import DeconvolutionAt, GuidedBackpropAt, RescaleDeepLift, RescaleDeepLiftShap
from .gradient_cams import GradCAM

__all__ = [
    "RELU_LIKE",
    "Deconvolution",
    "DeepLift",
    "DeepLiftShap",
    "GradientShap",
    "GuidedBackprop",
    "GuidedGradCAM",
    "InputXGradient",
    "Saliency",
    "SmoothGrad",
    "VarGrad",
    "is_relu_like",
]

#: The rectifier-like activation modules of torch (and so of torchvision) that Guided
#: Backprop and Deconvolution guide. Gates (Sigmoid, Tanh) are not rectifiers and are left alone.
RELU_LIKE: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.RReLU,
    nn.ELU,
    nn.CELU,
    nn.SELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Hardswish,
    nn.Softplus,
)
# timm's own activation modules (timm.layers.activations and activations_me), by class name,
# so that explain does not import timm for them.
_TIMM_RELU_LIKE = frozenset(
    {
        "Swish",
        "SwishMe",
        "Mish",
        "MishMe",
        "HardSwish",
        "HardSwishMe",
        "HardMish",
        "HardMishMe",
        "GELU",
        "GELUTanh",
        "QuickGELU",
        "PReLU",
    }
)
_TIMM_GATES = frozenset({"Sigmoid", "Tanh", "HardSigmoid", "HardSigmoidMe"})


def is_relu_like(module: nn.Module) -> bool:
    """Whether Guided Backprop and Deconvolution guide the gradient through ``module``.

    >>> is_relu_like(nn.ReLU6()), is_relu_like(nn.Sigmoid())
    (True, False)
    """
    if isinstance(module, RELU_LIKE):
        return True
    kind = type(module)
    return kind.__module__.startswith("timm.") and kind.__name__ in _TIMM_RELU_LIKE


def _is_elementwise_activation(module: nn.Module) -> bool:
    kind = type(module)
    return (
        is_relu_like(module)
        or isinstance(module, (nn.Sigmoid, nn.Tanh, nn.Hardsigmoid))
        or (kind.__module__.startswith("timm.") and kind.__name__ in _TIMM_GATES)
    )


def _guided_backprop(model: nn.Module) -> GuidedBackpropAt:
    return GuidedBackpropAt(model, guided=is_relu_like)


def _deconvolution(model: nn.Module) -> DeconvolutionAt:
    return DeconvolutionAt(model, guided=is_relu_like)


class _OnePass(Attribution):
    """A captum method of one forward and one backward pass on the images."""

    family = "gradient attribution"
    cost = "1 forward + 1 backward"
    single_pass = True
    #: The captum class (or a static function of the model that makes one) that computes it,
    #: and the options it is called with.
    captum_method: ClassVar[Any]
    captum_options: ClassVar[dict] = {}

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        return self.captum_method(scored).attribute(images, target=scored.target(k), **self.captum_options)


@register
class Saliency(_OnePass):
    """Saliency: the gradient of the score with respect to the input, dS/dx.

    Simonyan et al., "Deep Inside Convolutional Networks: Visualising Image Classification
    Models and Saliency Maps", ICLR workshop 2014, sec. 3.1. Their map is the largest
    absolute gradient over the colour channels: ``reduction="max-abs"``.
    """

    name = "saliency"
    formula = 'dS/dx (the paper\'s map: `reduction="max-abs"`)'
    runs_on = "captum `Saliency`"
    captum_method = captum_attr.Saliency
    captum_options: ClassVar[dict] = {"abs": False}  # raw keeps the sign; the reduction takes magnitudes


@register
class InputXGradient(_OnePass):
    """Input x Gradient: x * dS/dx, each input's first-order contribution to the score.

    Shrikumar et al., "Not Just a Black Box: Learning Important Features Through
    Propagating Activation Differences", arXiv:1605.01713, 2016.
    """

    name = "inputxgrad"
    formula = "x ⊙ dS/dx"
    runs_on = "captum `InputXGradient`"
    captum_method = captum_attr.InputXGradient


class _NoiseTunnel(Batched):
    """The saliency of noisy copies of the image, aggregated by ``nt_type``."""

    nt_type: ClassVar[str] = ""
    family = "gradient attribution"
    cost = "1 forward + {n_samples} forward + backward"

    def __init__(self, model: nn.Module, *, n_samples: int = 50, noise_level: float = 0.15, **options):
        super().__init__(model, **options)
        self.n_samples = positive_int("n_samples", n_samples)
        self.noise_level = checked_number("noise_level", noise_level, positive=True)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_samples)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        rows = self.rows(images, self.n_samples)
        tunnel = captum_attr.NoiseTunnel(captum_attr.Saliency(scored))
        target = scored.target(k)
        # sigma is relative to each image's own range (the paper's sigma / (x_max - x_min)),
        # so each image has its own stdev: captum takes one per call.
        spans = (images.flatten(1).amax(1) - images.flatten(1).amin(1)).tolist()
        results = []
        for i, span in enumerate(spans):
            with seeded(self.seed, images.device):
                results.append(
                    tunnel.attribute(
                        images[i : i + 1],
                        nt_type=self.nt_type,
                        nt_samples=self.n_samples,
                        nt_samples_batch_size=rows,
                        stdevs=self.noise_level * span,
                        target=slice_target(target, slice(i, i + 1)),
                        abs=False,
                    )
                )
        return torch.cat(results)


@register
class SmoothGrad(_NoiseTunnel):
    """SmoothGrad: the input gradient averaged over noisy copies of the image.

    The mean of dS/dx over ``n_samples`` copies x + N(0, sigma^2), with sigma =
    ``noise_level`` * (max(x) - min(x)) per image.

    Smilkov et al., "SmoothGrad: removing noise by adding noise", arXiv:1706.03825, 2017
    (sec. 3: n = 50, noise level 10-20 %). Runs through captum's NoiseTunnel over Saliency,
    in internal batches of ``internal_batch_size`` noisy copies; ``seed`` fixes the noise
    (``None``: the caller's random stream).
    """

    name = "smoothgrad"
    formula = "mean of dS/dx over {n_samples:code} copies x + N(0, ({noise_level:value}·range)²)"
    runs_on = "captum `NoiseTunnel`"
    nt_type = "smoothgrad"


@register
class VarGrad(_NoiseTunnel):
    """VarGrad: the variance of the input gradient over noisy copies of the image.

    Noise and samples as in :class:`SmoothGrad`.

    Adebayo et al., "Local Explanation Methods for Deep Neural Networks Lack Sensitivity to
    Parameter Values", ICLR workshop 2018. Runs through captum's NoiseTunnel over Saliency.
    Variances are non-negative, so its maps carry no sign.
    """

    name = "vargrad"
    formula = "variance of dS/dx over {n_samples:code} copies x + N(0, ({noise_level:value}·range)²)"
    runs_on = "captum `NoiseTunnel`"
    nt_type = "vargrad"
    nonnegative = True


@register
class GuidedBackprop(_OnePass):
    """Guided Backprop: the gradient with negative gradients stopped at every ReLU.

    Negative gradients are zeroed at every ReLU-like module on the way back, on top of
    the module's own gradient (zero where a ReLU's input was negative).

    Springenberg et al., "Striving for Simplicity: The All Convolutional Net", ICLR
    workshop 2015, fig. 1. Runs captum's GuidedBackprop, extended from ``nn.ReLU`` to every
    module in ``RELU_LIKE`` (see the module docstring) and timm's activations; ``F.relu`` calls inside ``forward``
    are not reached (see the module docstring).
    """

    name = "guidedbp"
    formula = "the gradient guided at every ReLU-like module: only positive gradients pass where the input is positive"
    runs_on = "captum, extended"
    captum_method = staticmethod(_guided_backprop)


@register
class Deconvolution(_OnePass):
    """Deconvolution: the gradient passed through a ReLU of itself at every ReLU.

    Every ReLU-like module passes back ReLU(gradient), whatever its forward input was.

    Zeiler and Fergus, "Visualizing and Understanding Convolutional Networks", ECCV 2014,
    sec. 2.1. Runs captum's Deconvolution, extended as Guided Backprop is.
    """

    name = "deconv"
    formula = "the gradient guided at every ReLU-like module: only positive gradients pass, whatever the input"
    runs_on = "captum, extended"
    captum_method = staticmethod(_deconvolution)


@register
class GuidedGradCAM(Attribution):
    """Guided Grad-CAM: Guided Backprop times the upsampled Grad-CAM map.

    The Grad-CAM map is upsampled bilinearly to the input; both are for the same target.

    Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", ICCV 2017, sec. 3.1. The Grad-CAM map is explain's
    :class:`~explain.GradCAM` at ``target_layer`` (picked automatically by default), the
    guided part :class:`GuidedBackprop`. ``raw`` is their product, per channel.
    """

    name = "guidedgradcam"
    formula = "`guidedbp` ⊙ Grad-CAM upsampled bilinearly"
    runs_on = "explain + captum"
    family = "gradient attribution"
    cost = "2 forward + 2 backward (one to the layer)"
    needs_layer = True
    single_pass = True

    def __init__(self, model: nn.Module, target_layer: LayerSpec = None, **options):
        super().__init__(model, **options)
        self.cam = GradCAM(model, target_layer, class_names=self.class_names)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        guided = _guided_backprop(scored).attribute(images, target=scored.target(k))
        targets = scored.custom if scored.custom is not None else scored.ids_of(k)
        cams = list(self.cam._explain(images, targets).raw_layers.values())  # inside this call: its lock held
        size, mode = tuple(images.shape[2:]), interpolation_mode(images.dim() - 2)
        if len(cams) > 1:  # each layer on the same scale, as the CAMs average their scaled maps
            cams = [c / c.flatten(1).amax(1).clamp_min(1e-12).view(-1, *[1] * (c.dim() - 1)) for c in cams]
        cam = torch.stack([F.interpolate(c[:, None], size=size, mode=mode, align_corners=False) for c in cams])
        return guided * cam.mean(dim=0)

    def check(self, images: Tensor, targets=None, *, topk: int | None = None) -> None:
        super().check(images, targets, topk=topk)
        self.cam.check(images, targets, topk=topk)

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return self.cam.layer_names(images)


#: What an (image, baseline) pair of captum's DeepLift costs, in rows of a plain backward pass:
#: two rows, and the inputs and outputs of every activation that its rule's hooks keep besides
#: autograd's (the bundled model, two photos and their baselines: 0.69 GB against 0.44 for a
#: plain backward pass of four rows).
PAIR_ROWS = 4


def pair_rows(internal_batch_size: int | None) -> int:
    """Rows per (image, baseline) pair: two of the caller's ``internal_batch_size``, or
    :data:`PAIR_ROWS` of the memory budget's."""
    return 2 if internal_batch_size is not None else PAIR_ROWS


@register
class DeepLift(WithBaseline):
    """DeepLift: contributions to S(x) - S(x') by the rescale rule.

    Each element-wise activation passes the gradient scaled by (f(x) - f(x')) / (x - x'),
    so the attributions sum to S(x) - S(x') for a baseline x'.

    Shrikumar et al., "Learning Important Features Through Propagating Activation
    Differences", ICML 2017, sec. 3.5.1 (rescale) and eq. 1 (summation-to-delta). Runs
    captum's DeepLift with the rule at every element-wise activation (see the module
    docstring): on the bundled ReLU6 model completeness then holds, which it does not with
    captum's own rules. Multiplicative gates (squeeze-and-excitation) fall outside the
    rule, and completeness is only approximate there. Images run in internal batches
    of ``internal_batch_size`` rows (two per image: the image and its baseline).
    """

    name = "deeplift"
    formula = "rescale rule: contributions summing to S(x) - S(x')"
    runs_on = "captum, extended"
    family = "gradient attribution"
    cost = "1 forward + backward of 2 rows"
    single_pass = True  # its pass starts with the images (up to internal_batch_size / 2 of them)
    check_runs = True  # what its rules refuse (a module on parallel branches) shows only in a full pass

    def planned_passes(self, images: Tensor) -> int:
        return 2 * len(images)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        baselines = self.baselines(scored, images)
        step = rows_per_pass(self.rows(images, 2 * len(images)), pair_rows(self.internal_batch_size))
        deeplift = RescaleDeepLift(scored, rescaled=_is_elementwise_activation)
        if len(images) <= step:  # one pass, on the images then their baselines: it reads the targets
            return deeplift.attribute(images, baselines=baselines)
        if scored.ids is None:
            scored.resolve(images)
        scored.column = None  # each internal batch gets its targets from captum
        target = scored.target(k)
        return torch.cat(
            [
                deeplift.attribute(
                    images[i : i + step],
                    baselines=baselines[i : i + step],
                    target=slice_target(target, slice(i, i + step)),
                )
                for i in range(0, len(images), step)
            ]
        )


class _Shap(Batched):
    """An attribution averaged over a distribution of ``n_baselines`` baselines per image."""

    family = "gradient attribution"

    def __init__(self, model: nn.Module, *, baseline: str | float | Tensor = "noise", n_baselines: int = 16, **options):
        super().__init__(model, **options)
        if isinstance(baseline, str) and baseline not in ("noise", "zeros"):
            raise ValueError(
                f"baseline {baseline!r} is not a distribution; use 'noise', 'zeros', "
                "or a tensor (B, C, H, W) of baselines"
            )
        self.baseline = baseline
        self.n_baselines = positive_int("n_baselines", n_baselines)

    def _distribution_size(self) -> int:
        if isinstance(self.baseline, Tensor):
            return len(self.baseline)
        return self.n_baselines if self.baseline == "noise" else 1

    def distribution(self, image: Tensor) -> Tensor:
        """The baselines (B, C, H, W) of one image (1, C, H, W); noise is drawn on the image's
        own seeded stream, so it does not depend on the rest of the batch."""
        if isinstance(self.baseline, Tensor):
            if self.baseline.dim() != image.dim() or self.baseline.shape[1:] != image.shape[1:]:
                raise ValueError(
                    f"a baseline distribution must have shape (B, {', '.join(map(str, image.shape[1:]))}), "
                    f"got {tuple(self.baseline.shape)}"
                )
            return self.baseline.to(image.device, image.dtype)
        if self.baseline != "noise":  # one fixed baseline: a distribution of one
            return make_baselines(image, self.baseline)
        with seeded(self.seed, image.device):
            return make_baselines(image.expand(self.n_baselines, *image.shape[1:]), "noise")


@register
class DeepLiftShap(_Shap):
    """DeepLiftShap: DeepLift averaged over a distribution of baselines (SHAP values).

    Lundberg and Lee, "A Unified Approach to Interpreting Model Predictions", NeurIPS 2017,
    sec. 4.2 (Deep SHAP). Runs captum's DeepLiftShap with explain's DeepLift rules. The
    baselines default to ``n_baselines`` draws of uniform noise in each image's channel
    ranges: SHAP is an expectation over a background distribution. With one fixed baseline
    (``"zeros"``, a number) it is DeepLift's result, at DeepLift's cost. The baselines run
    in internal batches; the result is their mean either way.
    """

    name = "deepliftshap"
    formula = "DeepLift averaged over a distribution of {n_baselines:code} baselines"
    runs_on = "captum, extended"
    cost = "1 forward + 1 forward + backward of 2 x {n_baselines} rows"
    check_runs = True

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + 2 * self._distribution_size())

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        target = scored.target(k)
        step = max(2, self.rows(images, 2 * self._distribution_size()) // pair_rows(self.internal_batch_size))
        deeplift = RescaleDeepLiftShap(scored, rescaled=_is_elementwise_activation)
        results = []
        for i in range(len(images)):
            baselines = self.distribution(images[i : i + 1])
            total = torch.zeros_like(images[i : i + 1])
            for start in range(0, len(baselines), step):
                chunk = baselines[start : start + step]
                if len(chunk) == 1:  # captum wants two: the same one twice has the same mean
                    chunk = chunk.expand(2, -1, -1, -1)
                part = deeplift.attribute(
                    images[i : i + 1], baselines=chunk, target=slice_target(target, slice(i, i + 1))
                )
                total += part * min(len(chunk), len(baselines) - start)
            results.append(total / len(baselines))
        return torch.cat(results)


@register
class GradientShap(_Shap):
    """GradientShap: expected gradients over baselines from a distribution (SHAP values).

    The expected value of (x - x') * dS/dx at x' + a (x - x'), over baselines x' from a
    distribution and a ~ U(0, 1), estimated from ``n_samples`` draws per image (plus
    Gaussian noise of ``stdevs`` on the input).

    Lundberg and Lee, "A Unified Approach to Interpreting Model Predictions", NeurIPS 2017;
    as implemented by captum's GradientShap (expected gradients, Erion et al., Nature
    Machine Intelligence 2021). Baselines as in :class:`DeepLiftShap`. Samples run in
    internal batches of ``internal_batch_size`` rows; captum draws each batch's baselines
    and path positions anew, so the batch size changes the draws, not their distribution.
    """

    name = "gradientshap"
    formula = "expected gradients over a baseline distribution, {n_samples:code} draws"
    runs_on = "captum `GradientShap`"
    cost = "1 forward + {n_samples} forward + backward"

    def __init__(self, model: nn.Module, *, n_samples: int = 50, stdevs: float = 0.0, **options):
        super().__init__(model, **options)
        self.n_samples = positive_int("n_samples", n_samples)
        self.stdevs = checked_number("stdevs (the input noise's standard deviation)", stdevs, positive=False)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_samples)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        target = scored.target(k)
        step = self.rows(images, self.n_samples)
        shap = captum_attr.GradientShap(scored)
        results = []
        for i in range(len(images)):
            baselines = self.distribution(images[i : i + 1])
            total = torch.zeros_like(images[i : i + 1])
            with seeded(self.seed, images.device):
                for start in range(0, self.n_samples, step):
                    count = min(step, self.n_samples - start)
                    part = shap.attribute(
                        images[i : i + 1],
                        baselines=baselines,
                        n_samples=count,
                        stdevs=self.stdevs,
                        target=slice_target(target, slice(i, i + 1)),
                    )
                    total += part * count
            results.append(total / self.n_samples)
        return torch.cat(results)
