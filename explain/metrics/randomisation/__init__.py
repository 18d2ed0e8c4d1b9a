"""Randomisation sanity checks: does the map change when the model or the class does?

A map that survives randomising the model's weights, or explaining another class, does not
explain the model's decision (an edge detector passes any such test). Similarities are
Spearman's rank correlation (ranks by :func:`scipy.stats.rankdata`) and SSIM
(:func:`skimage.metrics.structural_similarity`) between each image's original map and the
one after randomisation, lower is better for both; Efficient MPRT measures the rise of the
map's complexity (the entropy of its histogram) instead, higher is better.

- ``parameters.py``: the model parameter randomisation tests, MPRT, Smooth MPRT and
  Efficient MPRT;
- ``cascade.py``: the layers randomised one after another in place and put back, the maps
  explained again (or smoothed over noisy copies) along the way;
- ``similarity.py``: Spearman, SSIM and the histogram entropy;
- ``logit.py``: the random logit test.
"""

from .cascade import randomisable_layers
from .logit import random_logit
from .parameters import efficient_model_randomisation, model_randomisation, smooth_model_randomisation
from .similarity import histogram_entropy, rank_maps, spearman, ssim

__all__ = [
    "efficient_model_randomisation",
    "histogram_entropy",
    "model_randomisation",
    "random_logit",
    "randomisable_layers",
    "rank_maps",
    "smooth_model_randomisation",
    "spearman",
    "ssim",
]
