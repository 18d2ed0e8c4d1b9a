"""Figures of an evaluation, drawn with matplotlib's object API (no pyplot, no display):
the mean curve per method, the summary as bars, and the randomisation sanity check."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping

import numpy as np
from matplotlib.figure import Figure

__all__ = ["mean_curves", "plot_curves", "plot_randomisation", "plot_summary"]

#: Axis labels of each metric's curves: (x, y).
CURVE_AXES = {
    "deletion": ("fraction of pixels deleted", "probability of the target"),
    "insertion": ("fraction of pixels inserted", "probability of the target"),
    "pixel-flipping": ("fraction of pixels flipped", "logit of the target"),
    "road": ("% of pixels removed and imputed", "probability of the target"),
    "region-perturbation": ("regions perturbed", "drop of the target's logit"),
    "irof": ("superpixels removed", "score relative to the intact image"),
    "continuity": ("horizontal shift (pixels)", "map change / input change"),
}


def mean_curves(curves: Iterable[Mapping]) -> dict[str, dict[str, dict[str, dict]]]:
    """Average the per-image curves (dicts as in :attr:`Evaluation.curves` or
    ``curves.jsonl``) by metric, curve and method: ``{metric: {curve: {method: {"steps",
    "mean", "std", "n", "step_labels"}}}}``. Curves over different steps (IROF's, where
    images have different numbers of superpixels) are first resampled onto the longest
    one's steps, holding each curve's last value past its end.

    >>> found = mean_curves([{"metric": "deletion", "curve": "deletion", "method": "gradcam",
    ...                       "steps": [0, 1], "values": v} for v in ([1.0, 0.0], [0.5, 0.0])])
    >>> found["deletion"]["deletion"]["gradcam"]["mean"].tolist()
    [0.75, 0.0]
    """
    grouped: dict[tuple, list] = {}
    for record in curves:
        key = (record["metric"], record["curve"], record["method"])
        steps = np.asarray(record["steps"], dtype=np.float64)
        grouped.setdefault(key, []).append(
            (steps, np.asarray(record["values"], dtype=np.float64), record.get("step_labels"))
        )
    out: dict = {}
    for (metric, curve, method), found in grouped.items():
        grid, _, labels = max(found, key=lambda item: len(item[0]))
        stacked = np.stack(
            [
                values if len(steps) == len(grid) and np.array_equal(steps, grid) else np.interp(grid, steps, values)
                for steps, values, _ in found
            ]
        )
        with warnings.catch_warnings():  # a step where every curve is NaN stays NaN, quietly
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, std = np.nanmean(stacked, 0), np.nanstd(stacked, 0)
        out.setdefault(metric, {}).setdefault(curve, {})[method] = {
            "steps": grid,
            "mean": mean,
            "std": std,
            "n": len(found),
            "step_labels": tuple(labels) if labels else None,
        }
    return out


def plot_curves(curves: Iterable[Mapping]) -> dict[str, Figure]:
    """One figure per metric with curves (deletion, insertion, ROAD's MoRF and LeRF,
    pixel-flipping, IROF, region perturbation: whatever ``curves`` holds), with each
    method's mean curve over the images; the randomisation's curves are left to
    :func:`plot_randomisation`. Returns ``{metric: Figure}``."""
    figures = {}
    styles = ["-", "--", ":", "-."]
    for metric, by_curve in mean_curves(curves).items():
        shown = {
            name: by_method
            for name, by_method in by_curve.items()
            if not name.endswith("_accuracy") and not any(m["step_labels"] for m in by_method.values())
        }
        if not shown:
            continue
        figure = Figure(figsize=(6.4, 4.4), layout="constrained")
        axes = figure.add_subplot()
        methods = list(dict.fromkeys(method for by_method in shown.values() for method in by_method))
        colours = {method: f"C{i % 10}" for i, method in enumerate(methods)}
        for j, (name, by_method) in enumerate(shown.items()):
            for method, mean in by_method.items():
                label = method if len(shown) == 1 else f"{method} ({name})"
                axes.plot(mean["steps"], mean["mean"], styles[j % len(styles)], color=colours[method], label=label)
        x_label, y_label = CURVE_AXES.get(metric, ("step", "score"))
        count = max(m["n"] for by_method in shown.values() for m in by_method.values())
        axes.set(xlabel=x_label, ylabel=y_label, title=f"{metric}: mean curve per method ({count} images and targets)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        figures[metric] = figure
    return figures


def plot_summary(table: list[dict]) -> Figure:
    """Bars of each method's mean with its standard deviation as error bars, one panel per
    metric column (from :func:`~explain.evaluation.summary_table`), the best bar outlined."""
    columns = list(dict.fromkeys(entry["metric"] for entry in table))
    methods = list(dict.fromkeys(entry["method"] for entry in table))
    count = max(1, len(columns))
    across = min(3, count)
    down = math.ceil(count / across)
    figure = Figure(figsize=(4.2 * across, 3.2 * down + 0.3), layout="constrained")
    for k, column in enumerate(columns):
        axes = figure.add_subplot(down, across, k + 1)
        entries = {entry["method"]: entry for entry in table if entry["metric"] == column}
        shown = [m for m in methods if m in entries]
        means = [entries[m]["mean"] for m in shown]
        stds = [entries[m]["std"] for m in shown]
        bars = axes.bar(
            range(len(shown)), means, yerr=stds, capsize=3, color=[f"C{methods.index(m) % 10}" for m in shown]
        )
        for bar, method in zip(bars, shown, strict=True):
            if entries[method]["best"]:
                bar.set_edgecolor("black")
                bar.set_linewidth(2)
        axes.set_xticks(range(len(shown)), shown, rotation=30, ha="right", fontsize="small")
        higher = entries[shown[0]]["higher_is_better"] if shown else None
        directions: dict[bool | None, str] = {True: " (higher is better)", False: " (lower is better)"}
        direction = directions.get(higher, "")
        axes.set_title(column + direction, fontsize="medium")
        axes.grid(axis="y", alpha=0.3)
    figure.suptitle("mean ± std over images; best outlined")
    return figure


def plot_randomisation(curves: Iterable[Mapping]) -> Figure | None:
    """The cascading randomisation sanity checks (MPRT, Smooth MPRT): each method's mean
    Spearman correlation (and SSIM) between the original map and the map after randomising
    the layers up to each one, the layers (``Score.step_labels``) as rotated tick labels.
    ``None`` when ``curves`` hold no randomisation."""
    found = mean_curves(record for record in curves if record.get("step_labels"))
    panels = [(metric, name, by_method) for metric, by_curve in found.items() for name, by_method in by_curve.items()]
    if not panels:
        return None
    steps = max(len(m["steps"]) for _, _, by_method in panels for m in by_method.values())
    figure = Figure(figsize=(max(7.0, 0.14 * steps + 2), 3.6 * len(panels) + 1.2), layout="constrained")
    every = max(1, math.ceil(steps / 60))
    for k, (metric, name, by_method) in enumerate(panels):
        axes = figure.add_subplot(len(panels), 1, k + 1)
        for i, (method, mean) in enumerate(by_method.items()):
            axes.plot(mean["steps"], mean["mean"], "-o", markersize=2, color=f"C{i % 10}", label=method)
        longest = max(by_method.values(), key=lambda m: len(m["steps"]))
        labels = longest["step_labels"] or ()
        axes.set_xticks(longest["steps"][::every], labels[::every], rotation=90, fontsize=6)
        axes.axhline(0, color="grey", linewidth=0.8)
        axes.set(ylabel=name, title=f"{metric}: {name} against the original map (lower is better)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    figure.axes[-1].set_xlabel("layers randomised so far, the last named (from the logits down, or the input up)")
    return figure
