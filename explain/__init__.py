"""explain: why did a PyTorch image model decide what it decided?

>>> import explain, torch, torchvision
>>> model = torchvision.models.resnet18().eval()
>>> cam = explain.GradCAM(model)                      # target layer picked automatically
>>> res = cam(torch.rand(2, 3, 64, 64))
>>> res.layers, tuple(res.maps.shape), res.targets.shape
(('layer4',), (2, 64, 64), torch.Size([2]))
"""

import importlib

#: Subpackages that ``explain.NAME`` imports on first use.
_SUBMODULES = ("concepts", "data", "detectors", "methods", "metrics", "models", "passes", "tasks")

# Each public name, under the module it lives in: the one list of what `explain` exports.
# Importing `explain` imports none of them (nor torch): the command line answers --help at
# once, and a Ray driver plans a run without torch's memory.
_EXPORTS = {
    "base": ("Explainer", "NotApplicable", "register"),
    "concepts": ("CRP", "ConceptAtlas", "ConceptExplanation", "concept_atlas", "reference_patches"),
    "catalogue": ("describe_methods", "explainer", "method_class", "method_names"),
    "methods": (
        "AblationCAM",
        "AttentionRelevance",
        "AttentionRollout",
        "Attribution",
        "BaseCAM",
        "BlurIG",
        "CAM",
        "ContrastiveExcitationBackprop",
        "DRISE",
        "Deconvolution",
        "DeepLift",
        "DeepLiftShap",
        "EigenCAM",
        "EigenGradCAM",
        "ExcitationBackprop",
        "ExtremalPerturbation",
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
        "GuidedIG",
        "HiResCAM",
        "ISCAM",
        "InputXGradient",
        "IntegratedGradients",
        "InternalInfluence",
        "KPCACAM",
        "KernelShap",
        "LRP",
        "RISE",
        "LayerCAM",
        "LayerConductance",
        "LayerGradientXActivation",
        "LayerIntegratedGradients",
        "LeGrad",
        "NoiseTunnel",
        "Lime",
        "Occlusion",
        "RandomCAM",
        "SSCAM",
        "Saliency",
        "ScoreCAM",
        "ShapleyCAM",
        "ShapleyValueSampling",
        "SmoothGrad",
        "SmoothGradCAMPlusPlus",
        "VarGrad",
        "XGradCAM",
        "XRAI",
        "explain_together",
    ),
    "explanation": ("Explanation",),
    "hooks": ("LayerCapture",),
    "image_input": ("ImageInput",),
    "similarity": ("SimilarityTarget",),
    "layers": ("candidate_layers", "find_target_layer"),
    "tokens": ("TokenLayout",),
    "drawing": (
        "denormalize",
        "normalization_of",
        "overlay",
        "overlay_slices",
        "overlay_frames",
        "plot_explanations",
        "plot_signal",
        "to_rgb",
    ),
    "tasks": ("DetectionTarget", "SegmentationTarget", "explain_detections"),
    "detectors": ("as_detector",),
    "model_summary": ("feature_maps", "summary"),
}
_LOCATIONS = {name: module for module, names in _EXPORTS.items() for name in names}

__version__ = "0.1.0"

__all__ = sorted([*_LOCATIONS, *_SUBMODULES])  # noqa: PLE0605 -- a list, built from the lazy names above


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
