"""explain: why did a PyTorch image model decide what it decided?

>>> import explain, torch, torchvision
>>> model = torchvision.models.resnet18().eval()
>>> cam = explain.GradCAM(model)                      # target layer picked automatically
>>> res = cam(torch.rand(2, 3, 64, 64))
>>> res.layers, tuple(res.maps.shape), res.targets.shape
(('layer4',), (2, 64, 64), torch.Size([2]))
"""

import importlib
import sys
import types

_SUBMODULES = ("methods", "metrics", "models", "tasks")
# Where each public name lives. Importing `explain` imports none of them (nor torch): the
# command line answers --help at once, and a Ray driver plans a run without torch's memory.
_LOCATIONS = {
    "Explainer": "base",
    "NotApplicable": "base",
    "register": "base",
    "describe_methods": "catalogue",
    "explainer": "catalogue",
    "method_class": "catalogue",
    "method_names": "catalogue",
    "AblationCAM": "methods",
    "AttentionRelevance": "methods",
    "AttentionRollout": "methods",
    "Attribution": "methods",
    "BaseCAM": "methods",
    "CAM": "methods",
    "Deconvolution": "methods",
    "DeepLift": "methods",
    "DeepLiftShap": "methods",
    "EigenCAM": "methods",
    "EigenGradCAM": "methods",
    "FEM": "methods",
    "FeatureAblation": "methods",
    "FinerCAM": "methods",
    "FullGrad": "methods",
    "GradCAM": "methods",
    "GradCAMElementWise": "methods",
    "GradCAMPlusPlus": "methods",
    "GradientCAM": "methods",
    "GradientShap": "methods",
    "GuidedBackprop": "methods",
    "GuidedGradCAM": "methods",
    "HiResCAM": "methods",
    "ISCAM": "methods",
    "InputXGradient": "methods",
    "IntegratedGradients": "methods",
    "KPCACAM": "methods",
    "KernelShap": "methods",
    "LRP": "methods",
    "LayerCAM": "methods",
    "LeGrad": "methods",
    "Lime": "methods",
    "Occlusion": "methods",
    "RandomCAM": "methods",
    "SSCAM": "methods",
    "Saliency": "methods",
    "ScoreCAM": "methods",
    "ShapleyCAM": "methods",
    "SmoothGrad": "methods",
    "SmoothGradCAMPlusPlus": "methods",
    "VarGrad": "methods",
    "XGradCAM": "methods",
    "explain_together": "methods",
    "Explanation": "explanation",
    "LayerCapture": "hooks",
    "candidate_layers": "layers",
    "find_target_layer": "layers",
    "denormalize": "overlay",
    "normalization_of": "overlay",
    "overlay": "overlay",
    "plot_explanations": "overlay",
    "to_rgb": "overlay",
    "DetectionTarget": "tasks",
    "SegmentationTarget": "tasks",
    "explain_detections": "tasks",
    "TokenLayout": "tokens",
    "feature_maps": "model_summary",
    "summary": "model_summary",
}

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
    "method_class",
    "method_names",
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


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _LOCATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'explain' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """``explain.overlay`` is the function that draws a map, though the name is also a
    submodule: importing a submodule binds its name on the package, and here that binding
    does not replace the function."""

    def __setattr__(self, name, value):
        if name == "overlay" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
