"""Option values that the library and the command line share, in a module free of torch: the
command line builds its parser (``explain --help``) from them without importing the models.
``tests/test_cli.py`` checks the metric names against :data:`explain.metrics.METRICS`."""

import math
import re

from .errors import Option, worded

#: The bundled offline model (EfficientNet-Lite0 with ImageNet weights).
BUNDLED_MODEL = "efficientnet_lite0"

#: What ``--model`` takes, as the parts of the error for a name no source knows (see
#: :class:`~explain.errors.UsageError`), and :data:`MODEL_FORMS` in the command line's words.
MODEL_FORM_PARTS = (
    f"{BUNDLED_MODEL} (bundled), a torchvision classification, video, segmentation or detection model name, "
    "timm:NAME for a timm model, yolo:FILE.pt or yolo:FILE.yaml for an Ultralytics YOLO detector, "
    "a folder holding a Hugging Face image classifier or DETR-style detector (save_pretrained), "
    "a torch.export .pt2 file, or a pickled nn.Module (needs ",
    Option("trust_model_file"),
    ")",
)
#: What ``--model`` takes, in words (its help).
MODEL_FORMS = worded(MODEL_FORM_PARTS)

#: Suffixes that make a model argument a file rather than a name.
MODEL_FILE_SUFFIXES = (".pt", ".pth", ".pt2", ".ts", ".jit", ".pkl", ".bin", ".ckpt")

#: torchvision's video classifiers: models of (N, 3, T, H, W) clips (``explain run`` reads
#: videos and .npy volumes for them).
VIDEO_MODELS = ("r3d_18", "mc3_18", "r2plus1d_18", "s3d", "mvit_v1_b", "mvit_v2_s", "swin3d_t", "swin3d_s", "swin3d_b")

#: What a model does: a class per image, a class per pixel, or boxes.
TASKS = ("classify", "segment", "detect")

#: How attribution methods reduce the colour channels to one map.
REDUCTIONS = ("abs-sum", "sum", "max-abs", "l2")

#: The metrics by name, in :data:`explain.metrics.METRICS` order.
METRIC_NAMES = (
    "deletion",
    "insertion",
    "average-drop",
    "road",
    "pixel-flipping",
    "region-perturbation",
    "irof",
    "selectivity",
    "infidelity",
    "sensitivity-n",
    "faithfulness-correlation",
    "faithfulness-estimate",
    "monotonicity",
    "monotonicity-correlation",
    "sic",
    "sufficiency",
    "arcc",
    "completeness",
    "non-sensitivity",
    "input-invariance",
    "sensitivity",
    "local-lipschitz-estimate",
    "continuity",
    "relative-input-stability",
    "relative-output-stability",
    "relative-representation-stability",
    "consistency",
    "randomisation",
    "smooth-randomisation",
    "efficient-randomisation",
    "random-logit",
    "pointing-game",
    "relevance-mass",
    "relevance-rank",
    "energy-pointing-game",
    "top-k-intersection",
    "auc",
    "attribution-localisation",
    "focus",
    "sparseness",
    "complexity",
    "effective-complexity",
    "mst-c",
)

#: Metrics that need the objects' regions (``explain evaluate --regions``).
LOCALISATION_METRICS = (
    "pointing-game",
    "relevance-mass",
    "relevance-rank",
    "energy-pointing-game",
    "top-k-intersection",
    "auc",
    "attribution-localisation",
)

#: Metrics that read the images' 8-bit pixels, given the normalisation of the model's preprocessing.
PIXEL_METRICS = ("sic",)

#: Metrics whose pixels per step ``--step`` sets.
STEP_METRICS = ("deletion", "insertion", "pixel-flipping", "non-sensitivity")

#: Where the sample photos lie in the package (:mod:`explain.data.samples`): ``explain
#: samples`` finds them there without importing :mod:`explain.data`.
SAMPLE_PHOTOS = ("data", "photos")

#: The aggregates of a noise tunnel, the ``KIND`` of a ``KIND:METHOD`` name
#: (:data:`explain.methods.noise_tunnel.KINDS`).
NOISE_TUNNELS = ("smoothgrad", "smoothgrad-sq", "vargrad")

#: The units of a memory size (:func:`parse_memory`), in bytes.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_memory(value) -> int | None:
    """``value`` in bytes: an int or float of bytes, or text such as ``"2GB"``, ``"1.5 GiB"``
    or ``"800M"`` (decimal units, and binary ones with an ``i``); None stays None.

    >>> parse_memory("2GB"), parse_memory("512 MiB"), parse_memory(10**6)
    (2000000000, 536870912, 1000000)
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"max_memory must be a size such as '2GB' or a number of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"max_memory must be a size such as '2GB', '512MiB' or a number of bytes, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _UNITS[unit])
    if size < 1 or not math.isfinite(number):
        raise ValueError(f"max_memory must be a positive size such as '2GB', got {value!r}")
    return size
