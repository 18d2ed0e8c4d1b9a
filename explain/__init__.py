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

# Each public name, under the module it lives in: the one list of what `explain` exports
# besides the methods, which `explain.methods` lists from the registry (METHODS_MODULE below).
# Importing `explain` imports none of them (nor torch): the command line answers --help at
# once, and a Ray driver plans a run without torch's memory.
_EXPORTS = {
    "base": ("Explainer", "NotApplicable", "register"),
    "concepts": ("CRP", "ConceptAtlas", "concept_atlas", "reference_patches"),
    "catalogue": ("describe_methods", "explainer", "method_class", "method_names"),
    "explanation": ("ConceptExplanation", "Explanation"),
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
#: The module whose methods and their bases (``BASES`` and ``METHOD_CLASSES``) `explain`
#: exports too: every registered built-in method, by its class name.
METHODS_MODULE = "methods"

__version__ = "0.1.0"


def _method_exports() -> tuple[str, ...]:
    """The names of the methods and their bases (importing the methods, and torch)."""
    methods = importlib.import_module(f".{METHODS_MODULE}", __name__)
    return (*methods.BASES, *methods.METHOD_CLASSES)


def __getattr__(name: str):
    if name == "__all__":  # lazily: listing the methods imports them
        names = sorted([*_LOCATIONS, *_SUBMODULES, *_method_exports()])
        globals()["__all__"] = names
        return names
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _LOCATIONS.get(name)
    if module is None and not name.startswith("_") and name in _method_exports():
        module = METHODS_MODULE
    if module is None:
        raise AttributeError(f"module 'explain' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__getattr__("__all__")))
