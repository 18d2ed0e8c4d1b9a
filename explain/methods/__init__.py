"""The explanation methods, one module per family.

- :mod:`~explain.methods.gradient_cams`: maps from a layer's activations and gradients
  (Grad-CAM, Grad-CAM++, XGrad-CAM, HiResCAM, LayerCAM, the element-wise and Eigen variants,
  SmoothGrad-CAM++, Shapley-CAM, Finer-CAM);
- :mod:`~explain.methods.combined_cams`: CAMs made of another CAM's maps (RefineCAM, a base
  CAM's maps at several layers multiplied);
- :mod:`~explain.methods.full_gradient`: FullGrad, through every layer with a bias;
- :mod:`~explain.methods.gradient_free_cams`: maps from activations alone (CAM, Eigen-CAM,
  KPCA-CAM, FEM, Random-CAM) and the image's edges (Sobel-CAM, a baseline);
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
  Relevance Propagation, Excitation Backprop and its contrastive form;
- :mod:`~explain.methods.perturbation_attribution`: maps of the input from perturbed
  copies, through captum (Occlusion, LIME, KernelSHAP, Shapley value sampling, Feature Ablation
  over superpixels), and RISE;
- :mod:`~explain.methods.segment_attribution`: the perturbation methods (and XRAI) over the
  caller's segments (``segments=``: masks, overlapping or not, or a label image);
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
what the attribution methods share (targets, channel reduction, normalisation, baselines);
:mod:`~explain.methods.captum_adapter` is the one module that reaches into captum's private
parts. A new method is one class in its family's module, over
:class:`~explain.methods.cam_base.BaseCAM` (or :class:`~explain.Explainer`), registered with
:func:`explain.register`: this package exports every registered class by name.
"""

# Importing a family module registers its methods (the star imports bind its names here, for
# static type checkers too); every registered class is exported by name below, with the
# bases a method builds on: the registry is the list.
from ..base import registered
from .attribution_base import (
    Attribution,  # noqa: F401 -- in __all__ (BASES)
    normalize_maps,  # noqa: F401 -- CONCEPT_SUPPORT
)
from .cam_base import BaseCAM, Captured, explain_together  # noqa: F401
from .combined_cams import *  # noqa: F403 -- each family's names, for static type checkers
from .drise import *  # noqa: F403
from .full_gradient import *  # noqa: F403
from .gradient_attribution import *  # noqa: F403
from .gradient_cams import *  # noqa: F403
from .gradient_free_cams import *  # noqa: F403
from .layer_attribution import *  # noqa: F403
from .layer_replay import LayerReplay  # noqa: F401
from .mask_optimisation import *  # noqa: F403
from .noise_tunnel import *  # noqa: F403
from .path_attribution import *  # noqa: F403
from .perturbation_attribution import *  # noqa: F403
from .perturbation_cams import *  # noqa: F403
from .region_attribution import *  # noqa: F403
from .relevance import *  # noqa: F403
from .relevance import restored_modules  # noqa: F401 -- CONCEPT_SUPPORT
from .relevance.composites import LRP_COMPOSITES, check_canonical_output, mean_and_std  # noqa: F401
from .segment_attribution import TakesSegments  # noqa: F401 -- in __all__ (SUPPORT)
from .transformer_attention import *  # noqa: F403

#: What the methods build on, exported with them by :mod:`explain` too.
BASES = ("Attribution", "BaseCAM", "GradientCAM", "NoiseTunnel", "explain_together")
#: What the methods' bases hand a subclass, exported here only.
SUPPORT = ("Captured", "LayerReplay", "TakesSegments", "TransformerAttention")
#: What the concept layer (:mod:`explain.concepts`, built on LRP) takes from the methods'
#: modules, exported here only (not in ``__all__``): LRP's composites, its canonizers'
#: restoration and output check, the model's normalisation, and the attributions' scaling.
CONCEPT_SUPPORT = ("LRP_COMPOSITES", "check_canonical_output", "mean_and_std", "normalize_maps", "restored_modules")
#: The built-in methods' classes by class name, in the order they are listed.
METHOD_CLASSES = {cls.__name__: cls for cls in registered().values() if cls.__module__.startswith(f"{__name__}.")}

__all__ = [*BASES, *SUPPORT, *METHOD_CLASSES]  # noqa: PLE0604 -- built from the registry
