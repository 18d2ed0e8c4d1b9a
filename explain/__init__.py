"""explain: why did a PyTorch image model decide what it decided?

>>> import explain, torch, torchvision
>>> model = torchvision.models.resnet18().eval()
>>> cam = explain.GradCAM(model)                      # target layer picked automatically
>>> res = cam(torch.rand(2, 3, 64, 64))
>>> res.layers, tuple(res.maps.shape), res.targets.shape
(('layer4',), (2, 64, 64), torch.Size([2]))
"""

from . import metrics, models, tasks
from .base import Explainer, NotApplicable, describe_methods, explainer, methods, register
from .methods import (
    AblationCAM,
    AttentionRelevance,
    AttentionRollout,
    Attribution,
    BaseCAM,
    CAM,
    Deconvolution,
    DeepLift,
    DeepLiftShap,
    EigenCAM,
    EigenGradCAM,
    FEM,
    FeatureAblation,
    FinerCAM,
    FullGrad,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    GradientCAM,
    GradientShap,
    GuidedBackprop,
    GuidedGradCAM,
    HiResCAM,
    ISCAM,
    InputXGradient,
    IntegratedGradients,
    KPCACAM,
    KernelShap,
    LRP,
    LayerCAM,
    LeGrad,
    Lime,
    Occlusion,
    RandomCAM,
    SSCAM,
    Saliency,
    ScoreCAM,
    ShapleyCAM,
    SmoothGrad,
    SmoothGradCAMPlusPlus,
    VarGrad,
    XGradCAM,
    explain_together,
)
from .explanation import Explanation
from .hooks import LayerCapture
from .layers import candidate_layers, find_target_layer
from .model_summary import feature_maps, summary
from .overlay import denormalize, normalization_of, overlay, plot_explanations, to_rgb
from .tasks import DetectionTarget, SegmentationTarget, explain_detections
from .tokens import TokenLayout

# Importing the package explain.methods bound its name here; the name stays the function
# that lists the methods (the package is reached by `from explain.methods import ...`).
from .base import methods  # noqa: E402,F811

__version__ = "0.1.0"

__all__ = [
    "AblationCAM",
    "AttentionRelevance",
    "AttentionRollout",
    "Attribution",
    "BaseCAM",
    "CAM",
    "Deconvolution",
    "DetectionTarget",
    "DeepLift",
    "DeepLiftShap",
    "EigenCAM",
    "EigenGradCAM",
    "Explainer",
    "Explanation",
    "FEM",
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
    "HiResCAM",
    "ISCAM",
    "InputXGradient",
    "IntegratedGradients",
    "KPCACAM",
    "KernelShap",
    "LRP",
    "LayerCAM",
    "LeGrad",
    "NotApplicable",
    "LayerCapture",
    "Lime",
    "Occlusion",
    "RandomCAM",
    "SSCAM",
    "SegmentationTarget",
    "Saliency",
    "ScoreCAM",
    "ShapleyCAM",
    "SmoothGrad",
    "SmoothGradCAMPlusPlus",
    "TokenLayout",
    "VarGrad",
    "XGradCAM",
    "candidate_layers",
    "denormalize",
    "describe_methods",
    "explain_detections",
    "explain_together",
    "explainer",
    "feature_maps",
    "find_target_layer",
    "methods",
    "metrics",
    "models",
    "tasks",
    "normalization_of",
    "overlay",
    "plot_explanations",
    "register",
    "summary",
    "to_rgb",
]
