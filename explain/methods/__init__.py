"""The explanation methods, one module per family.

- :mod:`~explain.methods.gradient_cams`: maps from a layer's activations and gradients
  (Grad-CAM, Grad-CAM++, XGrad-CAM, HiResCAM, LayerCAM, the element-wise and Eigen variants,
  SmoothGrad-CAM++, Shapley-CAM, Finer-CAM);
- :mod:`~explain.methods.full_gradient`: FullGrad, through every layer with a bias;
- :mod:`~explain.methods.gradient_free_cams`: maps from activations alone (CAM, Eigen-CAM,
  KPCA-CAM, FEM, Random-CAM);
- :mod:`~explain.methods.perturbation_cams`: channel weights from perturbed passes
  (Score-CAM, SS-CAM, IS-CAM, Ablation-CAM);
- :mod:`~explain.methods.gradient_attribution`: maps of the input from gradients, through
  captum (Saliency, Input x Gradient, SmoothGrad, VarGrad, Guided Backprop, Deconvolution,
  Guided Grad-CAM, DeepLift, DeepLiftShap, GradientShap);
- :mod:`~explain.methods.path_attribution`: gradients integrated along a path to the image
  (Integrated Gradients, Guided IG, Blur IG);
- :mod:`~explain.methods.layer_attribution`: attributions of a hidden layer's units, or of the
  input to one neuron, through captum (layer Integrated Gradients, conductance, internal
  influence, layer Gradient x Activation);
- :mod:`~explain.methods.region_attribution`: image regions ranked by their attribution (XRAI);
- :mod:`~explain.methods.relevance`: relevance propagated through zennit's rules: Layer-wise
  Relevance Propagation, AttnLRP (transformers), Excitation Backprop and its contrastive form;
- :mod:`~explain.methods.perturbation_attribution`: maps of the input from perturbed
  copies, through captum (Occlusion, LIME, KernelSHAP, Shapley value sampling, Feature Ablation
  over superpixels), and RISE;
- :mod:`~explain.methods.mask_optimisation`: the smooth mask of a given area that keeps
  the score, found by gradient descent (extremal perturbations);
- :mod:`~explain.methods.drise`: D-RISE, a detected box's saliency from randomly masked copies;
- :mod:`~explain.methods.noise_tunnel`: SmoothGrad, SmoothGrad-squared and VarGrad of any
  method (``smoothgrad:ig``);
- :mod:`~explain.methods.transformer_attention`: maps from a vision transformer's attention
  matrices (attention rollout, gradient-weighted attention relevance, LeGrad).

:mod:`~explain.methods.cam_base` holds what they share (the capture, ``eigen_smooth``,
``aug_smooth``, :func:`explain_together`); :mod:`~explain.methods.layer_replay` runs the
layers after a target layer on their own; :mod:`~explain.methods.attribution_base` holds
what the attribution methods share (targets, channel reduction, normalisation, baselines).
A new method is one class over :class:`~explain.methods.cam_base.BaseCAM` (or
:class:`~explain.Explainer`), registered with :func:`explain.register`.
"""

# The import order is the order explain.method_names() lists the methods in.
from .gradient_cams import (  # isort: skip
    EigenGradCAM,
    FinerCAM,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    GradientCAM,
    HiResCAM,
    LayerCAM,
    ShapleyCAM,
    SmoothGradCAMPlusPlus,
    XGradCAM,
)
from .gradient_free_cams import CAM, FEM, KPCACAM, EigenCAM, RandomCAM  # isort: skip
from .perturbation_cams import ISCAM, SSCAM, AblationCAM, ScoreCAM  # isort: skip
from .full_gradient import FullGrad  # isort: skip
from .gradient_attribution import (  # isort: skip
    Deconvolution,
    DeepLift,
    DeepLiftShap,
    GradientShap,
    GuidedBackprop,
    GuidedGradCAM,
    InputXGradient,
    Saliency,
    SmoothGrad,
    VarGrad,
)
from .path_attribution import BlurIG, GuidedIG, IntegratedGradients  # isort: skip
from .layer_attribution import (  # isort: skip
    InternalInfluence,
    LayerConductance,
    LayerGradientXActivation,
    LayerIntegratedGradients,
)
from .region_attribution import XRAI  # isort: skip
from .perturbation_attribution import (  # isort: skip
    RISE,
    FeatureAblation,
    KernelShap,
    Lime,
    Occlusion,
    ShapleyValueSampling,
)
from .mask_optimisation import ExtremalPerturbation  # isort: skip
from .drise import DRISE  # isort: skip
from .relevance import LRP, AttnLRP, ContrastiveExcitationBackprop, ExcitationBackprop  # isort: skip
from .transformer_attention import AttentionRelevance, AttentionRollout, LeGrad, TransformerAttention  # isort: skip
from .noise_tunnel import NoiseTunnel  # isort: skip
from .attribution_base import Attribution  # isort: skip
from .cam_base import BaseCAM, Captured, explain_together  # isort: skip
from .layer_replay import LayerReplay  # isort: skip

__all__ = [
    "CAM",
    "DRISE",
    "FEM",
    "ISCAM",
    "KPCACAM",
    "LRP",
    "RISE",
    "SSCAM",
    "XRAI",
    "AblationCAM",
    "AttentionRelevance",
    "AttentionRollout",
    "AttnLRP",
    "Attribution",
    "BaseCAM",
    "BlurIG",
    "Captured",
    "ContrastiveExcitationBackprop",
    "Deconvolution",
    "DeepLift",
    "DeepLiftShap",
    "EigenCAM",
    "EigenGradCAM",
    "ExcitationBackprop",
    "ExtremalPerturbation",
    "FeatureAblation",
    "FinerCAM",
    "FullGrad",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "GradientCAM",
    "GradientShap",
    "GuidedBackprop",
    "GuidedGradCAM",
    "GuidedIG",
    "HiResCAM",
    "InputXGradient",
    "IntegratedGradients",
    "InternalInfluence",
    "KernelShap",
    "LayerCAM",
    "LayerConductance",
    "LayerGradientXActivation",
    "LayerIntegratedGradients",
    "LayerReplay",
    "LeGrad",
    "Lime",
    "NoiseTunnel",
    "Occlusion",
    "RandomCAM",
    "Saliency",
    "ScoreCAM",
    "ShapleyCAM",
    "ShapleyValueSampling",
    "SmoothGrad",
    "SmoothGradCAMPlusPlus",
    "TransformerAttention",
    "VarGrad",
    "XGradCAM",
    "explain_together",
]
