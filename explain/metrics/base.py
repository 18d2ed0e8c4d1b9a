"""What every metric shares: the result type, the (image, target) pairs a metric scores, and
the batched, gradient-free model passes over perturbed copies of the images."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..checks import channel_hint, check_images, positive_int
from ..explanation import Explanation
from ..hooks import preserved_state
from ..passes import Passes, inner_rows
from ..targets import class_logits

__all__ = [
    "Pairs",
    "Score",
    "batch_size_for",
    "batched_scores",
    "draws",
    "explanation_batch",
    "listed_scores",
    "neighbour_agreement",
    "pairs_of",
    "pearson",
    "perturbation_curve",
    "perturbed_scores",
    "probability_and_hit",
    "read_scores",
    "top_classes",
]


@dataclass(frozen=True)
class Score:
    """One metric's values for a batch of explanations, with the curves behind them.

    Attributes
    ----------
    metric:
        The metric's name.
    values:
        One value per explained target: (N,), or (N, k) for an explanation made with ``topk=k``.
    higher_is_better:
        Which way is better, or ``None`` for a measure that only describes the map.
    curves:
        Named curves behind the values, each (N, S) (or (N, k, S)), over ``steps``:
        e.g. the target's probability as pixels are deleted.
    steps:
        The x-axis of the curves, (S,): a fraction of the image, a percentage, or a layer's
        position in the cascade.
    step_labels:
        Names of the steps where they have names (the randomised layers).
    extra:
        Further per-target values the metric computes on the way, shaped like ``values``.
    """

    metric: str
    values: Tensor
    higher_is_better: bool | None
    curves: dict[str, Tensor] = field(default_factory=dict)
    steps: Tensor | None = None
    step_labels: tuple[str, ...] | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)

    def mean(self) -> float:
        """The mean over every explained target (NaNs ignored)."""
        return float(self.values.float().nanmean())

    def __len__(self) -> int:
        return self.values.shape[0]


@dataclass(frozen=True)
class Pairs:
    """The (image, map, target) triples a metric scores, one per explained target.

    An explanation made with ``topk=k`` gives k triples per image; ``shape`` is the shape
    to give the per-triple values back, (N,) or (N, k).
    """

    images: Tensor  # (M, C, H, W)
    maps: Tensor  # (M, H, W)
    targets: Tensor  # (M,)
    shape: tuple[int, ...]
    signed: bool

    def unflatten(self, values: Tensor) -> Tensor:
        """Per-triple values (M, ...) back in the explanation's target layout."""
        return values.reshape(*self.shape, *values.shape[1:])

    @property
    def per_image(self) -> int:
        """Targets per image, k (1 without topk): triple ``i`` is of image ``i // k``."""
        return 1 if len(self.shape) == 1 else self.shape[1]


def pairs_of(
    model: nn.Module, images: Tensor, explanation: Explanation | Tensor, targets: Tensor | None = None
) -> Pairs:
    """Check that ``explanation`` explains ``images`` and flatten it to one triple per target.

    ``explanation`` is an :class:`~explain.Explanation` or maps of shape (N, H, W) (or
    (N, k, H, W)) with ``targets`` of shape (N,) (or (N, k)) given separately.
    """
    images = check_images(images, model)
    if isinstance(explanation, Explanation):
        maps, signed = explanation.maps, explanation.signed
        targets = explanation.targets if targets is None else targets
    elif isinstance(explanation, Tensor):
        maps, signed = explanation, bool((explanation < 0).any())
        if targets is None:
            raise ValueError("maps given as a tensor need their targets: pass targets= (class ids, (N,))")
    else:
        raise TypeError(
            f"explanation must be an explain.Explanation or a tensor of maps, got {type(explanation).__name__}"
        )
    targets = torch.as_tensor(targets, device=images.device)
    n, height, width = images.shape[0], *images.shape[-2:]
    if maps.dim() not in (3, 4) or maps.shape[0] != n or tuple(maps.shape[-2:]) != (height, width):
        raise ValueError(
            f"maps have shape {tuple(maps.shape)} but the images are {tuple(images.shape)}: a metric needs one "
            f"map per image at the images' size, ({n}, {height}, {width}) (or ({n}, k, {height}, {width}) with topk)"
        )
    if tuple(targets.shape) != tuple(maps.shape[:-2]):
        raise ValueError(f"targets have shape {tuple(targets.shape)}; the maps need {tuple(maps.shape[:-2])}")
    if targets.dtype.is_floating_point or (targets < 0).any():
        raise ValueError(
            "a metric reads the explained class's score, so targets must be class ids; an explanation "
            "made with a callable target has none: explain class ids, or pass targets="
        )
    check_finite(maps)
    shape = tuple(targets.shape)
    k = 1 if maps.dim() == 3 else maps.shape[1]
    return Pairs(
        images=images.repeat_interleave(k, dim=0) if k > 1 else images,
        maps=maps.reshape(-1, height, width).to(images.device, torch.float32),
        targets=targets.reshape(-1).long(),
        shape=shape,
        signed=signed,
    )


def check_finite(maps: Tensor) -> Tensor:
    """``maps``, after checking that they hold no NaN or infinite value (a score of such maps
    would be a number that means nothing)."""
    if not torch.isfinite(maps).all():
        raise ValueError(
            "the maps hold NaN or infinite values: the explainer's scores or gradients overflowed; "
            "explain in float32 (model.float(), images.float()) and check the model's output is finite"
        )
    return maps


def check_target_range(output: Tensor, targets: Tensor) -> None:
    """Raise where a target class id is not one of the (M, classes) ``output``'s classes."""
    if targets.numel() and int(targets.max()) >= output.shape[1]:
        raise ValueError(
            f"target class {int(targets.max())} is out of range: the model has {output.shape[1]} "
            f"classes (ids 0..{output.shape[1] - 1})"
        )


SCORES = ("probability", "logit")


def read_scores(output: Tensor, targets: Tensor, score: str | Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """The targets' softmax probability (or raw logit) in a model output (M, classes);
    ``score`` may also be a function of the output and the targets."""
    output = class_logits(output)
    if not isinstance(output, Tensor) or output.dim() != 2:
        raise ValueError(
            f"a metric reads class scores from an (N, classes) output; this model returns "
            f"{type(output).__name__}{'' if not isinstance(output, Tensor) else tuple(output.shape)}"
        )
    output = output.float()
    check_target_range(output, targets)
    if callable(score):
        return score(output, targets)
    if score == "probability":
        output = output.softmax(dim=1)
    elif score != "logit":
        raise ValueError(f"unknown score {score!r}; use one of {', '.join(SCORES)}")
    return output.gather(1, targets[:, None]).squeeze(1)


def probability_and_hit(output: Tensor, targets: Tensor) -> Tensor:
    """A ``score`` for :func:`read_scores` that reads two numbers per row of a (M, classes)
    output: the target's softmax probability, and 1 where the target is the top class (0
    elsewhere), (M, 2).

    >>> probability_and_hit(torch.tensor([[0.0, 0.0], [2.0, 0.0]]), torch.tensor([1, 1])).tolist()[1][1]
    0.0
    """
    probability = output.softmax(1).gather(1, targets[:, None])[:, 0]
    return torch.stack([probability, (output.argmax(1) == targets).float()], 1)


def batched_scores(model: nn.Module, batches: Iterator[tuple[Tensor, Tensor]], score, total: int = 0) -> Tensor:
    """Run ``(inputs, targets)`` batches through ``model`` under ``inference_mode``, in eval
    mode as explainers run it (batch norm neither learns from the perturbed batches nor
    depends on them), and return the targets' scores, concatenated. ``total`` rows in all
    are counted by the call's progress (:class:`~explain.passes.Passes`); Ctrl-C stops it
    between two batches."""
    out = []
    with preserved_state(model), torch.inference_mode(), Passes(None, total) as passes:
        for inputs, targets in batches:
            with channel_hint(inputs):
                out.append(read_scores(model(inputs), targets, score))
            passes.advance(len(inputs))
    return torch.cat(out)


def draws(
    seed: int | None, indices: list[int], shape: tuple[int, ...], device: torch.device, *, normal: bool = False
) -> Tensor:
    """Random tensors of ``shape``, one per index, uniform in [0, 1) (``normal``: standard
    normal). Draw ``i`` depends only on ``seed`` and ``i``, so every image gets the same
    noise at the same step whatever its position or batch; ``seed=None`` draws from the
    caller's torch stream instead."""
    sample = torch.randn if normal else torch.rand
    if seed is None:
        return sample(len(indices), *shape, device=device)
    generator = torch.Generator(device=device)
    out = []
    for index in indices:
        generator.manual_seed(seed * 1_000_003 + index)
        out.append(sample(shape, generator=generator, device=device))
    return torch.stack(out)


#: Images explained again per explainer call when ``batch_size`` is None (the explainer
#: sizes its own passes): on the CPU small batches keep the convolutions' data in cache
#: (resnet18 at 224 px on 2 cores: 67 images/s in batches of 8, 63 of 16, 49 of 64); on a
#: GPU, larger ones fill the device.
DEFAULT_BATCH_SIZES = {"cpu": 8, "other": 64}


def batch_size_for(batch_size: int | None, model: nn.Module, images: Tensor, total: int) -> int:
    """Images per pass of a metric that runs ``total`` perturbed copies of ``images`` through
    ``model``: ``batch_size`` checked, or where it is None as many as fit in the memory
    budget at the fastest size measured for the model (:func:`~explain.passes.inner_rows`).

    >>> batch_size_for(3, nn.Identity(), torch.zeros(1, 3, 8, 8), 100)
    3
    """
    if batch_size is not None:
        return positive_int("batch_size", batch_size)
    with preserved_state(model):
        return inner_rows(model, images, backward=False, total=total)


def explanation_batch(batch_size: int | None, device: torch.device) -> int:
    """Images per explainer call of a metric that explains again: ``batch_size`` checked, or
    the default for ``device`` (:data:`DEFAULT_BATCH_SIZES`).

    >>> explanation_batch(None, torch.device("cpu")), explanation_batch(3, torch.device("cpu"))
    (8, 3)
    """
    if batch_size is None:
        return DEFAULT_BATCH_SIZES["cpu" if device.type == "cpu" else "other"]
    return positive_int("batch_size", batch_size)


def chunks(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def perturbed_scores(
    model: nn.Module,
    images: Tensor,
    targets: Tensor,
    columns: int,
    perturb: Callable[[Tensor, Tensor], Tensor],
    *,
    batch_size: int | None,
    score: str | Callable[[Tensor, Tensor], Tensor],
) -> Tensor:
    """The targets' scores on ``columns`` perturbed copies of each image, (M, columns).

    ``perturb(rows, columns)`` returns the perturbed copies (B, C, H, W) of a batch: copy
    ``b`` is image ``rows[b]`` perturbed the ``columns[b]``-th way. Each batch is built as it
    runs, so memory stays at ``batch_size`` images whatever the number of copies (None:
    sized by :func:`batch_size_for`); ``score`` is read as :func:`read_scores` reads it.

    >>> model = nn.Sequential(nn.Flatten(), nn.Linear(2, 1))
    >>> images = torch.ones(2, 1, 1, 2)
    >>> scaled = perturbed_scores(model, images, torch.zeros(2, dtype=torch.long), 3,
    ...                           lambda rows, cols: images[rows] * cols.view(-1, 1, 1, 1), batch_size=4, score="logit")
    >>> scaled.shape
    torch.Size([2, 3])
    """
    m = images.shape[0]
    total = m * columns
    batch_size = batch_size_for(batch_size, model, images, total)
    rows = torch.arange(m, device=images.device).repeat_interleave(columns)
    cols = torch.arange(columns, device=images.device).repeat(m)

    def batches() -> Iterator[tuple[Tensor, Tensor]]:
        for part in chunks(total, batch_size):
            yield perturb(rows[part], cols[part]), targets[rows[part]]

    scores = batched_scores(model, batches(), score, total)
    return scores.view(m, columns, *scores.shape[1:])


def listed_scores(
    model: nn.Module,
    images: Tensor,
    targets: Tensor,
    rows: Tensor,
    build: Callable[[Tensor], Tensor],
    *,
    batch_size: int | None,
    score: str | Callable[[Tensor, Tensor], Tensor],
) -> Tensor:
    """The targets' scores on a list of perturbed copies, (J,): copy ``j`` is of image
    ``rows[j]``, and ``build(jobs)`` returns the copies (B, C, H, W) of a batch of job
    indices. For metrics whose images need different numbers of copies; batches are built
    as :func:`perturbed_scores` builds them.

    >>> model = nn.Sequential(nn.Flatten(), nn.Linear(2, 1))
    >>> images = torch.ones(2, 1, 1, 2)
    >>> listed_scores(model, images, torch.zeros(2, dtype=torch.long), torch.tensor([0, 0, 1]),
    ...               lambda jobs: images[torch.tensor([0, 0, 1])[jobs]], batch_size=2, score="logit").shape
    torch.Size([3])
    """
    total = len(rows)
    batch_size = batch_size_for(batch_size, model, images, max(total, 1))
    jobs = torch.arange(total, device=images.device)
    rows = rows.to(images.device)

    def batches() -> Iterator[tuple[Tensor, Tensor]]:
        for part in chunks(total, batch_size):
            yield build(jobs[part]), targets[rows[part]]

    if total == 0:
        return torch.empty(0, device=images.device)
    return batched_scores(model, batches(), score, total)


def top_classes(model: nn.Module, images: Tensor, *, batch_size: int | None) -> Tensor:
    """The model's top class for each image, (N,) int64, in batches as the other passes."""
    n = len(images)
    size = batch_size_for(batch_size, model, images, n)
    anyone = torch.zeros(n, dtype=torch.long, device=images.device)
    batches = ((images[part], anyone[part]) for part in chunks(n, size))
    return batched_scores(model, batches, lambda output, _: output.argmax(1).float(), n).long()


def neighbour_agreement(similar: Tensor, pairs: Pairs, classes: Tensor) -> tuple[Tensor, Tensor]:
    """For each triple, the share of the *other images'* triples marked in its row of
    ``similar`` (M, M) whose image the model puts in the same class (``classes`` (N,) per
    image), NaN where none is marked; with the number marked, (M,) each. A triple's
    neighbours never include the triples of its own image (the other targets of a ``topk``
    explanation).

    >>> pairs = Pairs(torch.zeros(3, 1, 2, 2), torch.zeros(3, 2, 2), torch.zeros(3, dtype=torch.long), (3,), False)
    >>> share, count = neighbour_agreement(torch.ones(3, 3, dtype=torch.bool), pairs, torch.tensor([4, 4, 7]))
    >>> share.tolist(), count.tolist()
    ([0.5, 0.5, 0.0], [2, 2, 2])
    """
    m, k = len(pairs.targets), pairs.per_image
    image = torch.arange(m, device=similar.device) // k
    others = similar & (image[:, None] != image[None, :])
    per_triple = classes.to(similar.device)[image]
    agree = others & (per_triple[:, None] == per_triple[None, :])
    count = others.sum(1)
    share = agree.sum(1).double() / count.clamp_min(1)
    return torch.where(count > 0, share, float("nan")).float(), count


def perturbation_curve(
    model: nn.Module,
    images: Tensor,
    targets: Tensor,
    keys: Tensor,
    thresholds: Tensor,
    fill: Tensor | Callable[[Tensor, Tensor, Tensor, Tensor], Tensor],
    *,
    batch_size: int | None,
    score: str | Callable[[Tensor, Tensor], Tensor],
) -> Tensor:
    """The targets' scores as ever more of each image is replaced, (M, S).

    At step ``s`` the pixels whose ``keys`` (M, H, W) are below ``thresholds[s]`` are replaced
    by ``fill``: a tensor (M, C, H, W) of replacement values, or a function
    ``fill(images, replaced, rows, steps)`` of a batch of images (B, C, H, W), their
    replaced pixels (B, H, W), their rows in ``images`` and their steps that returns the
    perturbed batch. ``score`` is read as :func:`read_scores` reads it. Batches are built
    as :func:`perturbed_scores` builds them.
    """
    thresholds = thresholds.to(keys.device)

    def perturb(r: Tensor, c: Tensor) -> Tensor:
        replaced = keys[r] < thresholds[c].view(-1, 1, 1)
        if callable(fill):
            return fill(images[r], replaced, r, c)
        return torch.where(replaced[:, None], fill[r], images[r])

    return perturbed_scores(model, images, targets, thresholds.numel(), perturb, batch_size=batch_size, score=score)


def pearson(a: Tensor, b: Tensor) -> Tensor:
    """Pearson's correlation of each pair of rows of ``a`` and ``b`` (..., K), computed in
    float64; 0 where either row is constant (it has nothing to correlate).

    >>> pearson(torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]), torch.tensor([[3.0, 2.0, 0.0], [1.0, 2.0, 3.0]]))
    tensor([-0.9820,  0.0000])
    """
    x = a.double() - a.double().mean(-1, keepdim=True)
    y = b.double() - b.double().mean(-1, keepdim=True)
    norms = (x.square().sum(-1) * y.square().sum(-1)).sqrt()
    varies = (a.amax(-1) > a.amin(-1)) & (b.amax(-1) > b.amin(-1)) & (norms > 0)
    correlation = torch.where(varies, (x * y).sum(-1) / norms.clamp_min(1e-300), 0.0)
    return correlation.float()


def ranks(values: Tensor, descending: bool = True) -> Tensor:
    """Each element's position (0 = first) when each row of ``values`` (M, ...) is sorted;
    ties keep their order in the row (a stable sort), so results are reproducible.

    >>> ranks(torch.tensor([[0.2, 0.9, 0.2, 0.5]])).tolist()
    [[2, 0, 3, 1]]
    """
    flat = values.flatten(1)
    order = flat.argsort(dim=1, descending=descending, stable=True)
    position = torch.empty_like(order)
    position.scatter_(1, order, torch.arange(flat.shape[1], device=flat.device).expand_as(order))
    return position.view(values.shape)
