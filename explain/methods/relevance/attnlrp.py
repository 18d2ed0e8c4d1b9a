"""AttnLRP: Layer-wise Relevance Propagation for transformers (:class:`~explain.AttnLRP`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial

import torch
from torch import Tensor, nn
from zennit.core import Composite

from ...attention_capture import has_attention, ruled_attention
from ...base import NotApplicable, register
from ..attribution_base import Attribution, ScoredModel
from ..cam_base import output_tensors
from .attention_rules import ATTENTION_RULES, IdentityRule, SoftmaxRecord, UniformRule, attnlrp_attention, cp_attention
from .canonizers import restored_modules
from .composites import registered_composite
from .tracing import nonlinear_steps
from .transformer_canonizers import RuledForwardCanonizer

__all__ = ["AttnLRP", "attends", "attnlrp_rules"]

#: The autograd steps that carry AttnLRP's rules, and those among them that make products.
_RULE_STEPS = frozenset({f"{IdentityRule.__name__}Backward", f"{UniformRule.__name__}Backward"})
_PRODUCT_RULES = frozenset({f"{UniformRule.__name__}Backward"})
# Where the rules do not reach, what a model of a known family computes instead.
_HINTS = {
    "torchvision.models.swin_transformer": (
        "torchvision's Swin forms its window attention in shifted_window_attention with explicit products "
        "(q @ k^T, softmax, @ v) that no rule can reach; timm's Swin calls F.scaled_dot_product_attention, "
        "which AttnLRP covers"
    ),
    "timm.models.maxxvit": (
        "MaxViT's MBConv blocks gate their channels by squeeze-excitation, x * sigmoid(...), a product of two "
        "activations that no AttnLRP rule covers"
    ),
}


def attends(model: nn.Module) -> bool:
    """Whether ``model`` has attention layers: :func:`~explain.attention_capture.has_attention`'s,
    or modules whose class name says attention (timm's MaxViT: ``AttentionCl``, ``Attention2d``)."""
    return has_attention(model) or any("Attention" in type(module).__name__ for module in model.modules())


@contextmanager
def attnlrp_rules(model: nn.Module, attention: str = "attnlrp", record: SoftmaxRecord | None = None) -> Iterator[None]:
    """Within the block, ``model``'s forward passes on this thread carry AttnLRP's rules, so
    that the gradient of a score times the input is its relevance: attention by
    ``attention`` (:data:`ATTENTION_RULES`), layer norms and element-wise activations as
    :class:`~explain.methods.relevance.transformer_canonizers.RuledForwardCanonizer` says.
    ``record`` collects each attention's logits and weights. Everything is put back after
    the block, also after an error; parameters keep their ``requires_grad`` (freeze them
    where no gradient of theirs is wanted)."""
    if attention not in ATTENTION_RULES:
        raise ValueError(f"unknown attention rule {attention!r}; use one of {', '.join(ATTENTION_RULES)}")
    rule = partial(attnlrp_attention, record=record) if attention == "attnlrp" else cp_attention
    with ExitStack() as context:
        context.enter_context(restored_modules(model))
        context.enter_context(registered_composite(Composite(canonizers=[RuledForwardCanonizer()]), model))
        context.enter_context(ruled_attention(model, rule))
        yield


@register
class AttnLRP(Attribution):
    """AttnLRP: the score handed back to the pixels by Layer-wise Relevance Propagation
    through a transformer's attention, layer norms and non-linearities.

    Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
    Transformers", ICML 2024. With R_j the relevance of output j of a step, its inputs get

    - linear layers (the patch embedding, the projections of queries, keys, values and
      outputs, the MLP's layers, the head): LRP-epsilon with epsilon -> 0, R_i = sum_j
      x_i w_ij / z_j R_j (the paper's Eq. 8), the biases keeping their share b_j / z_j R_j;
      residual sums and the addition of position embeddings the same (R_i = x_i / z R);
    - the products Q K^T and A V: the uniform rule over each product (Proposition 3.3):
      half the relevance to each factor, after LRP-epsilon over the sum of products;
    - the softmax s = softmax(x): its Taylor decomposition at x with bias (Proposition 3.1),
      R_i = x_i (R'_i - s_i sum_j R'_j), R' the relevance of the attention weights;
    - layer norms: the standard deviation taken as a constant, so the identity rule on the
      division by it (Proposition 3.4), LRP-epsilon on the centring and the affine map;
    - element-wise activations (GELU, SiLU, ...): the identity rule, R_x = R_y (Eq. 9).

    ``attention="cp"`` takes CP-LRP's rule instead (Ali et al., "XAI for Transformers:
    Better Explanations through Conservative Propagation", ICML 2022): the attention
    weights are constants, all of A V's relevance goes to V, none to the queries and keys.
    The explained class c starts with R = z_c; a callable target f with R = z * df/dz at the
    output.

    Computed as the paper's reference implementation (``lxt``) computes it, as a modified
    gradient: the relevance of a pixel is the pixel times a gradient whose backward steps
    carry the rules, in one forward and one backward pass. The call runs the model's
    attention explicitly (the fused kernels have no such steps), its layer norms and
    activations through forwards with the rules, then puts everything back.

    Conservation. The rules conserve relevance where no term is independent of the input:
    biases, the class token, position embeddings and relative position biases keep their
    share, and the softmax's Taylor bias what x (R' - s sum R') leaves, so the pixels'
    relevance is the score minus those shares, by the paper's definition (tested to 1e-9
    of the score in float64, the shares counted). With CP-LRP on a transformer with no
    such terms, the pixels' relevance is the score. The call does not warn about the gap.

    Why a method of its own, not a composite of :class:`~explain.LRP`: LRP's composites are
    zennit's rules for convolutional networks, each layer rerun by its rule, the biases'
    shares spread so that relevance is conserved; AttnLRP is one backward pass, with the
    paper's rules and shares, and applies to models with attention only (LRP refuses them,
    AttnLRP refuses models without). Models whose graph holds steps no rule covers
    (activations called as functions, products of two activations outside attention, such
    as squeeze-excitation gates, norms other than layer norm) raise
    :class:`~explain.NotApplicable` naming them.

    >>> import torchvision
    >>> vit = torchvision.models.VisionTransformer(
    ...     32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32
    ... )
    >>> result = AttnLRP(vit.eval())(torch.randn(1, 3, 32, 32))
    >>> result.raw.shape
    torch.Size([1, 3, 32, 32])
    """

    name = "attnlrp"
    formula = (
        "R_x = x * g, g the score's gradient with the paper's rules on its backward steps: LRP-epsilon on "
        "linear maps, half of a product's relevance to each factor, the softmax's Taylor rule, the layer "
        "norm's standard deviation and the activations passed through ({attention:code}: attnlrp or cp)"
    )
    runs_on = "explain (the rules as lxt applies them)"
    family = "gradient attribution"
    images_only = "its rules are written for transformers over image patches (tested on ViT, DeiT, BEiT)"
    cost = "1 forward + 1 backward"
    single_pass = True
    check_runs = True  # steps no rule covers show only in a full pass

    def __init__(self, model: nn.Module, *, attention: str = "attnlrp", **options):
        super().__init__(model, **options)
        if attention not in ATTENTION_RULES:
            raise ValueError(f"unknown attention rule {attention!r}; use one of {', '.join(ATTENTION_RULES)}")
        self.attention = attention

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        """One forward pass with the rules, the first of the call (it resolves the targets);
        the score's gradient times the images."""
        if not attends(self.model):
            raise NotApplicable(
                "AttnLRP's rules are LRP's for attention, and this model has no attention layer; for a "
                "convolutional network use lrp, whose composites are written for convolutions"
            )
        inputs = images.detach().requires_grad_()
        outputs: list = []
        with attnlrp_rules(self.model, self.attention):
            handle = self.model.register_forward_hook(lambda module, args, output: outputs.append(output))
            try:
                score = scored(inputs)
            finally:
                handle.remove()
            # The rules run from the model's output: a callable target is linearised there.
            roots = output_tensors(outputs[0])
            if k == 0 and (uncovered := nonlinear_steps(roots, inputs, _RULE_STEPS, _PRODUCT_RULES)):
                raise NotApplicable(self._uncovered(uncovered))
            (gradient,) = torch.autograd.grad(score.sum(), inputs)
        return inputs.detach() * gradient

    def _uncovered(self, steps: list[str]) -> str:
        hints = [hint for home, hint in _HINTS.items() if type(self.model).__module__ == home]
        return (
            f"AttnLRP has no rule for steps of this model between the image and the score: {', '.join(steps)} "
            "(activations called as functions, products of two activations outside attention such as gates, "
            "norms other than layer norm, or attention computed outside F.scaled_dot_product_attention)"
            + "".join(f"; {hint}" for hint in hints)
        )
