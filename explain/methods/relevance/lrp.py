"""Layer-wise Relevance Propagation (LRP), computed by zennit with the rules, canonizers and
composite of this package."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from zennit.core import Composite, Hook
from zennit.rules import Flat

from ...attention_capture import has_attention
from ...base import NotApplicable, register
from ...checks import checked_number
from ...targets import class_logits
from ..attribution_base import Attribution, ScoredModel
from ..cam_base import output_tensors
from .canonizers import restored_modules
from .composites import (
    LRP_COMPOSITES,
    check_canonical_output,
    lrp_composite,
    mean_and_std,
    registered_composite,
    zbox_bounds,
    zennit_composite,
)
from .rules import zbox_rule
from .tracing import unseen_merges

__all__ = ["FIRST_RULES", "LRP"]

#: The rules selectable for the first convolution, the one that sees the pixels.
FIRST_RULES = ("zbox", "flat")


@register
class LRP(Attribution):
    """Layer-wise Relevance Propagation (LRP): the score handed back to the pixels, layer by layer.

    The epsilon / gamma / z-box composite for CNNs; the pixels' relevance sums to the score.
    Models with attention layers (transformers) are refused with
    :class:`~explain.NotApplicable`: no rule here conserves relevance through attention.

    Bach et al., "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by
    Layer-Wise Relevance Propagation", PLoS ONE 10(7), 2015; rules and composite as in
    Montavon et al., "Layer-Wise Relevance Propagation: An Overview", in Explainable AI,
    LNCS 11700, 2019. Output j's relevance R_j goes to its inputs i by

    - dense layers, LRP-epsilon: R_i = sum_j (x_i w_ij + b_j / n_j) / (z_j + epsilon
      sign(z_j)) R_j;
    - convolutions, LRP-gamma: the same with w + gamma w^+ and b + gamma b^+ in place of w
      and b (for z_j >= 0; w^-, b^- where z_j < 0, and swapped for negative inputs, as
      zennit's ``Gamma``), which favours positive evidence and keeps denominators off zero;
    - the first convolution, on normalised (signed) pixels where z+ does not apply: the
      z-box rule (``first_rule="zbox"``), R_i = sum_j (x_i w_ij - l_i w_ij^+ - h_i w_ij^-)
      / sum_i' (...) R_j, with l and h the pixel range [0, 1] under ``normalization``
      (mean, std; default: a timm model's ``pretrained_cfg``, else ImageNet's), widened to
      the batch; or the flat rule (``"flat"``), R_j shared equally, ignoring the pixels;
    - sums (residual additions) and average pools: R_i proportional to x_i; activations
      and unmerged batch norms pass R unchanged; max pools route it as the gradient does.

    The explained class c starts with R = z_c; a callable target f with R = z * df/dz at
    the output, which sums to f(z) for any linear f.

    Conservation. The share of a neuron's bias, b_j / n_j, and what a stabiliser holds
    back go equally to its n_j inputs (the flat rule's division) instead of being absorbed.
    With the usual rules the biases (with the merged batch norms' shifts) absorb a third or
    more of the score on ResNets and nearly all of it on the bundled model; left out of the
    rules (zennit's ``zero_params="bias"``) they leave denominators near zero on the bundled
    model, whose depthwise convolutions see whole channels of zeros, and relevance explodes.
    Only ``epsilon`` absorbs, ``epsilon / (|z_j| + epsilon)`` of R_j at dense layers: the
    default 1e-6 keeps the sum; a larger one (Montavon et al. use 0.25) drops weak evidence
    on purpose. Measured ``|sum(R) - z_c| / |z_c|``, top class, photos from data/images,
    224 x 224; torchvision models with random weights and batch-norm statistics:

    ================================  ============  ============  ==============================
    LRP by                            resnet18      resnet50      efficientnet_lite0
    ================================  ============  ============  ==============================
    captum 0.9 ``LRP``                3e12 - 2e13   1e29 - 1e30   fails: no rule for Conv2dSame
    zennit 0.5.1 ``EpsilonGammaBox``  0.3 - 0.4     0.6 - 0.7     0.98 - 0.99
    the same, ``zero_params="bias"``  5e-5          1e-4          1e27 - 4e29
    this class                        4e-7          2e-7          < 2e-5
    ================================  ============  ============  ==============================

    zennit's rows use the canonizers of this class (with zennit's own only, the bundled
    model's sum is 110 times its score). captum copies relevance through every residual
    addition (no module, so no rule) and has no rule for timm's layers; zennit (Anders et
    al., arXiv:2106.13200) has canonizers and takes custom rules, so this class runs
    zennit, with the rules above.

    Composites. ``composite`` picks the rules: the default, ``"epsilon-gamma-box-shared"``,
    is the one above; zennit's ``"epsilon-gamma-box"``, ``"epsilon-plus-flat"``,
    ``"epsilon-alpha2-beta1"`` and ``"excitation-backprop"`` run as zennit defines them, with
    this class's canonizers (batch norms that are not merged and element-wise activations
    pass R, which zennit's ``ExcitationBackprop`` leaves to the gradient). Their rules keep
    each bias in its neuron's denominator, so the biases (the merged batch norms' shifts
    among them) absorb relevance by definition: the pixels' relevance sums to the score
    where the model has no biases (alpha-beta: also where every unit has positive and
    negative contributions), and the call does not warn about the gap. ``epsilon``,
    ``gamma`` and ``normalization`` (the z-box bounds) serve the composites with those
    rules; ``first_rule`` is the default's; zennit's first-layer rules go to the first
    convolution registered.

    Canonizers also take torchvision's ConvNeXt blocks (the residual addition as a sum,
    the layer scale and the layer norms as constant weights, which pass R), the
    squeeze-excitation gates of torchvision's MobileNetV3 and EfficientNet and of timm's
    models (the gate a constant weight: R passes through the gated path only, none into
    the branch that computes the gate), and the ReLU and pooling that torchvision's
    DenseNet, MobileNetV2 and ShuffleNetV2 call as functions (as modules). Measured
    ``|sum(R) - z_c| / |z_c|``, random weights and batch-norm statistics, 64 x 64:
    ConvNeXt-T 2e-6, EfficientNet-B0 1e-6 (timm's 1e-6), DenseNet-121 4e-7, MobileNetV2
    3e-6, MobileNetV3-S 1e-4 (its score of 0.013 is near epsilon).

    Not covered: residual additions and gates that no canonizer here turns into a module
    copy relevance, and activations called as functions (``F.relu``: GoogLeNet) drop the
    relevance that reaches their inactive units. A score near epsilon (an untrained
    network's logits of 1e-9) is absorbed. The call warns when the graph holds such an
    addition or product of two activations, or, with epsilon at most 1e-4, when the pixels'
    relevance misses the score by over 1 %. Norms that do not follow a layer (pre-activation
    batch norms, as in DenseNet; layer norms) are not merged: their statistics taken as
    constants, R passes them unchanged. The model's parameters, buffers, hooks and flags
    are as they were after the call, bitwise, also when it fails.

    >>> import torchvision
    >>> result = LRP(torchvision.models.resnet18().eval())(torch.randn(1, 3, 64, 64))
    >>> score = result.logits.max().item()
    >>> abs(result.raw.sum().item() - score) < 1e-4 * abs(score)
    True
    """

    name = "lrp"
    formula = (
        "relevance propagated with an epsilon / gamma / first-layer composite, the biases shared so that "
        "it sums to the score; `composite=` also takes zennit's `epsilon-gamma-box`, `epsilon-plus-flat`, "
        "`epsilon-alpha2-beta1`, `excitation-backprop` (biases absorbed; on the command line `-M "
        "lrp:composite=epsilon-plus-flat`)"
    )
    runs_on = "zennit, with canonizers"
    family = "gradient attribution"
    images_only = "its box rule's bounds and canonizers are written for 2-D convolutions"
    cost = "3 forward + 1 backward, each layer rerun about 8 times by its rule"
    check_runs = True  # a model its canonical form cannot reproduce shows only in a full pass

    def __init__(
        self,
        model: nn.Module,
        *,
        composite: str = LRP_COMPOSITES[0],
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        first_rule: str | None = None,
        normalization: tuple[Sequence[float], Sequence[float]] | None = None,
        **options,
    ):
        super().__init__(model, **options)
        if composite not in LRP_COMPOSITES:
            raise ValueError(f"unknown composite {composite!r}; use one of {', '.join(LRP_COMPOSITES)}")
        self.composite_name = composite
        self.epsilon = checked_number("epsilon", epsilon, positive=True)
        self.gamma = checked_number("gamma", gamma, positive=False)
        if first_rule is not None and composite != LRP_COMPOSITES[0]:
            raise ValueError(f"first_rule is a choice of the {LRP_COMPOSITES[0]} composite; {composite} has its own")
        if first_rule not in (None, *FIRST_RULES):
            raise ValueError(f"unknown first_rule {first_rule!r}; use one of {', '.join(FIRST_RULES)}")
        self.first_rule = first_rule or FIRST_RULES[0]
        self.mean, self.std = mean_and_std(model, normalization)

    def bounds(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """The z-box bounds (N, C, 1, 1): pixels 0 and 1 normalised, widened to each image."""
        return zbox_bounds(images, self.mean, self.std)

    def composite(self, model: nn.Module, images: Tensor) -> Composite:
        """The rules and canonizers for ``model`` on ``images``."""
        if self.composite_name != LRP_COMPOSITES[0]:
            return zennit_composite(
                self.composite_name, model, images, self.bounds(images), epsilon=self.epsilon, gamma=self.gamma
            )
        first: Hook = zbox_rule(*self.bounds(images)) if self.first_rule == "zbox" else Flat()
        return lrp_composite(model, images, first, gamma=self.gamma, epsilon=self.epsilon)

    registered = staticmethod(registered_composite)

    def attribute_targets(self, scored: ScoredModel, images: Tensor) -> list[Tensor]:
        """One canonical forward pass with the rules registered, one backward pass per target."""
        if has_attention(scored.model):
            raise NotApplicable(
                "LRP's rules here are for CNNs: none conserves relevance through attention (the softmax and the "
                "product of queries, keys and values); for a transformer use attention-relevance (Chefer et al.), "
                "legrad or gradcam"
            )
        model, reference = scored.model, scored.output
        inputs = images.detach().requires_grad_()
        relevances = []
        with restored_modules(model), self.registered(self.composite(model, images), model):
            output = model(inputs)
            if scored.custom is None:  # a dict, namedtuple or Hugging Face output: its logits, as elsewhere
                output = class_logits(output)
            produced, expected = _scored_tensors(output, reference, len(images))
            for got, wanted in zip(produced, expected, strict=True):
                check_canonical_output(got, wanted)
            merges = sum(unseen_merges(tensor) for tensor in produced)
            for k in range(scored.num_targets):
                starts = _start_relevance(scored, output, produced, k)
                last = k == scored.num_targets - 1
                (relevance,) = torch.autograd.grad(produced, inputs, grad_outputs=starts, retain_graph=not last)
                if k == 0:
                    score = torch.stack([start.flatten(1).sum(dim=1) for start in starts]).sum(dim=0)
                    self._check_conservation(relevance, score, merges)
                relevances.append(relevance)
        return relevances

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        return self.attribute_targets(scored, images)[k]

    def _check_conservation(self, relevance: Tensor, score: Tensor, merges: int) -> None:
        """Warn where the pixels' relevance does not sum to the output's (``score``: the
        relevance handed in at the output, per image): a larger epsilon absorbs some on
        purpose, anything else means parts of the model no rule covers."""
        gap = float(((relevance.flatten(1).sum(dim=1) - score).abs() / score.abs().clamp_min(1e-12)).max())
        if merges:
            cause = (
                f"the model adds or multiplies two activations outside any module (found: {merges}; "
                "residual additions or gates no canonizer covers), which copies relevance"
            )
        elif gap > 0.01 and self.epsilon <= 1e-4 and self.composite_name == LRP_COMPOSITES[0]:
            cause = "relevance is lost or copied where no rule applies (e.g. activations called as functions)"
        else:
            return
        # One message per cause (no figures in it), so Python shows it once, not per batch.
        warnings.warn(f"LRP: the pixels' relevance does not sum to the score: {cause}", stacklevel=4)


def _scored_tensors(output, reference, rows: int) -> tuple[list[Tensor], list[Tensor]]:
    """The tensors of the canonical model's ``output`` that relevance starts from (floating,
    one row per image, on autograd's graph: the logits, or for a callable target each such
    tensor of a dict or tuple output), with the model's own (``reference``) at their places."""
    produced, expected = output_tensors(output), output_tensors(reference)
    if len(produced) != len(expected):
        raise RuntimeError("LRP's canonical form of the model returns other outputs than the model")
    kept = [
        (got, wanted)
        for got, wanted in zip(produced, expected, strict=True)
        if got.is_floating_point() and got.requires_grad and got.dim() >= 1 and got.shape[0] == rows
    ]
    if not kept:
        raise TypeError(
            f"LRP needs a model output with a tensor of one row per image, got {type(output).__name__}; "
            "explain class ids, which LRP reads by the output's logits"
        )
    return [got for got, _ in kept], [wanted for _, wanted in kept]


def _start_relevance(scored: ScoredModel, output, produced: list[Tensor], k: int) -> list[Tensor]:
    """The relevance at each of the ``produced`` outputs: the explained logit in its place, or
    z * df/dz for a callable target f (of the whole ``output``, whose tensors they are)."""
    if scored.custom is not None:
        gradients = torch.autograd.grad(scored.custom(output).sum(), produced, retain_graph=True, allow_unused=True)
        return [
            torch.zeros_like(z) if gradient is None else (z * gradient).detach()
            for z, gradient in zip(produced, gradients, strict=True)
        ]
    (logits,) = produced
    ids = scored.ids_of(k)[:, None]
    return [torch.zeros_like(logits).scatter(1, ids, logits.gather(1, ids)).detach()]
