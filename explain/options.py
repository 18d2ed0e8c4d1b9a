"""Option values that the library and the command line share, in a module free of torch: the
command line builds its parser (``explain --help``) from them without importing the models.
``tests/test_cli.py`` checks the metric names against :data:`explain.metrics.METRICS`."""

#: The bundled offline model (EfficientNet-Lite0 with ImageNet weights).
BUNDLED_MODEL = "efficientnet_lite0"

#: What ``--model`` takes, in words (its help, and the error for a name no source knows).
MODEL_FORMS = (
    f"{BUNDLED_MODEL} (bundled), a torchvision classification, video, segmentation or detection model name, "
    "timm:NAME for a timm model, yolo:FILE.pt or yolo:FILE.yaml for an Ultralytics YOLO detector, "
    "a folder holding a Hugging Face image classifier or DETR-style detector (save_pretrained), "
    "a torch.export .pt2 file, or a pickled nn.Module (needs --trust-model-file)"
)

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
