"""FullGrad: the input-gradient and the bias-gradients of every layer, aggregated.

Unlike the other CAMs it has no target layer: it explains through every convolution and
batch norm with a bias, so its backward pass runs all the way to the input.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import Explainer, register
from ..checks import channel_hint, check_images
from ..explanation import Explanation, scale_maps
from ..hooks import LayerCapture
from ..layers import module_calls
from ..targets import Targets, class_logits, custom_target, select_targets
from .cam_base import detached

__all__ = ["FullGrad", "bias_of"]

_EPS = 1e-6  # as in the authors' post-processing


def bias_of(module: nn.Module) -> Tensor | None:
    """The bias a layer adds to each output channel: a convolution's own, or batch norm's
    implicit beta - gamma * mean / sqrt(var + eps) in eval mode; ``None`` for layers without."""
    if isinstance(module, nn.Conv2d):
        return None if module.bias is None else module.bias.detach()
    if isinstance(module, nn.BatchNorm2d):
        if module.running_mean is None or module.running_var is None:
            raise ValueError(
                f"{type(module).__name__} without running statistics normalises each batch by itself, "
                "so it has no fixed bias for FullGrad; explain a model in eval mode with tracked statistics"
            )
        scale = torch.rsqrt(module.running_var + module.eps)
        weight = module.weight.detach() if module.weight is not None else torch.ones_like(scale)
        bias = module.bias.detach() if module.bias is not None else torch.zeros_like(scale)
        return bias - module.running_mean * weight * scale
    return None


def _postprocess(values: Tensor) -> Tensor:
    """psi before resizing: absolute values, min-max scaled per image over (C, H, W)."""
    values = values.abs()
    flat = values.flatten(1)
    low = flat.amin(dim=1)[:, None, None, None]
    high = flat.amax(dim=1)[:, None, None, None]
    return (values - low) / (high - low + _EPS)


@register
class FullGrad(Explainer):
    """FullGrad: full-gradient saliency, the input-gradient plus every layer's bias-gradient.

    S = psi(grad_x f * x) + sum_layers sum_channels psi(grad_b f * b), where grad_b f * b is
    the gradient of the score with respect to a layer's output times the bias the layer adds
    (a convolution's bias, or batch norm's implicit beta - gamma mu / sqrt(var + eps)), and
    psi takes absolute values, min-max scales per image over all channels and locations, and
    resizes to the input (bilinear, align corners) before the channels are summed, as in the
    authors' code. Linear layers' bias-gradients have no spatial layout and are left out, as
    there. Other norm layers (group, layer norm) are not affine in their input and add no
    term. For timm's fused batch-norm-and-activation layers the gradient is taken before the
    activation, where the bias is added.

    Srinivas & Fleuret, "Full-Gradient Representation for Neural Network Visualization",
    NeurIPS 2019, eq. 4-5; https://github.com/idiap/fullgrad-saliency.
    """

    name = "fullgrad"
    formula = "psi(grad_x ⊙ x) + sum over layers of psi(bias-gradients); no target layer"
    runs_on = "explain"
    family = "gradient CAM"
    cost = "1 forward + 1 backward"
    needs_layer = False
    images_only = "its bias terms are read from 2-D convolutions and batch norms"

    def __init__(
        self,
        model: nn.Module,
        target_layer=None,
        *,
        class_names: Sequence[str] | None = None,
        eigen_smooth: bool = False,
        aug_smooth: bool = False,
    ):
        super().__init__(model, class_names=class_names)
        if target_layer is not None:
            raise ValueError("FullGrad explains through every layer with a bias; it takes no target_layer (pass None)")
        if eigen_smooth or aug_smooth:
            raise ValueError(
                "FullGrad is no sum over one layer's channels: eigen_smooth and aug_smooth do not apply to it"
            )
        self._layers: dict[str, tuple[nn.Module, nn.Module]] | None = None

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return ("input+biases",)

    def bias_layers(self, images: Tensor) -> dict[str, tuple[nn.Module, nn.Module]]:
        """``{name: (module whose output is captured, module that holds the bias)}`` for every
        layer with a bias that runs on ``images`` (found once, by one dry pass)."""
        if self._layers is None:
            calls = Counter(name for name, _, _ in module_calls(self.model, images[:1]))
            layers: dict[str, tuple[nn.Module, nn.Module]] = {}
            for name, module in self.model.named_modules():
                if not calls[name] or bias_of(module) is None:
                    continue
                if calls[name] > 1:
                    raise ValueError(
                        f"layer {name!r} runs {calls[name]} times per forward pass; FullGrad needs each once"
                    )
                if isinstance(module, nn.BatchNorm2d) and hasattr(module, "act"):  # timm's BatchNormAct2d
                    layers[name] = (
                        module.get_submodule("drop"),
                        module,
                    )  # its (identity) drop runs between norm and activation
                else:
                    layers[name] = (module, module)
            if not layers:
                raise ValueError(
                    "the model has no convolution or batch norm with a bias, so FullGrad has no bias terms"
                )
            self._layers = layers
        return self._layers

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        images = check_images(images, self.model)
        self.check_applies(images)
        layers = self.bias_layers(images)
        size = (images.shape[-2], images.shape[-1])
        with LayerCapture(self.model, {name: captured for name, (captured, _) in layers.items()}) as capture:
            x = images.clone().requires_grad_()
            with channel_hint(images):
                output = self.model(x)
            scores, ids = select_targets(output, targets, topk=topk, class_names=self.class_names)
            biases = {
                name: bias.float()[None, :, None, None]
                for name, (_, owner) in layers.items()
                if (bias := bias_of(owner)) is not None
            }  # (each has one: bias_layers picked them so)
            maps = []
            for column in (scores if scores.dim() == 2 else scores[:, None]).unbind(dim=1):
                (input_gradient,) = capture.backward(column, inputs=(x,))
                total = _postprocess(input_gradient.float() * images.float()).sum(dim=1)
                for name, bias in biases.items():
                    # Resizing is linear, so the channels are summed first: one map per layer
                    # to resize instead of one per channel.
                    term = _postprocess(capture.gradients[name].float() * bias).sum(dim=1, keepdim=True)
                    total = total + F.interpolate(term, size=size, mode="bilinear", align_corners=True)[:, 0]
                maps.append(total)
        raw = torch.stack(maps, dim=1)
        raw = raw.squeeze(1) if ids.dim() == 1 else raw
        custom = custom_target(targets) is not None
        logits = detached(output if custom else class_logits(output))
        return Explanation(
            scale_maps(raw, size), {self.layer_names(images)[0]: raw}, logits, ids, self.name, self.class_names
        )
