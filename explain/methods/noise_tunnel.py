"""SmoothGrad, SmoothGrad-squared and VarGrad of any method: its maps of noisy copies of the
image, aggregated (a noise tunnel).

:class:`NoiseTunnel` wraps an explainer of the library, an attribution (Integrated Gradients,
Input x Gradient, Guided Backprop, DeepLift, LRP, a layer attribution, ...) or a CAM, and
explains each image by that method's ``raw`` maps of ``n_samples`` copies x + N(0, sigma^2),
sigma = ``noise_level`` * (max(x) - min(x)) of each image, for the targets of the image
itself:

- ``kind="smoothgrad"``: their mean (Smilkov et al. 2017);
- ``kind="smoothgrad-sq"``: the mean of their squares (Hooker et al. 2019);
- ``kind="vargrad"``: their variance (Adebayo et al. 2018).

By name, ``KIND:METHOD`` (``smoothgrad:ig``, ``smoothgrad-sq:guidedbp``, ``vargrad:gradcam``)
makes one with :func:`explain.explainer` and ``explain run --method``; the options go to the
method, but ``n_samples`` and ``noise_level`` (the tunnel's) and ``seed`` (both's). The
registered ``smoothgrad`` and ``vargrad`` are the plain gradient's (captum's NoiseTunnel over
Saliency) and equal ``smoothgrad:saliency`` and ``vargrad:saliency``.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch
from torch import Tensor, nn

from ..base import Explainer, NotApplicable, keyword_parameters, method_key
from ..baselines import seeded
from ..checks import channel_hint, check_images, checked_number, positive_int
from ..explanation import Explanation, scale_maps
from ..passes import Passes, advance, inner_rows
from ..targets import Targets, output_rows
from .attribution_base import Attribution, ScoredModel, attribution_context, checked_seed

__all__ = ["KINDS", "NoiseTunnel", "tunnel_class"]

#: The aggregates of a noise tunnel, as ``kind=`` and the ``KIND:`` of a method name take them.
KINDS = ("smoothgrad", "smoothgrad-sq", "vargrad")
#: The tunnel's own options in ``KIND:METHOD``'s keyword arguments (``seed`` goes to both).
TUNNEL_OPTIONS = ("n_samples", "noise_level")


def checked_kind(kind: str) -> str:
    """``kind`` as one of :data:`KINDS` (case, dashes and underscores ignored: captum's
    ``smoothgrad_sq`` is ``smoothgrad-sq``)."""
    keys = {method_key(known): known for known in KINDS}
    if not isinstance(kind, str) or method_key(kind) not in keys:
        raise ValueError(f"unknown noise tunnel {kind!r}; use one of {', '.join(KINDS)}")
    return keys[method_key(kind)]


class ImageRows:
    """A target that scores rows derived from one image (its noisy copies) against what it
    chose for that image: a target with ``score_rows`` (segmentation, detection, similarity)
    picks its class, region or box by row."""

    def __init__(self, target, image: int):
        self.target, self.image = target, image

    def __call__(self, output) -> Tensor:
        rows = torch.full((output_rows(output),), self.image, dtype=torch.long)
        return self.target.score_rows(output, rows)

    def score_rows(self, output, rows: Tensor) -> Tensor:
        return self.target.score_rows(output, torch.full_like(rows, self.image))


class NoiseTunnel(Explainer):
    """A method's maps of noisy copies of the image, aggregated: SmoothGrad (their mean),
    SmoothGrad-squared (the mean of their squares) or VarGrad (their variance).

    ``method``'s ``raw`` maps of ``n_samples`` copies x + N(0, sigma^2), sigma = ``noise_level``
    * (max(x) - min(x)) per image, each for the image's own targets, are averaged
    (``kind="smoothgrad"``), squared and averaged (``"smoothgrad-sq"``) or their variance taken
    (``"vargrad"``, the mean of the squares less the square of the mean); the maps are made
    from the aggregate as ``method`` makes its own (an attribution's channels reduced, a CAM's
    maps scaled).

    Smilkov et al., "SmoothGrad: removing noise by adding noise", arXiv:1706.03825, 2017, eq. 3
    (n = 50, noise level 10-20 %); Hooker et al., "A Benchmark for Interpretability Methods in
    Deep Neural Networks", NeurIPS 2019, sec. 3 (SmoothGrad-squared); Adebayo et al., "Local
    Explanation Methods for Deep Neural Networks Lack Sensitivity to Parameter Values", ICLR
    workshop 2018 (VarGrad). As captum's NoiseTunnel, but over any method of the library. The
    noise of each image is drawn from ``seed`` on its own stream (``None``: the caller's), the
    copies go to ``method`` in groups sized from the memory budget (by ``method``'s
    ``internal_batch_size`` where it has one), and the progress counts ``method``'s passes.

    >>> import explain, torchvision
    >>> model = torchvision.models.resnet18(num_classes=4).eval()
    >>> tunnel = NoiseTunnel(explain.IntegratedGradients(model, n_steps=4), kind="vargrad", n_samples=3)
    >>> tunnel.name, tuple(tunnel(torch.rand(1, 3, 32, 32)).maps.shape)
    ('vargrad:ig', (1, 32, 32))
    """

    family = "noise tunnel"

    def __init__(
        self,
        method: Explainer,
        *,
        kind: str = "smoothgrad",
        n_samples: int = 50,
        noise_level: float = 0.15,
        seed: int | None = 0,
    ):
        if not isinstance(method, Explainer):
            raise TypeError(
                f"NoiseTunnel wraps an explainer, such as explain.IntegratedGradients(model); got {method!r}"
            )
        if getattr(method, "aug_smooth", False):
            raise ValueError(
                "aug_smooth averages maps, not raw maps: smooth with aug_smooth or a noise tunnel, not both"
            )
        if getattr(method, "train_mode", False) or getattr(method, "create_graph", False):
            raise NotApplicable(
                "a noise tunnel makes no maps inside a training loop: leave train_mode and create_graph off"
            )
        super().__init__(method.model, class_names=method.class_names)
        self.method = method
        self.kind = checked_kind(kind)
        self.n_samples = positive_int("n_samples", n_samples)
        self.noise_level = checked_number("noise_level", noise_level, positive=True)
        self.seed = checked_seed(seed)
        # What the registry reads from a class, this tunnel takes from its method (an instance's own).
        vars(self).update(name=f"{self.kind}:{method.name}", backward=method.backward, images_only=method.images_only)

    @property
    def explains_class(self) -> bool:
        """Whether a call explains class targets (a method with ``neuron=`` takes none)."""
        return bool(getattr(self.method, "explains_class", True))

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_samples * self.method.planned_passes(images[:1]))

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return self.method.layer_names(images)

    def check(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> None:
        self.method.check(images, targets, topk=topk)

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        """Explain ``targets`` (default: each image's top class) as ``method`` does, through
        ``n_samples`` noisy copies of each image."""
        images = check_images(images, self.model)
        self.method.check_applies(images)
        if not self.explains_class and (targets is not None or topk is not None):
            raise ValueError(f"{self.method.name} with neuron= explains the neuron's activation: pass no targets")
        size = tuple(images.shape[2:])
        scored = ScoredModel(self.model, targets, topk, self.class_names, len(images), images.dtype, size)
        planned = len(images) + (topk or 1) * (self.planned_passes(images) - len(images))
        with attribution_context(self.model), channel_hint(images), Passes(self.name, planned):
            if images.is_inference():  # made under inference_mode: autograd cannot use it
                images = images.clone()
            scored.resolve(images)  # the targets of the images themselves, for their copies
            sums, squares = self.moments(scored, images)
        mean = {name: total / self.n_samples for name, total in sums.items()}
        if self.kind == "smoothgrad":
            raw = mean
        elif self.kind == "smoothgrad-sq":
            raw = {name: total / self.n_samples for name, total in squares.items()}
        else:  # a variance is never negative: below zero is rounding
            raw = {name: (squares[name] / self.n_samples - mean[name] ** 2).clamp_min(0) for name in mean}
        return self.explanation(raw, scored)

    def moments(self, scored: ScoredModel, images: Tensor) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The sums of ``method``'s raw maps of each image's noisy copies, and of their squares."""
        copies = self.copies_per_call(images)
        sums: dict[str, list[Tensor]] = {}
        squares: dict[str, list[Tensor]] = {}
        for i in range(len(images)):
            noisy = self.noisy(images[i : i + 1])
            total: dict[str, Tensor] = {}
            total_sq: dict[str, Tensor] = {}
            for start in range(0, self.n_samples, copies):
                chunk = noisy[start : start + copies]
                result = self.method._explain(chunk, self.targets_of(scored, i, len(chunk)))  # inside this call
                advance(self.method.planned_passes(chunk) * scored.num_targets)
                for name, raw in result.raw_layers.items():
                    part, part_sq = raw.sum(dim=0), (raw * raw).sum(dim=0)
                    total[name] = total[name] + part if name in total else part
                    total_sq[name] = total_sq[name] + part_sq if name in total_sq else part_sq
            for name in total:
                sums.setdefault(name, []).append(total[name])
                squares.setdefault(name, []).append(total_sq[name])
        return {name: torch.stack(maps) for name, maps in sums.items()}, {
            name: torch.stack(maps) for name, maps in squares.items()
        }

    def noisy(self, image: Tensor) -> Tensor:
        """``n_samples`` copies of ``image`` (1, C, ...) with Gaussian noise of sigma
        ``noise_level`` * its range, drawn on the image's own seeded stream as captum's
        NoiseTunnel draws it."""
        span = float(image.max() - image.min())
        shape = (self.n_samples, *image.shape[1:])
        with seeded(self.seed, image.device):
            noise = torch.normal(0.0, torch.full(shape, self.noise_level * span, device=image.device))
        return (image + noise).to(image.dtype)

    def copies_per_call(self, images: Tensor) -> int:
        """Noisy copies per call of ``method``: as many as its passes fit in an inner batch,
        ``method``'s ``internal_batch_size`` where it has one, else the memory budget's."""
        per_copy = max(1, self.method.planned_passes(images[:1]))
        rows = inner_rows(
            self.model,
            images,
            backward=self.method.backward,
            total=self.n_samples * per_copy,
            given=getattr(self.method, "internal_batch_size", None),
            call_rows=self.planned_passes(images),
        )
        return max(1, rows // per_copy)

    def targets_of(self, scored: ScoredModel, image: int, copies: int) -> Targets:
        """The targets of ``copies`` copies of image ``image``: its class ids (k of them with
        ``topk``), or the callable target (scoring every copy as the image, where it picks by row)."""
        if not self.explains_class:
            return None
        if scored.custom is not None:
            return ImageRows(scored.custom, image) if hasattr(scored.custom, "score_rows") else scored.custom
        ids = scored.resolved_ids[image]
        return ids.expand(copies, *ids.shape).tolist()

    def explanation(self, raw_layers: dict[str, Tensor], scored: ScoredModel) -> Explanation:
        """The maps of the aggregated ``raw_layers`` as ``method`` makes its own."""
        assert scored.output is not None  # recorded with the targets
        if isinstance(self.method, Attribution):
            (raw,) = raw_layers.values()
            result = self.method.explanation(raw, scored)
        else:  # a CAM's maps: each layer's scaled to the input, averaged, scaled again
            size = scored.input_size
            maps = torch.stack([scale_maps(raw, size) for raw in raw_layers.values()]).mean(dim=0)
            maps = scale_maps(maps, size) if len(raw_layers) > 1 else maps
            result = Explanation(maps, raw_layers, scored.output, scored.resolved_ids, self.name, self.class_names)
        return replace(result, method=self.name, signed=result.signed and self.kind == "smoothgrad")


#: The classes :func:`tunnel_class` made, one per kind and method.
_TUNNELS: dict[tuple[str, type[Explainer]], type[NoiseTunnel]] = {}


def tunnel_class(kind: str, method: type[Explainer]) -> type[NoiseTunnel]:
    """The class that ``KIND:METHOD`` names: ``cls(model, **options)`` makes ``method`` with
    ``options`` (but ``n_samples`` and ``noise_level``, the tunnel's; ``seed`` goes to both)
    and wraps it in a :class:`NoiseTunnel` of ``kind``.

    >>> from explain.methods import IntegratedGradients
    >>> tunnel_class("smoothgrad_sq", IntegratedGradients).name
    'smoothgrad-sq:ig'
    """
    kind = checked_kind(kind)
    if (kind, method) not in _TUNNELS:
        _TUNNELS[kind, method] = _new_tunnel_class(kind, method)
    return _TUNNELS[kind, method]


def _new_tunnel_class(kind: str, method: type[Explainer]) -> type[NoiseTunnel]:
    own = keyword_parameters(NoiseTunnel)
    theirs = keyword_parameters(method)

    def __init__(self, model: nn.Module, **options) -> None:
        tunnel = {key: options.pop(key) for key in TUNNEL_OPTIONS if key in options}
        if "seed" in options:
            tunnel["seed"] = options["seed"] if "seed" in theirs else options.pop("seed")
        NoiseTunnel.__init__(self, method(model, **options), kind=kind, **tunnel)

    wanted = [own[name] for name in (*TUNNEL_OPTIONS, "seed")] + [p for name, p in theirs.items() if name not in own]
    __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # read by inspect.signature
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            *wanted,
        ]
    )
    words = {"smoothgrad": "SmoothGrad", "smoothgrad-sq": "SmoothGradSquared", "vargrad": "VarGrad"}
    return type(
        f"{words[kind]}Of{method.__name__}",
        (NoiseTunnel,),
        {
            "__init__": __init__,
            "__doc__": f"{words[kind]} of {method.__name__} (:class:`NoiseTunnel`).",
            "__module__": __name__,
            "name": f"{kind}:{method.name}",
            "cost": f"1 forward + n_samples (50) x ({method.cost})",
            "needs_layer": method.needs_layer,
            "backward": method.backward,
            "images_only": method.images_only,
            "channel_sum": getattr(method, "channel_sum", False),
        },
    )
