"""Option values that the library and the command line share, in a module free of torch: the
command line builds its parser (``explain --help``) from them without importing the models.
``tests/test_cli.py`` checks the metric names against :data:`explain.metrics.METRICS`."""

#: The bundled offline model (EfficientNet-Lite0 with ImageNet weights).
BUNDLED_MODEL = "efficientnet_lite0"

#: What ``--model`` takes, in words (its help, and the error for a name no source knows).
MODEL_FORMS = (
    f"{BUNDLED_MODEL} (bundled), a torchvision classification, segmentation or detection model name, "
    "timm:NAME for a timm model, yolo:FILE.pt or yolo:FILE.yaml for an Ultralytics YOLO detector, "
    "a folder holding a Hugging Face image classifier or DETR-style detector (save_pretrained), "
    "a torch.export .pt2 file, or a pickled nn.Module (needs --trust-model-file)"
)

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
    "sensitivity",
    "randomisation",
    "random-logit",
    "pointing-game",
    "relevance-mass",
    "relevance-rank",
    "energy-pointing-game",
    "sparseness",
    "complexity",
)

#: Metrics that need the objects' regions (``explain evaluate --regions``).
LOCALISATION_METRICS = ("pointing-game", "relevance-mass", "relevance-rank", "energy-pointing-game")

#: Metrics whose pixels per step ``--step`` sets.
STEP_METRICS = ("deletion", "insertion", "pixel-flipping")
