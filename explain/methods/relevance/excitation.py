"""Excitation Backprop and contrastive Excitation Backprop: a top-down signal passed from the
output down to a layer as a probability, computed by zennit with this package's canonizers.

Zhang, Bargal, Lin, Brandt, Shen and Sclaroff, "Top-down Neural Attention by Excitation
Backprop", ECCV 2016 (the journal version: IJCV 126, 2018). A neuron a_j passes its marginal
winning probability P(a_j) to its inputs a_i in proportion to their excitatory
contributions, a_i w_ij^+ (sec. 3.2):

    P(a_i) = sum_j  a_i w_ij^+ / (sum_i' a_i' w_i'j^+)  P(a_j),

starting from P = 1 at the explained output unit. The map at a layer is each location's
probability summed over the layer's channels; contrastive Excitation Backprop (sec. 3.3)
subtracts the map of the dual unit, the output unit whose weights are negated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar

import torch
from torch import Tensor, nn

from ...attention_capture import has_attention
from ...base import NotApplicable, register
from ...checks import channel_hint, check_images, checked_number
from ...hooks import check_layers_ran
from ...layers import LayerSpec, candidate_layers, find_target_layer
from ...targets import Targets, class_logits, custom_target, select_targets
from ..attribution_base import attribution_context
from ..cam_base import BaseCAM, Captured, check_image_rows, detached, layer_layout, output_tensors
from .canonizers import restored_modules
from .composites import check_canonical_output, excitation_composite, registered_composite
from .tracing import RuleSpans, on_every_path, reshaped_from, traced_layers, unruled_steps

__all__ = ["ContrastiveExcitationBackprop", "ExcitationBackprop", "excitation_layer"]


def excitation_layer(model: nn.Module, example: Tensor) -> str:
    """The layer Excitation Backprop reads its map at by default: one stage before the CAMs'
    layer (:func:`~explain.find_target_layer`), the last layer to run before it whose output
    has more locations and that every path from the image to the output goes through (not a
    branch of a residual block): stride 16 where the CAMs' is at stride 32, ``layer3`` of a
    ResNet, ``features.29`` of VGG16. The paper reads its maps at intermediate layers, for
    their finer grid. The CAMs' layer where none is finer.

    >>> import torchvision
    >>> excitation_layer(torchvision.models.resnet18(), torch.rand(1, 3, 64, 64))
    'layer3'
    """
    chosen = find_target_layer(model, example)
    layers = candidate_layers(model, example)
    names = [info.name for info in layers]
    if chosen not in names:
        return chosen
    sizes = [math.prod(info.shape[2:]) for info in layers]
    end = names.index(chosen)
    finer = [name for name, size in zip(names[:end], sizes[:end], strict=True) if size > sizes[end]]
    passed = on_every_path(model, example, finer) if finer else []
    return passed[-1] if passed else chosen


@contextmanager
def _layer_outputs(layers: dict[str, nn.Module]) -> Iterator[dict[str, Tensor]]:
    """The output of each of ``layers`` in the forward passes run in the block."""
    outputs: dict[str, Tensor] = {}

    def keep(name: str) -> Callable:
        def hook(module: nn.Module, inputs, output) -> None:
            if name in outputs:
                raise ValueError(f"layer {name!r} runs twice in a forward pass; pick a layer that runs once")
            outputs[name] = output

        return hook

    handles = [layer.register_forward_hook(keep(name)) for name, layer in layers.items()]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


@register
class ExcitationBackprop(BaseCAM):
    """Excitation Backprop: the marginal winning probability of a layer's neurons, summed over channels.

    The explained class's output unit holds the probability P = 1 (a callable target f:
    the top-down signal df/dz at the output z), which each layer hands down to its inputs in
    proportion to their excitatory contributions, P(a_i) = sum_j a_i w_ij^+ / (sum_i' a_i'
    w_i'j^+) P(a_j), the biases left out; the map at ``target_layer`` is sum_k P(a^k), a
    probability distribution over the layer's locations. It sums to 1 unless neurons on the
    way are excited by their bias alone (the rule leaves biases out): on the bundled model,
    trained, all of P reaches ``blocks.6`` and 0.16 - 0.22 of it ``blocks.5.0.bn1``, the
    default layer, past depthwise layers with many such units (the four photos in data/images).

    Zhang et al., "Top-down Neural Attention by Excitation Backprop", ECCV 2016, sec. 3.2;
    the journal version, IJCV 126, 2018. The rule runs on every convolution and dense layer
    (zennit's ``ZPlus``, which for the negative inputs of signed activations counts a_i^-
    with w^-, where the paper's activations are non-negative); average pools and residual
    sums divide in proportion to their inputs, max pools route as the gradient does, batch
    norms that follow a layer are merged into it, other norms and element-wise activations
    pass P, and squeeze-excitation gates and ConvNeXt's layer scales are constant weights
    that pass P (the canonizers of :class:`~explain.LRP`). ``target_layer`` defaults to one
    stage before the CAMs' layer (see :func:`~explain.methods.relevance.excitation_layer`;
    the paper reads its maps at intermediate layers).

    Refused with :class:`~explain.NotApplicable`: models with attention, and models with a
    step above the layer that no rule covers (an addition or product written in
    ``forward`` that no canonizer turns into a module; a group norm; a pooling called as a
    function outside torchvision's DenseNet, MobileNetV2 and ShuffleNetV2). Activations that
    can be negative (GELU, SiLU, the linear bottlenecks of MobileNets) give probabilities of
    either sign where the paper's ReLU networks give non-negative ones; the map is their
    positive part. Matches TorchRay's ``excitation_backprop`` on ReLU networks (to rounding,
    with its stabiliser); TorchRay passes batch norms unchanged (the same where their scale
    is positive), applies the gradient at activations other than ReLU, and adds residual
    sums as modules only in torchvision's ResNets.
    """

    name = "excitation-backprop"
    formula = (
        "sum_k P(A^k), the winning probability handed down from P = 1 at the class: P(a_i) = sum_j a_i "
        "w_ij^+ / (sum_i' a_i' w_i'j^+) P(a_j); by default one stage before the CAMs' layer"
    )
    runs_on = "zennit, with canonizers"
    family = "relevance"
    cost = "3 forward + 1 backward to the layer, each layer rerun twice by its rule"
    uses_gradients = True
    shares_capture = False
    #: Whether the map is the target's minus its dual unit's (contrastive Excitation Backprop).
    contrastive: ClassVar[bool] = False

    def __init__(self, model: nn.Module, target_layer: LayerSpec = None, *, stabilizer: float = 1e-6, **options):
        super().__init__(model, target_layer, **options)
        self.stabilizer = checked_number("stabilizer", stabilizer, positive=True)

    def target_layers(self, images: Tensor) -> dict[str, nn.Module]:
        """The layers to explain; the automatic choice (:func:`~explain.methods.relevance.excitation_layer`)
        is made once."""
        if self._layers is None:
            self._refuse_attention()
            name = excitation_layer(self.model, images[:1])
            self._layers = {name: self.model.get_submodule(name)}
        return self._layers

    def _refuse_attention(self) -> None:
        if has_attention(self.model):
            raise NotApplicable(
                f"{self.name} passes probabilities through convolutions, dense layers and pools; no rule covers "
                "attention (the softmax and the product of queries, keys and values): for a transformer use "
                "attention-relevance, legrad or gradcam"
            )

    def capture(
        self, images: Tensor, targets: Targets = None, *, topk: int | None = None, gradients: bool | None = None
    ) -> Captured:
        """One reference forward pass (the targets), one traced on the first image (the batch
        norms to merge, the classifier), one with the rules registered, and one backward pass
        to the layer per target (two for the contrastive form)."""
        images = check_images(images, self.model)
        self.check_applies(images)
        self._refuse_attention()
        layers = self.target_layers(images)
        custom = custom_target(targets)
        with attribution_context(self.model), channel_hint(images):
            if images.is_inference():  # made under inference_mode: autograd cannot use it
                images = images.clone()
            with torch.no_grad():
                reference = self.model(images)
            _, ids = select_targets(reference, targets, topk=topk, class_names=self.class_names)

            def scores(output) -> Tensor:  # (N, targets)
                if custom is not None:
                    return custom(output)[:, None]
                return class_logits(output).gather(1, ids.view(len(images), -1))

            outputs, probabilities = self._winning_probabilities(images, layers, reference, scores, custom is None)
        for name in layers:
            check_image_rows(name, outputs[name], images)
        layouts = {name: layer_layout(self.reshape, self.model, name, outputs[name], images) for name in layers}
        return Captured(
            {name: layouts[name].to_spatial(outputs[name].detach()).float() for name in layers},
            {name: [layouts[name].to_spatial(p).float() for p in probabilities[name]] for name in layers},
            detached(reference),
            ids,
            tuple(images.shape[2:]),
            images,
            custom,
            layouts=layouts,
            layer_outputs={name: outputs[name].detach() for name in layers},
        )

    def _winning_probabilities(
        self,
        images: Tensor,
        layers: dict[str, nn.Module],
        reference,
        scores: Callable[[object], Tensor],
        logits: bool,
    ) -> tuple[dict[str, Tensor], dict[str, list[Tensor]]]:
        """The layers' outputs and, per target, their neurons' winning probabilities (the
        contrastive form: the target's minus its dual unit's), under the rules."""
        model, dual = self.model, {"on": False}
        traced = traced_layers(model, images)
        composite = excitation_composite(traced, lambda: dual["on"], self.stabilizer)
        with restored_modules(model), registered_composite(composite, model):
            ruled = [module for name, module in model.named_modules() if composite.module_map({}, name, module)]
            with RuleSpans(ruled) as spans, _layer_outputs(layers) as outputs:
                output = model(images.detach().requires_grad_())
            check_layers_ran(layers, outputs)
            explained, wanted = (class_logits(output), class_logits(reference)) if logits else (output, reference)
            for got, expected in zip(output_tensors(explained), output_tensors(wanted), strict=True):
                check_canonical_output(got, expected, "Excitation Backprop")
            self._check_path(explained, spans, outputs, traced.last, layers)
            selected = scores(output)
            probabilities: dict[str, list[Tensor]] = {name: [] for name in layers}
            for k in range(selected.shape[1]):
                passes = []
                for negated in (False, True) if self.contrastive else (False,):
                    dual["on"] = negated
                    passes.append(torch.autograd.grad(selected[:, k].sum(), list(outputs.values()), retain_graph=True))
                dual["on"] = False
                for name, *found in zip(outputs, *passes, strict=True):
                    probabilities[name].append((found[0] - found[1] if self.contrastive else found[0]).detach())
        return outputs, probabilities

    def channel_terms(self, captured: Captured, layer: str, k: int) -> Tensor:
        """The winning probabilities of target ``k``'s neurons at ``layer``, (N, C, h, w)."""
        return captured.gradients[layer][k]

    def _check_path(self, output, spans: RuleSpans, outputs: dict[str, Tensor], classifier, layers) -> None:
        """NotApplicable where a step between the layers and the output has no rule; for the
        contrastive form, also where the output is not the classifier's (the last dense or
        convolutional layer to run), whose weights the dual unit negates."""
        stop = {tensor.grad_fn for tensor in outputs.values()}
        # the output's tensors that the image reaches (that have an autograd graph)
        tensors = [tensor for tensor in output_tensors(output) if tensor.grad_fn is not None]
        steps = sorted({step for tensor in tensors for step in unruled_steps(tensor, spans.spans, stop)})
        if steps:
            raise NotApplicable(
                f"{self.name} has no rule for steps of this model between the target layer and the output "
                f"({', '.join(steps)}): additions or products written in forward that no canonizer turns into a "
                "module, group norms, poolings called as functions; pick a later target_layer, or explain with "
                "gradcam"
            )
        if not self.contrastive:
            return
        if classifier is None or any(classifier is m for layer in layers.values() for m in layer.modules()):
            raise ValueError(
                f"{self.name} subtracts the map of the dual unit, whose weights are the classifier's negated: pick a "
                "target_layer before the classifier (the last dense or convolutional layer to run)"
            )
        last = spans.outputs.get(classifier)
        if len(tensors) != 1 or last is None or not reshaped_from(tensors[0], last):
            raise NotApplicable(
                f"{self.name}'s dual unit negates the weights of the layer whose outputs are the model's scores; here "
                f"the last dense or convolutional layer ({type(classifier).__name__}) is followed by other steps: "
                "use excitation-backprop"
            )


@register
class ContrastiveExcitationBackprop(ExcitationBackprop):
    """Contrastive Excitation Backprop: the target's winning probabilities at a layer minus those of its dual unit.

    The dual unit is the explained output unit with the classifier's weights negated (the
    "non-target"): its winning probabilities, passed down by the same rule, are subtracted
    from the target's at ``target_layer`` and the map is the positive part of the
    difference summed over channels, max(0, sum_k P(a^k) - P_dual(a^k)), which keeps the
    evidence for the class that is not evidence against it.

    Zhang et al., "Top-down Neural Attention by Excitation Backprop", ECCV 2016, sec. 3.3;
    the journal version, IJCV 126, 2018. The rule is linear in the signal below the
    classifier, so subtracting at the layer equals subtracting at any layer between it and
    the classifier (TorchRay's ``contrast_layer``). The classifier is the last dense or
    convolutional layer to run, whose outputs must be the model's scores (reshaped at
    most); otherwise :class:`~explain.NotApplicable`. Rules, default layer and refusals as
    :class:`ExcitationBackprop`. Matches TorchRay's ``contrastive_excitation_backprop`` on
    ReLU networks.
    """

    name = "c-excitation-backprop"
    formula = "sum_k P(A^k) - P_dual(A^k), P_dual from the dual unit (the classifier's weights negated)"
    runs_on = "zennit, with canonizers"
    cost = "3 forward + 2 backward to the layer, each layer rerun twice by its rule"
    contrastive = True
