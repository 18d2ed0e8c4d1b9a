"""Faithfulness: does the model's score fall when what the map points at is taken away?

Every metric here perturbs copies of the images in the order the map gives (or at random,
against the map's sums), runs them through the model in inner batches sized from the memory
budget (or of ``batch_size``) under ``torch.inference_mode``, and reads the explained
class's score. The perturbed images are built batch by batch on the images' device, so
memory stays at one inner batch whatever the number of steps.

Maps order pixels by their value, highest first (a signed map's most positive evidence
first); ties keep raster order.

- ``curves.py``: deletion, insertion, pixel-flipping, region perturbation, selectivity, IROF;
- ``remove_and_debias.py``: ROAD;
- ``drop.py``: Average Drop, Increase in Confidence, Average Gain;
- ``sufficiency.py``: sufficiency (do the images whose maps are close get the same class?);
- ``random_removal.py``: infidelity and sensitivity-n (the map's sum over a random part against
  the score's drop when it is removed);
- ``correlation.py``: faithfulness correlation and faithfulness estimate;
- ``monotonic.py``: monotonicity and monotonicity correlation;
- ``information_curves.py``: the softmax and accuracy information curves (SIC, AIC);
- ``perturbing.py``: what they share (baselines, steps, patches, random subsets, groups).
"""

from .correlation import faithfulness_correlation, faithfulness_estimate
from .curves import blurred, deletion, insertion, irof, pixel_flipping, region_perturbation, selectivity
from .drop import average_drop
from .information_curves import pic
from .monotonic import monotonicity, monotonicity_correlation
from .random_removal import infidelity, sensitivity_n
from .remove_and_debias import road
from .sufficiency import sufficiency

__all__ = [
    "average_drop",
    "blurred",
    "deletion",
    "faithfulness_correlation",
    "faithfulness_estimate",
    "infidelity",
    "insertion",
    "irof",
    "monotonicity",
    "monotonicity_correlation",
    "pic",
    "pixel_flipping",
    "region_perturbation",
    "road",
    "selectivity",
    "sensitivity_n",
    "sufficiency",
]
