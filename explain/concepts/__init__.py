"""What the model sees, not only where: concepts of a layer, their relevance for a decision,
their reference images in a dataset, and their feature visualisations.

- :mod:`~explain.concepts.conditions`: concepts (a channel, a set of channels, a direction)
  and the masks that condition relevance on them;
- :mod:`~explain.concepts.crp`: Concept Relevance Propagation (:class:`.CRP`): the concepts of
  a decision, ranked, with their conditional heatmaps, and the attribution graph of a concept;
- :mod:`~explain.concepts.results`: :class:`.AttributionGraph`, and the overlays and figure of
  the :class:`~explain.ConceptExplanation` that CRP returns;
- :mod:`~explain.concepts.probe` and :mod:`~explain.concepts.atlas`: the concept atlas of a
  dataset (Relevance and Activation Maximization): :class:`.AtlasProbe` makes each batch's
  values, :class:`.ConceptAtlas` keeps the running top-N (update, merge, state_dict),
  :func:`.concept_atlas` runs both over an iterable of batches;
- :mod:`~explain.concepts.references`: the reference regions (crops) of an atlas's channels;
- :mod:`~explain.concepts.visualization` and :mod:`~explain.concepts.parameterization`:
  feature visualisation (Fourier, MaCo);
- :mod:`~explain.concepts.craft` and :mod:`~explain.concepts.sobol`: the concepts a class
  uses, discovered (CRAFT: :class:`.CRAFT` factorizes crops' activations into concepts,
  ranks them by total-order Sobol indices and maps them on any image);
- :mod:`~explain.concepts.tcav` and :mod:`~explain.concepts.tcav_results`: the concepts a
  user names (TCAV: :class:`.TCAV` tests whether a class is sensitive to a concept given by
  its images, against random sets, significant or not);
- :mod:`~explain.concepts.propagation`: the passes CRP runs (LRP with gates at layers);
- :mod:`~explain.concepts.method`: CRP as a method of the registry (``crp``:
  :class:`.ConceptRelevance`), for ``explain run --method crp``.
"""

from .atlas import ChannelStatistics, ConceptAtlas, References, concept_atlas
from .conditions import Concept, channel_relevance, concept_masks, concept_relevances, parse_concepts
from .craft import CRAFT, CraftConcepts, crop_boxes
from .crp import CRP, start_relevance
from .method import ConceptRelevance
from .parameterization import FourierImage, MagnitudeImage, natural_magnitude
from .probe import AtlasBatch, AtlasProbe, LayerBatch
from .propagation import ConceptPasses, concept_context
from .references import ReferencePatches, reference_patches
from .results import AttributionGraph, GraphNode, concept_figure, concept_overlays
from .sobol import jansen_total_indices, sobol_designs
from .tcav import TCAV, draw_random_sets
from .tcav_results import TCAVResult, TCAVScore
from .visualization import FeatureVisualization, Objective, check_objectives, visualize

__all__ = [
    "CRAFT",
    "CRP",
    "TCAV",
    "AtlasBatch",
    "AtlasProbe",
    "AttributionGraph",
    "ChannelStatistics",
    "Concept",
    "ConceptAtlas",
    "ConceptPasses",
    "ConceptRelevance",
    "CraftConcepts",
    "FeatureVisualization",
    "FourierImage",
    "GraphNode",
    "LayerBatch",
    "MagnitudeImage",
    "Objective",
    "ReferencePatches",
    "References",
    "TCAVResult",
    "TCAVScore",
    "channel_relevance",
    "check_objectives",
    "concept_atlas",
    "concept_context",
    "concept_figure",
    "concept_masks",
    "concept_overlays",
    "concept_relevances",
    "crop_boxes",
    "draw_random_sets",
    "jansen_total_indices",
    "natural_magnitude",
    "parse_concepts",
    "reference_patches",
    "sobol_designs",
    "start_relevance",
    "visualize",
]
