"""Showing maps: heatmap overlays (:func:`overlay`), a comparison figure
(:func:`plot_explanations`), boxes and outlines drawn on top, undoing the model's
normalisation; and for volumes, videos and signals: a grid of slices (:func:`overlay_slices`),
an animated GIF per video (:func:`overlay_frames`, :func:`encode_gif`) and a signal as a
line coloured by relevance (:func:`plot_signal`).

Modules by job: ``pictures`` (reading pictures), ``overlays`` (maps blended over them),
``marks`` (boxes, outlines), ``normalisation``, ``figures``, ``volumes``, ``signals``.
"""

from .figures import plot_explanations
from .marks import BOX_COLOURS, draw_boxes, draw_outline
from .normalisation import denormalize, normalization_of
from .overlays import overlay
from .pictures import to_rgb
from .signals import figure_png, plot_signal
from .volumes import encode_gif, overlay_frames, overlay_slices

__all__ = [
    "BOX_COLOURS",
    "denormalize",
    "draw_boxes",
    "draw_outline",
    "encode_gif",
    "figure_png",
    "normalization_of",
    "overlay",
    "overlay_frames",
    "overlay_slices",
    "plot_explanations",
    "plot_signal",
    "to_rgb",
]
