"""A comparison figure: an image and its overlays, one per method and target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from .overlays import overlay
from .pictures import to_rgb

__all__ = ["plot_explanations"]


def _target_panels(title: str, explanation, index: int) -> list[tuple[str, Tensor, bool]]:
    """(title, map, signed) of each target an explanation explains for image ``index``: the
    method (and the target's rank, with ``topk``), the class and its probability."""
    heat, names, probs = explanation.maps[index], explanation.target_names[index], explanation.probabilities[index]
    if heat.dim() == 2:
        heat, names, probs = heat[None], [names], probs[None]
    panels = []
    for rank, (target_map, name, prob) in enumerate(zip(heat, names, probs, strict=True), start=1):
        method = f"{title} top{rank}" if len(names) > 1 else title
        label = f"{method}\n{name}" + ("" if torch.isnan(prob) else f" ({float(prob):.0%})")
        panels.append((label, target_map, explanation.signed))
    return panels


def plot_explanations(
    image,
    explanations: Sequence | Mapping,
    index: int = 0,
    *,
    cmap: str | None = None,
    alpha: float = 0.5,
    columns: int | None = None,
):
    """A matplotlib figure: the image, then one overlay per explanation and target, titled
    with the method, the explained class and its probability.

    ``explanations`` is a list of :class:`~explain.Explanation` (titled by method) or a
    mapping of title to Explanation or to a 2-D map, so CAMs and attributions sit side by
    side in one grid. ``index`` picks the image in the batch. With ``topk``, each target has
    its panel, titled with its rank. Signed maps are drawn with a diverging colormap (see
    :func:`overlay`).

    >>> import explain, torchvision
    >>> model = torchvision.models.resnet18(num_classes=4).eval()
    >>> image = torch.rand(1, 3, 64, 64)
    >>> figure = plot_explanations(image[0], [explain.explainer("gradcam", model)(image, topk=2)])
    >>> [axis.get_title().splitlines()[0] for axis in figure.axes]   # the titles' first lines
    ['image', 'gradcam top1', 'gradcam top2']
    """
    import matplotlib.pyplot as plt

    from ..explanation import Explanation

    items = explanations.items() if isinstance(explanations, Mapping) else ((e.method, e) for e in explanations)
    panels: list[tuple[str, Tensor | None, bool | None]] = [("image", None, False)]
    for title, item in items:
        panels += _target_panels(title, item, index) if isinstance(item, Explanation) else [(title, item, None)]
    columns = columns or min(len(panels), 4)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3 * columns, 3.4 * rows), squeeze=False, layout="constrained")
    rgb = to_rgb(image)
    for axis in axes.flat:
        axis.axis("off")
    for axis, (title, heat, signed) in zip(axes.flat, panels, strict=False):
        axis.imshow(rgb if heat is None else overlay(rgb, heat, cmap=cmap, alpha=alpha, signed=signed))
        axis.set_title(title, fontsize=9)
    return figure
