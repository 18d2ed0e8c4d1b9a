"""What the saliency and attribution methods share.

An attribution method explains a score by the input itself: one value per input element,
(N, C, H, W), computed by captum (by zennit for LRP). :class:`Attribution` adds what those
libraries leave to their users:

- the CAMs' call shape and targets (top-1, ids, names, ``topk``, a callable) and their
  :class:`~explain.Explanation`, with the signed attributions as ``raw``;
- one map per image from the channels (:func:`reduce_channels`), scaled by a high
  percentile of its magnitude so that a few hot pixels cannot wash it out
  (:func:`normalize_maps`);
- baselines chosen by name (:func:`explain.baselines.make_baselines`, for the methods
  relative to a baseline: :class:`WithBaseline`), an internal batch size that bounds
  memory, a seeded random stream that leaves the caller's untouched;
- the model as it was after the call, also after an exception: no hooks, no attributes
  left on its modules, the same train/eval and ``requires_grad`` flags.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..base import Explainer
from ..baselines import BASELINES, make_baselines, seeded
from ..checks import channel_hint, check_images, positive_int
from ..explanation import Explanation
from ..hooks import preserved_state
from ..options import REDUCTIONS
from ..passes import Passes, advance, inner_rows
from ..targets import Targets, class_logits, custom_target, select_targets
from .cam_base import detached, map_tensors

__all__ = [
    "REDUCTIONS",
    "Attribution",
    "Batched",
    "ScoredModel",
    "WithBaseline",
    "attribute_in_groups",
    "attribution_context",
    "checked_seed",
    "normalize_maps",
    "reduce_channels",
    "rows_per_pass",
    "slice_target",
]

# Attributes DeepLift (captum's and explain's rules) sets on the modules it hooks, and
# removes only when the call succeeds.
_CAPTUM_MODULE_ATTRIBUTES = ("input", "output", "input_ref", "explain_inputs", "explain_outputs")


def reduce_channels(attributions: Tensor, reduction: str = "abs-sum", spatial: int = 2) -> Tensor:
    """One map per image from attributions (..., C, H, W): the sum of absolute values over
    the channels (``"abs-sum"``), the signed sum (``"sum"``), the largest absolute value
    (``"max-abs"``, Simonyan et al.'s saliency map) or the Euclidean norm (``"l2"``).
    ``spatial`` is the number of axes after C: 3 for volumes (..., C, D, H, W), 1 for
    signals (..., C, L).

    >>> a = torch.tensor([[[[3.0]], [[-4.0]]]])   # one image, C = 2, 1 x 1
    >>> [reduce_channels(a, r).item() for r in REDUCTIONS]
    [7.0, -1.0, 4.0, 5.0]
    """
    channels = -spatial - 1
    if reduction == "abs-sum":
        return attributions.abs().sum(dim=channels)
    if reduction == "sum":
        return attributions.sum(dim=channels)
    if reduction == "max-abs":
        return attributions.abs().amax(dim=channels)
    if reduction == "l2":
        return torch.linalg.vector_norm(attributions, dim=channels)
    raise ValueError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")


def normalize_maps(maps: Tensor, clip_percentile: float = 99.0, spatial: int = 2) -> Tensor:
    """Maps (..., H, W) divided by the ``clip_percentile``-th percentile of their absolute
    values and clipped: to [0, 1] for non-negative maps, to [-1, 1] for signed ones. Each
    map is its last ``spatial`` axes: 3 for volumes (..., D, H, W), 1 for signals (..., L).

    A single hot pixel would otherwise set the scale and leave the rest of the map near
    zero; clipping at the 99th percentile keeps the map readable. A map whose percentile is
    zero (evidence on under 1 % of the pixels) is scaled by its maximum instead, and a
    constant map gives zeros: it says nothing about where the evidence is.

    >>> m = torch.arange(100.0).reshape(1, 10, 10); m[0, 0, 0] = 1000.0   # one hot pixel
    >>> round(normalize_maps(m)[0, 5, 0].item(), 3)          # 50 / 99: the outlier is clipped
    0.505
    >>> round(normalize_maps(m, 100.0)[0, 5, 0].item(), 3)   # 50 / 1000 without clipping
    0.05
    >>> normalize_maps(torch.full((1, 4, 4), 3.0)).abs().sum().item()
    0.0
    """
    if not 0.0 < clip_percentile <= 100.0:
        raise ValueError(f"clip_percentile must lie in (0, 100], got {clip_percentile}")
    if not torch.isfinite(maps).all():
        raise ValueError(
            "the attributions hold NaN or infinite values: the model's outputs or gradients "
            "overflowed (float16?); explain in float32"
        )
    flat = maps.flatten(-spatial).float()
    magnitude = flat.abs()
    # kthvalue, not quantile: quantile refuses inputs over 16M elements (large batches).
    rank = max(1, math.ceil(clip_percentile / 100.0 * flat.shape[-1]))
    scale = magnitude.kthvalue(rank, dim=-1, keepdim=True).values
    peak = magnitude.amax(dim=-1, keepdim=True)
    scale = torch.where(scale > 0, scale, peak)
    span = flat.amax(dim=-1, keepdim=True) - flat.amin(dim=-1, keepdim=True)
    informative = (span > 1e-6 * peak) & (peak > 0)
    low = -1.0 if bool((flat < 0).any()) else 0.0
    scaled = torch.where(informative, (flat / torch.where(informative, scale, 1.0)).clamp(low, 1.0), 0.0)
    return scaled.reshape(maps.shape)


def checked_seed(seed: int | None) -> int | None:
    """``seed=`` checked: an int in [0, 2**32), or None for the caller's random streams.

    >>> checked_seed(7), checked_seed(None)
    (7, None)
    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32):
        raise ValueError(f"seed must be an int in [0, 2**32), or None for the caller's random streams; got {seed!r}")
    return None if seed is None else int(seed)


def rows_per_pass(internal_batch_size: int, images: int) -> int:
    """How many copies of each of ``images`` images fit in one pass of
    ``internal_batch_size`` rows (at least one)."""
    return max(1, internal_batch_size // images)


def slice_target(target: Tensor | None, rows: slice) -> Tensor | None:
    """captum's ``target`` for ``images[rows]`` (``None`` stays ``None``)."""
    return None if target is None else target[rows]


def attribute_in_groups(
    attribution, images: Tensor, baselines: Tensor, target: Tensor | None, groups, *args, **options
) -> Tensor:
    """captum's ``attribution.attribute`` of each group (a slice) of ``images``, with the group's
    baselines and targets (none passed where ``target`` is None: captum's neuron methods take
    none), ``args`` and ``options`` the same for every group; the results concatenated."""
    results = []
    for group in groups:
        if target is not None:
            options["target"] = target[group]
        results.append(attribution.attribute(images[group], *args, baselines=baselines[group], **options))
    return torch.cat(results)


@contextmanager
def attribution_context(model: nn.Module) -> Iterator[None]:
    """Around a captum (or zennit) call: eval mode and frozen parameters, gradients on even
    under ``torch.no_grad()`` or ``torch.inference_mode()``, and afterwards, whatever
    happened, the model's flags restored and the attributes captum sets on modules (and
    removes only when a call succeeds) gone."""
    before = {module: set(vars(module)) for module in model.modules()}
    try:
        with preserved_state(model), torch.inference_mode(False), torch.enable_grad(), warnings.catch_warnings():
            # captum announces its temporary ReLU hooks on every call; we remove them, as it does.
            warnings.filterwarnings("ignore", message="Setting backward hooks on ReLU")
            warnings.filterwarnings("ignore", message="Setting forward, backward hooks and attributes on non-linear")
            warnings.filterwarnings("ignore", message="Input Tensor 0 did not already require gradients")
            # captum fits LIME / KernelSHAP one image at a time, as it warns; that is intended.
            warnings.filterwarnings("ignore", message="You are providing multiple inputs for Lime")
            # explain's neuron selectors pick one neuron, or a channel's sum where captum's rule allows it.
            warnings.filterwarnings("ignore", message="The neuron_selector provided is a callable")
            yield
    finally:
        for module, names in before.items():
            for name in _CAPTUM_MODULE_ATTRIBUTES:
                if name not in names and name in vars(module):
                    delattr(module, name)


class ScoredModel(nn.Module):
    """The model, with the explained targets resolved on its first call.

    The first forward pass must start with the ``rows`` images themselves (the images, or
    the images followed by copies such as DeepLift's baselines): it records the model
    output of the images and resolves ``targets`` (top-1 by default) against it, as the
    CAMs do. Afterwards it returns the model output (captum picks the target with
    ``target=``), or, while ``column`` is set, the explained score of target ``column``
    itself, one per row, for methods whose first pass is that one (rows beyond the
    images are taken as copies of them in the same order); a callable target's score is
    always returned as one per row. It holds the model as a submodule so that captum and
    zennit find and hook the model's layers through it.
    """

    def __init__(
        self,
        model: nn.Module,
        targets: Targets,
        topk: int | None,
        class_names: Sequence[str] | None,
        rows: int,
        dtype: torch.dtype | None = None,
        input_size: tuple[int, ...] = (),
    ):
        super().__init__()
        self.model = model
        self.rows = rows
        #: The images' spatial size (H, W), for maps made at another resolution (a layer's).
        self.input_size = input_size
        #: The images' dtype: captum adds float32 noise and baselines, which a float16 model
        #: cannot take, so inputs are cast back to it.
        self.dtype = dtype
        self.targets = targets
        self.topk = topk
        self.class_names = class_names
        self.custom: Callable[[Tensor], Tensor] | None = custom_target(targets)
        #: The model's output for the images (its logits, unless the target is a callable).
        self.output: Tensor | dict | tuple | None = None
        self.ids: Tensor | None = None
        self.column: int | None = None
        #: What a method computes once per call and reuses for every target (superpixels, baselines).
        self.memo: dict = {}

    def forward(self, inputs: Tensor) -> Tensor:
        if self.dtype is not None and inputs.dtype != self.dtype:
            inputs = inputs.to(self.dtype)
        advance(inputs.shape[0])  # the pass before: Ctrl-C stops the call between two passes
        output = self.model(inputs)
        if self.ids is None:
            if inputs.shape[0] % self.rows:
                raise RuntimeError(f"the first pass ran {inputs.shape[0]} rows, not copies of the {self.rows} images")
            images = map_tensors(lambda tensor: tensor[: self.rows] if tensor.dim() else tensor, output)
            _, self.ids = select_targets(images, self.targets, topk=self.topk, class_names=self.class_names)
            self.output = detached(images if self.custom is not None else class_logits(images))
        if self.custom is not None:
            return self.custom(output)
        output = class_logits(output)
        if self.column is not None:
            ids = self.ids_of(self.column)
            if output.shape[0] % self.rows:
                raise RuntimeError(
                    f"a single-pass method ran {output.shape[0]} rows, not copies of the {self.rows} images"
                )
            return output.gather(1, ids.repeat(output.shape[0] // self.rows)[:, None]).squeeze(1)
        return output

    def resolve(self, images: Tensor) -> None:
        """Resolve the targets with one forward pass that records no graph."""
        with torch.no_grad():
            self(images)

    @property
    def resolved_ids(self) -> Tensor:
        """The explained class ids, (N,) or (N, k), which the first call resolves."""
        if self.ids is None:
            raise RuntimeError("the targets are resolved by the first call on the images; call resolve() first")
        return self.ids

    @property
    def num_targets(self) -> int:
        return 1 if self.resolved_ids.dim() == 1 else self.resolved_ids.shape[1]

    def ids_of(self, k: int) -> Tensor:
        """(N,) class ids of explained target ``k``."""
        return self.resolved_ids.view(self.rows, -1)[:, k]

    def explained_scores(self, output, k: int, rows: Tensor | None = None) -> Tensor:
        """(B,) scores of explained target ``k`` in a model ``output`` on the images (or on
        images derived from ``images[rows]``, one output row each)."""
        if self.custom is not None:
            score_rows = getattr(self.custom, "score_rows", None)
            return self.custom(output) if rows is None or score_rows is None else score_rows(output, rows)
        output = class_logits(output)
        ids = self.ids_of(k)
        return output.gather(1, (ids if rows is None else ids[rows])[:, None]).squeeze(1)

    def target(self, k: int) -> Tensor | None:
        """captum's ``target`` for explained target ``k``: the class ids, or ``None`` when the
        forward pass returns the score itself."""
        if self.custom is not None or self.column is not None:
            return None
        return self.ids_of(k)


class Attribution(Explainer):
    """Base class of the saliency and attribution methods.

    Parameters
    ----------
    model:
        A classifier returning (N, num_classes) logits (or any output, with a callable target).
    class_names:
        Names of the classes, for targets given by name; defaults to ``model.class_names``.
    reduction:
        How the channels become one map: ``"abs-sum"`` (default), ``"sum"`` (signed maps,
        shown with a diverging colormap), ``"max-abs"`` or ``"l2"``.
    clip_percentile:
        Maps are divided by this percentile of their magnitude and clipped (default 99);
        100 scales by the maximum.

    Notes
    -----
    Subclasses implement :meth:`attribute`. ``raw`` of the result holds the attributions
    themselves, signed, per channel: (N, C, H, W), or (N, k, C, H, W) with ``topk=k``
    (volumes: (N, C, D, H, W), signals: (N, C, L)). Methods that apply to images only set
    ``images_only`` to the reason, and raise :class:`~explain.NotApplicable` on other inputs.
    """

    family: ClassVar[str] = "attribution"
    needs_layer: ClassVar[bool] = False
    #: Whether the method's first forward pass starts with the images themselves, so that
    #: the targets are read from it; other methods resolve them with one extra forward pass.
    single_pass: ClassVar[bool] = False
    #: The key of ``raw_layers``: attributions are maps of the input.
    layer_label: ClassVar[str] = "input"
    #: Whether the attributions are never negative, so that no reduction makes them signed.
    nonnegative: ClassVar[bool] = False
    #: Whether :meth:`~explain.Explainer.check` runs the method on the first image: where what the method
    #: cannot handle in a model shows only in a full pass.
    check_runs: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        *,
        class_names: Sequence[str] | None = None,
        reduction: str = "abs-sum",
        clip_percentile: float = 99.0,
    ):
        super().__init__(model, class_names=class_names)
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
        if (
            isinstance(clip_percentile, bool)
            or not isinstance(clip_percentile, (int, float))
            or not 0 < clip_percentile <= 100
        ):
            raise ValueError(f"clip_percentile must be a number in (0, 100], got {clip_percentile!r}")
        self.reduction = reduction
        self.clip_percentile = float(clip_percentile)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        """Attributions shaped as ``images`` (N, C, H, W) of explained target ``k``, computed
        through ``scored`` (whose ``target(k)`` is captum's ``target``)."""
        raise NotImplementedError

    def attribute_targets(self, scored: ScoredModel, images: Tensor) -> list[Tensor]:
        """The attributions of every explained target, once the targets are resolved;
        methods that can share work between targets override this."""
        return [self.attribute(scored, images, k) for k in range(scored.num_targets)]

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        """The attributions of each target (:meth:`attribute`), their channels reduced
        (``reduction``) and the maps normalised: volumes (N, C, D, H, W) and signals
        (N, C, L) give maps (N, D, H, W) and (N, L)."""
        return self.explained(images, targets, topk, {})

    def explained(self, images: Tensor, targets: Targets, topk: int | None, memo: dict) -> Explanation:
        """The body of a call, the call's ``memo`` started with ``memo`` (a call with
        ``segments=`` starts it with the segments, see
        :class:`~explain.methods.segment_attribution.TakesSegments`)."""
        images = check_images(images, self.model)
        self.check_applies(images)
        scored = ScoredModel(
            self.model, targets, topk, self.class_names, len(images), images.dtype, tuple(images.shape[2:])
        )
        scored.memo.update(memo)
        columns = []
        planned = self.call_passes(images, scored.memo) * (topk or 1)
        with attribution_context(self.model), channel_hint(images), Passes(self.name, planned):
            if images.is_inference():  # made under inference_mode: autograd cannot use it
                images = images.clone()
            if self.single_pass:
                k = 0
                while scored.ids is None or k < scored.num_targets:  # the first call resolves them
                    scored.column = k
                    columns.append(self.attribute(scored, images, k))
                    k += 1
            else:
                scored.resolve(images)
                columns = self.attribute_targets(scored, images)
        columns = [column.detach() if column.dtype == torch.float64 else column.detach().float() for column in columns]
        raw = columns[0] if scored.resolved_ids.dim() == 1 else torch.stack(columns, dim=1)
        return self.explanation(raw, scored)

    def call_passes(self, images: Tensor, memo: dict) -> int:
        """The rows a call on ``images`` runs (one target each), knowing its ``memo``: by
        default :meth:`~explain.Explainer.planned_passes`."""
        return self.planned_passes(images)

    def explanation(self, raw: Tensor, scored: ScoredModel) -> Explanation:
        """The Explanation of attributions ``raw``: channels reduced, maps normalised."""
        spatial = raw.dim() - 2 - (scored.resolved_ids.dim() - 1)
        maps = normalize_maps(reduce_channels(raw, self.reduction, spatial), self.clip_percentile, spatial)
        assert scored.output is not None  # recorded with the ids
        return Explanation(
            maps.float(),
            {self.layer_label: raw},
            scored.output,
            scored.resolved_ids,
            self.name,
            self.class_names,
            signed=self.reduction == "sum" and not self.nonnegative,
        )

    def check(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> None:
        """Raise now what a call would raise for a mistake in the model or targets, at the
        cost of one forward pass (of a call on the first image, where ``check_runs``)."""
        images = check_images(images, self.model)
        self.check_applies(images)
        if self.check_runs:
            per_image = (
                custom_target(targets) is None
                and not isinstance(targets, (str, int))
                and targets is not None
                and (len(targets) == len(images) if isinstance(targets, Sequence) else getattr(targets, "ndim", 0) >= 1)
            )
            first = targets[:1] if per_image else targets  # type: ignore[index]  # per_image: a sequence or an array
            self(images[:1], first, topk=topk)
            return
        with attribution_context(self.model), channel_hint(images):
            ScoredModel(self.model, targets, topk, self.class_names, len(images), images.dtype).resolve(images)

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return (self.layer_label,)


class Batched(Attribution):
    """Base class of the methods that multiply the batch (steps, samples, windows,
    baselines) and may draw at random.

    ``internal_batch_size`` bounds the rows of one pass through the model; by default (None)
    as many as fit in the memory budget, at the fastest size measured for the model
    (:func:`~explain.passes.inner_rows`). ``seed`` seeds the random draws of each image
    (``None``: the caller's random streams).
    """

    def __init__(self, model: nn.Module, *, seed: int | None = 0, internal_batch_size: int | None = None, **options):
        super().__init__(model, **options)
        self.seed = checked_seed(seed)
        self.internal_batch_size = (
            None if internal_batch_size is None else positive_int("internal_batch_size", internal_batch_size)
        )

    def rows(self, images: Tensor, total: int, call_rows: int | None = None) -> int:
        """Rows of one pass for a call that runs ``total`` rows like ``images[0]`` (of
        ``call_rows`` in all, by default :meth:`~explain.Explainer.planned_passes`):
        ``internal_batch_size``, or sized from the memory budget."""
        return inner_rows(
            self.model,
            images,
            backward=self.backward,
            total=total,
            given=self.internal_batch_size,
            call_rows=call_rows or self.planned_passes(images),
        )


class WithBaseline(Batched):
    """An attribution relative to a baseline input (see :func:`make_baselines`)."""

    def __init__(self, model: nn.Module, *, baseline: str | float | Tensor = "zeros", **options):
        super().__init__(model, **options)
        self.baseline = baseline
        if isinstance(baseline, str) and baseline not in BASELINES:
            make_baselines(torch.zeros(1, 1, 2, 2), baseline)  # raises, naming the choices

    def baselines(self, scored: ScoredModel, images: Tensor) -> Tensor:
        """The baselines of ``images``, made once per call; noise is drawn per image."""
        if "baselines" not in scored.memo:
            if isinstance(self.baseline, str) and self.baseline == "noise":
                draws = []
                for image in images.split(1):
                    with seeded(self.seed, images.device):
                        draws.append(make_baselines(image, "noise"))
                scored.memo["baselines"] = torch.cat(draws)
            else:
                scored.memo["baselines"] = make_baselines(images, self.baseline)
        return scored.memo["baselines"]
