"""The cascade of the parameter randomisation tests: the model's layers re-initialised one
after another, in place, and put back bitwise afterwards; the maps explained again along
the way (plainly, or smoothed over noisy copies)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import Tensor, nn

from ...base import Explainer
from ...baselines import seeded
from ...checks import positive_int
from ...layers import module_calls
from ...passes import advance
from ..base import chunks, draws

__all__ = [
    "cascade",
    "cascade_layers",
    "checkpoint_steps",
    "explain_again",
    "randomisable_layers",
    "randomise",
    "restored_state",
    "smoothed_maps",
]

T = TypeVar("T")

#: The orders the layers are randomised in: from the logits down, or from the input up.
ORDERS = ("top_down", "bottom_up")


def explain_again(explainer: Explainer, images: Tensor, targets: Tensor, batch_size: int) -> Tensor:
    """The maps of ``images`` for ``targets``, explained ``batch_size`` images at a time
    with the model as it is now; each batch counts in the running call's progress."""
    maps = []
    for part in chunks(len(images), batch_size):
        maps.append(explainer(images[part], targets[part]).maps)
        advance(len(maps[-1]))  # the metric's progress counts explanations
    return torch.cat(maps)


def smoothed_maps(
    explainer: Explainer, images: Tensor, targets: Tensor, *, n_samples: int, noise: float, seed: int, batch_size: int
) -> Tensor:
    """Each image's map averaged over ``n_samples`` copies of it, ``n_samples - 1`` with
    Gaussian noise of standard deviation ``noise`` times the image's range (its maximum
    less its minimum over every value) and the last without noise, as Quantus's Smooth
    MPRT draws them (so that one sample is the plain map). Draw ``s`` depends on ``seed``
    and ``s`` alone: every image, and every state of the model, gets the same draws. The
    copies are explained ``batch_size`` at a time."""
    m = len(images)
    spread = noise * (images.flatten(1).amax(1) - images.flatten(1).amin(1))
    rows = torch.arange(m, device=images.device).repeat_interleave(n_samples)
    total: Tensor | None = None
    for part in chunks(m * n_samples, batch_size):
        r = rows[part]
        samples = [i % n_samples for i in range(part.start, part.stop)]
        noisy = draws(seed, samples, images.shape[1:], images.device, normal=True)
        keep = torch.tensor([s < n_samples - 1 for s in samples], device=images.device)
        scale = torch.where(keep, spread[r], 0.0).view(-1, *[1] * (images.dim() - 1))
        maps = explainer(images[r] + (noisy * scale).to(images.dtype), targets[r]).maps.float()
        total = torch.zeros(m, *maps.shape[1:], device=maps.device) if total is None else total
        total.index_add_(0, r, maps)
        advance(len(r))
    assert total is not None
    return total / n_samples


def randomisable_layers(model: nn.Module, images: Tensor) -> list[str]:
    """Names of the modules with their own ``reset_parameters`` that a forward pass of
    ``images`` runs, in the order they first run (found with forward hooks on one image)."""
    calls = module_calls(model, images[:1])
    return list(dict.fromkeys(name for name, module, _ in calls if hasattr(module, "reset_parameters")))


@contextmanager
def restored_state(model: nn.Module) -> Iterator[None]:
    """Put back every parameter and buffer of ``model``, bitwise, on leaving the block."""
    saved = [(tensor, tensor.detach().clone()) for tensor in (*model.parameters(), *model.buffers())]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, copy in saved:
                tensor.copy_(copy)


def cascade_layers(
    model: nn.Module, images: Tensor, layers: Sequence[str] | None, order: str = "top_down"
) -> list[str]:
    """The names of the layers to randomise, in the order they are randomised: ``layers``,
    or by default those of :func:`randomisable_layers` in reverse order of execution
    (``order="top_down"``, from the logits down) or in order of execution
    (``"bottom_up"``, from the input up)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; use one of {', '.join(ORDERS)}")
    if layers is None:
        layers = randomisable_layers(model, images)
        layers = layers[::-1] if order == "top_down" else layers
    layers = list(layers)
    if not layers:
        raise ValueError("the model has no layer to randomise (no module with reset_parameters runs)")
    return layers


def checkpoint_steps(checkpoints: int | None, count: int) -> list[int]:
    """After how many of the ``count`` layers the maps are compared: ``checkpoints`` points
    evenly spaced from the first layer to the last, or every layer."""
    if checkpoints is None or positive_int("checkpoints", checkpoints) >= count:
        return list(range(1, count + 1))
    return sorted(
        {round(1 + i * (count - 1) / (checkpoints - 1)) for i in range(checkpoints)} if checkpoints > 1 else {count}
    )


def randomise(module: nn.Module, seed: int, device: torch.device) -> None:
    """Re-initialise every part of ``module`` with ``reset_parameters``, after seeding ``seed``."""
    with seeded(seed, device), torch.no_grad():
        for child in module.modules():
            reset = getattr(child, "reset_parameters", None)
            if reset is not None:
                reset()


def cascade(
    model: nn.Module,
    modules: list[nn.Module],
    compared: list[int],
    seed: int,
    device: torch.device,
    measure: Callable[[], T],
) -> list[T]:
    """Randomise ``modules`` one after another (each after ``torch.manual_seed(seed + 1)``,
    as Quantus does), the randomisation accumulating, and call ``measure()`` after each
    number of layers in ``compared``; its results, in order. The model's weights are put
    back bitwise afterwards, also after an error."""
    out = []
    with restored_state(model):
        for done, module in enumerate(modules, start=1):
            randomise(module, seed + 1, device)
            if done in compared:
                out.append(measure())
    return out
