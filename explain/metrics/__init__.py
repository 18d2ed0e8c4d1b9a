"""Is the map faithful? Metrics that score explanations, batched through the model.

Each metric is a plain function that returns a :class:`Score`. Faithfulness metrics take
the model, the images and an :class:`~explain.Explanation` (or maps with their targets);
robustness and randomisation metrics take the explainer, which they call again; localisation
metrics take the explanation and the object's region; complexity metrics the explanation
alone.

>>> import explain, torch, torchvision
>>> from explain import metrics
>>> model = torchvision.models.resnet18().eval()
>>> images = torch.rand(2, 3, 64, 64)
>>> result = explain.GradCAM(model)(images)
>>> score = metrics.deletion(model, images, result, step=0.1)
>>> score.values.shape, score.curves["deletion"].shape
(torch.Size([2]), torch.Size([2, 11]))
"""

from ..regions import region_masks
from .arcc import arcc, coherency
from .axiomatic import completeness, input_invariance, non_sensitivity
from .base import Score
from .compactness import mst_c
from .concentration import complexity, effective_complexity, sparseness
from .faithfulness import (
    average_drop,
    deletion,
    faithfulness_correlation,
    faithfulness_estimate,
    infidelity,
    insertion,
    irof,
    monotonicity,
    monotonicity_correlation,
    pic,
    pixel_flipping,
    region_perturbation,
    road,
    selectivity,
    sensitivity_n,
    sufficiency,
)
from .focus import focus, mosaics
from .localisation import (
    attribution_localisation,
    auc,
    energy_pointing_game,
    pointing_game,
    relevance_mass,
    relevance_rank,
    top_k_intersection,
)
from .randomisation import (
    efficient_model_randomisation,
    model_randomisation,
    random_logit,
    smooth_model_randomisation,
)
from .registry import METRICS, Metric, columns, compute, metric, metric_names
from .robustness import (
    consistency,
    continuity,
    local_lipschitz_estimate,
    relative_input_stability,
    relative_output_stability,
    relative_representation_stability,
    sensitivity,
)

__all__ = [
    "METRICS",
    "Metric",
    "Score",
    "arcc",
    "attribution_localisation",
    "auc",
    "average_drop",
    "coherency",
    "columns",
    "completeness",
    "complexity",
    "compute",
    "consistency",
    "continuity",
    "deletion",
    "effective_complexity",
    "efficient_model_randomisation",
    "energy_pointing_game",
    "faithfulness_correlation",
    "faithfulness_estimate",
    "focus",
    "infidelity",
    "input_invariance",
    "insertion",
    "irof",
    "local_lipschitz_estimate",
    "metric",
    "metric_names",
    "model_randomisation",
    "monotonicity",
    "monotonicity_correlation",
    "mosaics",
    "mst_c",
    "non_sensitivity",
    "pic",
    "pixel_flipping",
    "pointing_game",
    "random_logit",
    "region_masks",
    "region_perturbation",
    "relative_input_stability",
    "relative_output_stability",
    "relative_representation_stability",
    "relevance_mass",
    "relevance_rank",
    "road",
    "selectivity",
    "sensitivity",
    "sensitivity_n",
    "smooth_model_randomisation",
    "sparseness",
    "sufficiency",
    "top_k_intersection",
]
