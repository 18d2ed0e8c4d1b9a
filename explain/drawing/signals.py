"""Signals: each channel drawn as a line coloured by the relevance of each time step
(matplotlib's ``LineCollection``), one panel per channel, with the colour scale beside."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib
import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from .overlays import as_map

__all__ = ["figure_png", "plot_signal", "signal_colours"]


def _signal_array(signal) -> np.ndarray:
    array = np.asarray(signal.detach().cpu().float() if hasattr(signal, "detach") else signal, dtype=np.float32)
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2:
        raise ValueError(f"a signal is (L,) or (C, L), got shape {array.shape}; pick one signal, e.g. x[0]")
    if not np.isfinite(array).all():
        raise ValueError("the signal contains NaN or infinite values")
    return array


def _colormap(cmap, signed: bool):
    """The colormap named or given, by default ``jet`` (``RdBu_r`` for signed maps)."""
    if cmap is None:
        cmap = "RdBu_r" if signed else "jet"
    return matplotlib.colormaps[cmap] if isinstance(cmap, str) else cmap


def signal_colours(heatmap, length: int, cmap=None, signed: bool | None = None) -> tuple[np.ndarray, bool]:
    """(length - 1, 4) RGBA colours of the segments between time steps, each the colour of
    the mean relevance of its two ends, and whether the map is signed."""
    heat, signed = as_map(heatmap, signed, dims=1)
    if len(heat) != length:
        raise ValueError(f"the map has {len(heat)} time steps and the signal {length}; give one value per step")
    colormap = _colormap(cmap, signed)
    middle = (heat[:-1] + heat[1:]) / 2
    return colormap((middle + 1) / 2 if signed else middle), signed


def plot_signal(
    signal,
    heatmap,
    cmap=None,
    *,
    signed: bool | None = None,
    channel_names: Sequence[str] | None = None,
    title: str | None = None,
    linewidth: float = 2.0,
) -> Figure:
    """A figure of ``signal`` ((L,) or (C, L)), one panel per channel, each a line coloured by
    ``heatmap`` (L,), e.g. ``res.maps[0]`` (``jet`` by default, ``RdBu_r`` for signed maps),
    with the colour scale beside. A ``matplotlib.figure.Figure`` made without pyplot, so
    threads may draw at once; save it with ``figure.savefig`` or ``explain.drawing.figure_png``.

    >>> figure = plot_signal(np.sin(np.linspace(0, 6, 50)), np.linspace(0, 1, 50))
    >>> len(figure.axes[0].collections[0].get_segments())   # one segment between two steps
    49
    """
    array = _signal_array(signal)
    channels, length = array.shape
    colours, signed = signal_colours(heatmap, length, cmap, signed)
    figure = Figure(figsize=(8, 1.2 + 1.3 * channels), layout="constrained")
    axes = figure.subplots(channels, 1, sharex=True, squeeze=False)[:, 0]
    steps = np.arange(length, dtype=np.float32)
    for c, axis in enumerate(axes):
        points = np.stack([steps, array[c]], axis=1)
        segments = np.stack([points[:-1], points[1:]], axis=1)
        axis.add_collection(LineCollection(list(segments), colors=colours, linewidths=linewidth))
        axis.set_xlim(0, max(length - 1, 1))
        low, high = float(array[c].min()), float(array[c].max())
        margin = 0.05 * (high - low) or 1.0
        axis.set_ylim(low - margin, high + margin)
        axis.set_ylabel(channel_names[c] if channel_names else f"channel {c}", fontsize=8)
    axes[-1].set_xlabel("time step")
    scale = matplotlib.cm.ScalarMappable(Normalize(-1 if signed else 0, 1), _colormap(cmap, signed))
    figure.colorbar(scale, ax=list(axes), label="relevance", fraction=0.03)
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def figure_png(figure: Figure, dpi: int = 100) -> bytes:
    """A matplotlib figure as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()
