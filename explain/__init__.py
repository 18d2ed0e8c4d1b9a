"""explain: why did a PyTorch image model decide what it decided?

>>> import explain, torch, torchvision
>>> model = torchvision.models.resnet18().eval()
>>> cam = explain.GradCAM(model)                      # target layer picked automatically
>>> res = cam(torch.rand(2, 3, 64, 64))
>>> res.layers, tuple(res.maps.shape), res.targets.shape
(('layer4',), (2, 64, 64), torch.Size([2]))
"""

from . import models
from .base import Explainer, describe_methods, explainer, methods, register
from .cam import (
    EigenGradCAM,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    GradientCAM,
    HiResCAM,
    LayerCAM,
    XGradCAM,
    explain_together,
)
from .explanation import Explanation
from .hooks import LayerCapture
from .layers import candidate_layers, find_target_layer
from .overlay import denormalize, normalization_of, overlay, plot_explanations, to_rgb

__version__ = "0.1.0"

__all__ = [
    "EigenGradCAM",
    "Explainer",
    "Explanation",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "GradientCAM",
    "HiResCAM",
    "LayerCAM",
    "LayerCapture",
    "XGradCAM",
    "candidate_layers",
    "denormalize",
    "describe_methods",
    "explain_together",
    "explainer",
    "find_target_layer",
    "methods",
    "models",
    "normalization_of",
    "overlay",
    "plot_explanations",
    "register",
    "to_rgb",
]
