"""Robustness: does the map stay put when the input barely changes?

Each metric but consistency explains copies of the image changed a little, for the same
target, and measures how far the map moves:

- ``sensitivity.py``: max- and average-sensitivity (Yeh et al.) and the local Lipschitz
  estimate (Alvarez-Melis & Jaakkola), over noisy copies;
- ``continuity.py``: continuity (Montavon et al.), over sideways translations;
- ``stability.py``: relative input, output and representation stability (Agarwal et al.),
  the map's relative change against that of the input, the logits or a layer;
- ``consistency.py``: consistency (Dasgupta et al.), across images: do the images whose
  maps say the same get the same class?
- ``neighbourhood.py``: what they share: the noisy copies, their explanation in batches,
  the model's outputs for them.
"""

from .consistency import consistency
from .continuity import continuity
from .sensitivity import local_lipschitz_estimate, sensitivity
from .stability import relative_input_stability, relative_output_stability, relative_representation_stability

__all__ = [
    "consistency",
    "continuity",
    "local_lipschitz_estimate",
    "relative_input_stability",
    "relative_output_stability",
    "relative_representation_stability",
    "sensitivity",
]
