"""Faithfulness: does the model's score fall when what the map points at is taken away?

Every metric here perturbs copies of the images in the order the map gives (or at random,
against the map's sums), runs them through the model in inner batches sized from the memory
budget (or of ``batch_size``) under ``torch.inference_mode``, and reads the explained
class's score. The perturbed images are built batch by batch on the images' device, so
memory stays at one inner batch whatever the number of steps.

Maps order pixels by their value, highest first (a signed map's most positive evidence
first); ties keep raster order.

- :mod:`~explain.metrics.faithfulness.curves`: deletion, insertion, pixel-flipping, region
  perturbation, IROF;
- :mod:`~explain.metrics.faithfulness.road`: ROAD;
- :mod:`~explain.metrics.faithfulness.drop`: Average Drop, Increase in Confidence, Average Gain;
- :mod:`~explain.metrics.faithfulness.perturbing`: what they share (baselines, steps, patches).
"""

from .curves import blurred, deletion, insertion, irof, pixel_flipping, region_perturbation
from .drop import average_drop
from .road import road

__all__ = [
    "average_drop",
    "blurred",
    "deletion",
    "insertion",
    "irof",
    "pixel_flipping",
    "region_perturbation",
    "road",
]
