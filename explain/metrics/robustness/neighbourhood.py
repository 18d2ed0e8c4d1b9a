"""An image's neighbourhood, as the robustness metrics visit it: copies of each image
changed a little (noise in a ball, a translation), explained again in batches for the
same targets, with the model's outputs for them where a metric needs those too."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...base import Explainer
from ...checks import channel_hint, checked_number, positive_int
from ...explanation import Explanation
from ...hooks import LayerCapture, preserved_state
from ...passes import Passes
from ...targets import class_logits
from ..base import Pairs, chunks, draws, explanation_batch

__all__ = [
    "NOISES",
    "ball_noise",
    "class_outputs",
    "explained_neighbours",
    "largest",
    "layer_outputs",
    "relative_change",
]

#: How the noise of a neighbour is drawn: uniform in [-radius, radius] per value (the L-inf
#: ball of that radius), or normal with standard deviation ``radius``.
NOISES = ("uniform", "normal")


def ball_noise(radius: float, noise: str, seed: int | None) -> Callable[[Tensor, list[int]], Tensor]:
    """A function that adds draw ``s`` of ``noise`` (see :data:`NOISES`) of size ``radius``
    to an image, for each image of a batch and its draw ``s``. Draw ``s`` depends only on
    ``seed`` and ``s`` (:func:`~explain.metrics.base.draws`): every image gets the same
    noise at the same draw, whatever its batch or position; ``seed=None`` draws from the
    caller's random stream."""
    radius = checked_number("radius", radius, positive=False)
    if noise not in NOISES:
        raise ValueError(f"unknown noise {noise!r}; use one of {', '.join(NOISES)}")

    def perturb(images: Tensor, samples: list[int]) -> Tensor:
        drawn = draws(seed, samples, images.shape[1:], images.device, normal=noise == "normal")
        offsets = drawn * radius if noise == "normal" else (drawn * 2 - 1) * radius
        return images + offsets.to(images.dtype)

    return perturb


def explained_neighbours(
    explainer: Explainer,
    pairs: Pairs,
    n_samples: int,
    perturb: Callable[[Tensor, list[int]], Tensor],
    batch_size: int | None,
    visit: Callable[[slice, Tensor, Tensor, Explanation], None],
) -> None:
    """Make ``n_samples`` neighbours of each pair's image with ``perturb(images, samples)``
    (neighbour ``s`` of pair ``i`` is row ``i * n_samples + s``), explain them again for the
    pair's target ``batch_size`` rows at a time (None: the default for the device,
    :func:`~explain.metrics.base.explanation_batch`), and hand each batch to ``visit``: its
    rows' slice of the (M * n_samples) rows, the pairs they belong to, the neighbours and
    their explanation. The call's progress counts the explanations; Ctrl-C stops it between
    two batches."""
    n_samples = positive_int("n_samples", n_samples)
    m, device = len(pairs.targets), pairs.images.device
    rows = torch.arange(m, device=device).repeat_interleave(n_samples)
    with Passes(None, m * n_samples) as explained:
        for part in chunks(m * n_samples, explanation_batch(batch_size, device)):
            r = rows[part]
            neighbours = perturb(pairs.images[r], [i % n_samples for i in range(part.start, part.stop)])
            visit(part, r, neighbours, explainer(neighbours, pairs.targets[r]))
            explained.advance(len(r))


def _class_logits(output) -> Tensor:
    logits = class_logits(output)
    if not isinstance(logits, Tensor) or logits.dim() != 2:
        raise ValueError(
            f"this metric compares class outputs, (N, classes); the model returns {type(logits).__name__}"
            + (f" {tuple(logits.shape)}" if isinstance(logits, Tensor) else "")
        )
    return logits.detach().float()


def class_outputs(model: nn.Module, inputs: Tensor, logits=None, repeat: int = 1) -> Tensor:
    """The class logits of ``inputs``, (B, classes) float32: ``logits`` where they are
    such, of the same inputs (an explanation's; with ``repeat``, of every ``repeat``-th
    input, the batch repeating each ``repeat`` times), else a forward pass under
    ``inference_mode``."""
    if isinstance(logits, Tensor) and logits.dim() == 2 and len(logits) * repeat == len(inputs):
        return logits.detach().float().repeat_interleave(repeat, 0)
    with preserved_state(model), torch.inference_mode(), channel_hint(inputs):
        return _class_logits(model(inputs))


def layer_outputs(model: nn.Module, layer: dict[str, nn.Module], inputs: Tensor) -> tuple[Tensor, Tensor]:
    """One forward pass of ``inputs`` under ``inference_mode``: the output of the one
    module in ``layer`` ({name: module}), flattened to (B, D) float32, and the class logits
    (B, classes), captured by the hook engine (no hook is left behind)."""
    with LayerCapture(model, layer, gradients=False) as capture, torch.inference_mode(), channel_hint(inputs):
        logits = _class_logits(model(inputs))
    (name,) = layer
    return capture.activations[name].flatten(1).float(), logits


def relative_change(before: Tensor, after: Tensor, eps: float) -> Tensor:
    """|| (before - after) / before ||_2 of each row (B, ...), as Agarwal et al. measure a
    change; where ``before`` is 0, ``eps`` stands in for it (as in Quantus).

    >>> relative_change(torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 0.0]]), 1e-6).tolist()
    [0.5]
    """
    before, after = before.flatten(1).float(), after.flatten(1).float()
    return ((before - after) / torch.where(before == 0, eps, before)).norm(dim=1)


def largest(values: Tensor) -> Tensor:
    """The largest value of each row of ``values`` (M, S), NaNs left out (NaN where a row
    has no other value).

    >>> largest(torch.tensor([[1.0, float("nan"), 3.0], [float("nan"), float("nan"), float("nan")]])).tolist()
    [3.0, nan]
    """
    found = torch.where(values.isnan(), float("-inf"), values).amax(1)
    return torch.where(values.isnan().all(1), float("nan"), found)
