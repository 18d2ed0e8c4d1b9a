"""Relevance propagation, computed by zennit: the score (or a top-down signal) handed back
from the output, layer by layer, with a rule per kind of layer.

- :mod:`~explain.methods.relevance.rules`: the rules, as zennit hooks;
- :mod:`~explain.methods.relevance.canonizers`: the model put in a form whose every step a
  rule can read (batch norms merged, residual additions as modules), and put back;
- :mod:`~explain.methods.relevance.tracing`: what one forward pass shows (the batch norms to
  merge, the first convolution, merges no rule covers);
- :mod:`~explain.methods.relevance.composites`: which rule each layer gets;
- :mod:`~explain.methods.relevance.lrp`: Layer-wise Relevance Propagation (:class:`~explain.LRP`);
- :mod:`~explain.methods.relevance.attnlrp`: AttnLRP, LRP for transformers (:class:`~explain.AttnLRP`), with
  its rules as modified gradients (:mod:`~explain.methods.relevance.attention_rules`) and the
  canonizer of its layer norms and activations (:mod:`~explain.methods.relevance.transformer_canonizers`);
- :mod:`~explain.methods.relevance.excitation`: Excitation Backprop and its contrastive form
  (:class:`~explain.ExcitationBackprop`, :class:`~explain.ContrastiveExcitationBackprop`).

Residual additions and batch norms are not layers a rule can read, so the model is first put
in a canonical form (zennit's *canonizers*, undone after the call): each batch norm that
receives a layer's output is merged into that layer, and the residual additions of
torchvision's ResNet, MobileNetV2 / V3, EfficientNet and RegNet blocks and timm's EfficientNet
/ MobileNet blocks become zennit ``Sum`` modules.
"""

from .attnlrp import AttnLRP
from .canonizers import ResidualSumCanonizer, TracedMergeBatchNorm, restored_modules
from .excitation import ContrastiveExcitationBackprop, ExcitationBackprop, excitation_layer
from .lrp import FIRST_RULES, LRP
from .rules import SharingRule
from .tracing import traced_batch_norm_pairs, unseen_merges

__all__ = [
    "FIRST_RULES",
    "LRP",
    "AttnLRP",
    "ContrastiveExcitationBackprop",
    "ExcitationBackprop",
    "ResidualSumCanonizer",
    "SharingRule",
    "TracedMergeBatchNorm",
    "excitation_layer",
    "restored_modules",
    "traced_batch_norm_pairs",
    "unseen_merges",
]
