"""Perturbation attributions: what happens to the score when parts of the image are
replaced by a baseline, computed by captum.

Occlusion slides a square window over the image (a box over a volume, a segment along a
signal); LIME, KernelSHAP, Shapley value sampling and Feature Ablation switch SLIC
superpixels (scikit-image) of images on and off, and do not apply to volumes and signals.
Each of the five also scores segments the caller gives instead (``segments=``: masks, which
may overlap, or a label image; :mod:`~explain.methods.segment_attribution`). All run their
perturbed copies in internal batches of at most ``internal_batch_size`` rows, and their random
draws on a stream seeded with ``seed`` (the caller's random stream is left as it was).
"""

from __future__ import annotations

import math

import captum.attr as captum_attr
import torch
from torch import Tensor, nn

from ..base import register
from ..baselines import seeded
from ..checks import checked_number, positive_int
from ..passes import advance
from ..superpixels import superpixels
from ..targets import class_logits
from .attribution_base import Batched, ScoredModel, rows_per_pass, slice_target
from .captum_adapter import lasso
from .drise import mask_grids, upsampled_masks
from .segment_attribution import Coalitions, SegmentAttribution, seeded_scores

__all__ = [
    "RISE",
    "FeatureAblation",
    "KernelShap",
    "Lime",
    "Occlusion",
    "ShapleyValueSampling",
    "occlusion_positions",
    "occlusion_window",
]


#: The image size at which ``cost`` counts the passes that depend on it.
COST_SIZE = (224, 224)


def occlusion_window(
    sides: tuple[int, ...], window: int | None, stride: int | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Occlusion's window and stride on inputs of spatial size ``sides``, one size per axis:
    ``window`` and ``stride`` where given, else a seventh of the shorter side of an image (a
    third of each side of a volume, a sixteenth of a signal) and half the window.

    >>> occlusion_window((224, 224), None, None)
    ((32, 32), (16, 16))
    """
    if window is not None:
        windows = (window,) * len(sides)
    elif len(sides) == 2:  # a square on images
        windows = (max(1, min(sides) // 7),) * 2
    else:  # about as many positions as on images: 5 per axis of a volume, 31 along a signal
        windows = tuple(max(1, side // (3 if len(sides) == 3 else 16)) for side in sides)
    strides = tuple(stride or max(1, size // 2) for size in windows)
    if any(size > side for size, side in zip(windows, sides, strict=True)):
        shown = str(windows[0]) if len(set(windows)) == 1 else " x ".join(map(str, windows))
        raise ValueError(
            f"the occlusion window ({shown}) is larger than the {'images' if len(sides) == 2 else 'inputs'} "
            f"({' x '.join(map(str, sides))}); pass a smaller window"
        )
    return windows, strides


def occlusion_positions(sides: tuple[int, ...], window: int | None, stride: int | None) -> int:
    """The positions of Occlusion's window on inputs of spatial size ``sides``.

    >>> occlusion_positions((224, 224), None, None)
    169
    """
    windows, strides = occlusion_window(sides, window, stride)
    return math.prod((side - size) // step + 1 for side, size, step in zip(sides, windows, strides, strict=True))


@register
class Occlusion(SegmentAttribution):
    """Occlusion: the drop in the score when a sliding square is replaced by the baseline.

    The square is ``window`` x ``window``, slid with ``stride``; each pixel gets the mean
    drop over the windows that cover it. On volumes and videos the window is a box,
    on signals a segment, of ``window`` along every axis. With ``segments=`` the segments
    are occluded in turn instead of the window (each gets the drop when it alone is
    replaced: Feature Ablation of the segments).

    Zeiler and Fergus, "Visualizing and Understanding Convolutional Networks", ECCV 2014,
    sec. 4.2. Runs captum's Occlusion. The window defaults to a seventh of the shorter
    side (32 pixels at 224; on volumes a third of each side, on signals a sixteenth of the
    length), the stride to half the window; the baseline to zeros in the model's input space (the mean colour, for
    normalised inputs).
    """

    name = "occlusion"
    formula = "score drop under a sliding {window_size} x {window_size} window (stride {stride_size}) at 224 x 224"
    runs_on = "captum `Occlusion`"
    family = "perturbation attribution"
    backward = False
    cost = "2 + {positions} forward at 224 x 224 (window {window_size}, stride {stride_size})"

    def __init__(self, model: nn.Module, *, window: int | None = None, stride: int | None = None, **options):
        super().__init__(model, **options)
        self.window = None if window is None else positive_int("window", window)
        self.stride = None if stride is None else positive_int("stride", stride)

    def window_and_stride(self, images: Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The window and stride on ``images``, one size per spatial axis, the defaults scaled
        to their size."""
        return occlusion_window(tuple(images.shape[2:]), self.window, self.stride)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (2 + occlusion_positions(tuple(images.shape[2:]), self.window, self.stride))

    @classmethod
    def cost_fields(cls) -> dict[str, object]:
        window, stride = occlusion_window(COST_SIZE, None, None)
        positions = occlusion_positions(COST_SIZE, None, None)
        return {"positions": positions, "window_size": window[0], "stride_size": stride[0]}

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        channels = images.shape[1]
        window, stride = self.window_and_stride(images)
        rows = self.rows(images, self.planned_passes(images))
        return captum_attr.Occlusion(scored).attribute(
            images,
            sliding_window_shapes=(channels, *window),
            strides=(channels, *stride),
            baselines=self.baselines(scored, images),
            target=scored.target(k),
            perturbations_per_eval=rows_per_pass(rows, len(images)),
        )

    def segment_passes(self, segments: int) -> int:
        return 2 + segments

    def score_segments(self, coalitions: Coalitions, segments: int, rows: int) -> Tensor:
        return seeded_scores(captum_attr.FeatureAblation, coalitions, segments, rows, None)


class _Superpixels(SegmentAttribution):
    """A perturbation method over SLIC superpixels of each image (or over ``segments=``)."""

    family = "perturbation attribution"
    backward = False
    images_only = "its features are SLIC superpixels of an image; use occlusion, whose window has the inputs' rank"

    def __init__(self, model: nn.Module, *, n_segments: int = 50, compactness: float = 10.0, **options):
        super().__init__(model, **options)
        self.n_segments = positive_int("n_segments", n_segments)
        self.compactness = float(compactness)

    def superpixel_masks(self, scored: ScoredModel, images: Tensor) -> Tensor:
        """The superpixels of ``images``, made once per call."""
        if "superpixels" not in scored.memo:
            scored.memo["superpixels"] = superpixels(images, self.n_segments, self.compactness)
        return scored.memo["superpixels"]


class _Sampled(_Superpixels):
    """LIME and KernelSHAP: a linear model fitted to ``n_samples`` random coalitions."""

    def __init__(self, model: nn.Module, *, n_samples: int = 256, **options):
        super().__init__(model, **options)
        self.n_samples = positive_int("n_samples", n_samples)

    def method(self, forward):
        """captum's method on ``forward`` (the scored model, or a segment game)."""
        raise NotImplementedError

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_samples)

    def segment_passes(self, segments: int) -> int:
        return 3 if segments == 1 else 1 + self.n_samples

    def score_segments(self, coalitions: Coalitions, segments: int, rows: int) -> Tensor:
        if segments == 1:  # its value is S(x) - S(baseline); captum's fit needs two features
            pair = coalitions(torch.tensor([[1.0], [0.0]], device=coalitions.image.device))
            return (pair[0] - pair[1]).view(1)
        scores = seeded_scores(self.method, coalitions, segments, rows, self.seed, n_samples=self.n_samples).flatten()
        scored, k, i = coalitions.scored, coalitions.k, coalitions.i
        # rounding noise of the fit, as below
        tolerance = 1e-6 * float(scored.explained_scores(scored.output, k)[i].abs().float().clamp_min(1e-12))
        return torch.where(scores.abs() < tolerance, 0.0, scores)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        masks, baselines = self.superpixel_masks(scored, images), self.baselines(scored, images)
        target = scored.target(k)
        rows_per_eval = self.rows(images, self.n_samples)
        method = self.method(scored)
        per_image = []
        # One image at a time (as captum would), each on its own seeded stream.
        for i in range(len(images)):
            rows = slice(i, i + 1)
            if masks[i].max() == 0:  # one superpixel: its value is S(x) - S(baseline); captum's fit needs two
                advance(2)
                with torch.no_grad():
                    pair = scored.model(torch.cat([images[rows], baselines[rows]]))
                delta = scored.explained_scores(pair, k, torch.tensor([i, i], device=images.device))
                per_image.append((delta[0] - delta[1]).to(images.dtype).expand_as(images[rows]))
                continue
            with seeded(self.seed, images.device):
                per_image.append(
                    method.attribute(
                        images[rows],
                        baselines=baselines[rows],
                        target=slice_target(target, rows),
                        feature_mask=masks[rows],
                        n_samples=self.n_samples,
                        perturbations_per_eval=rows_per_eval,
                    )
                )
        attributions = torch.cat(per_image)
        # A least-squares fit leaves rounding noise where the scores do not change at all;
        # weights a million times smaller than the score are that noise, not evidence.
        scores = scored.explained_scores(scored.output, k).abs().float()
        tolerance = 1e-6 * scores.clamp_min(1e-12).view(-1, 1, 1, 1)
        return torch.where(attributions.abs() < tolerance, 0.0, attributions)


@register
class Lime(_Sampled):
    """LIME: a sparse linear model of the score over superpixels switched on and off.

    Fitted to ``n_samples`` random coalitions, weighted by their similarity to the image.

    Ribeiro et al., "Why Should I Trust You?: Explaining the Predictions of Any
    Classifier", KDD 2016, sec. 3.3-3.4. Runs captum's Lime with its defaults (a Lasso fit,
    alpha ``lasso_alpha`` = 0.01 on the score's scale, an exponential cosine-similarity
    kernel) over :func:`~explain.superpixels.superpixels`; switched-off superpixels take the baseline. Each pixel
    gets its superpixel's weight; where every effect is under alpha, the Lasso keeps none
    and the map is zeros (lower ``lasso_alpha`` for scores on a small scale).
    """

    name = "lime"
    formula = "Lasso over SLIC superpixels switched on/off ({n_samples:code})"
    runs_on = "captum `Lime` + scikit-image"
    cost = "1 + {n_samples} forward"

    def __init__(self, model: nn.Module, *, lasso_alpha: float = 0.01, **options):
        super().__init__(model, **options)
        self.lasso_alpha = checked_number("lasso_alpha", lasso_alpha, positive=False)

    def method(self, forward):
        return captum_attr.Lime(forward, interpretable_model=lasso(self.lasso_alpha))


@register
class KernelShap(_Sampled):
    """KernelSHAP: Shapley values of superpixels, from a kernel-weighted linear model.

    The linear model is fitted with the Shapley kernel to ``n_samples`` random coalitions.

    Lundberg and Lee, "A Unified Approach to Interpreting Model Predictions", NeurIPS 2017,
    theorem 2. Runs captum's KernelShap over :func:`~explain.superpixels.superpixels`; absent superpixels take
    the baseline. Each pixel gets its superpixel's value.
    """

    name = "kernelshap"
    formula = "Shapley values of SLIC superpixels"
    runs_on = "captum `KernelShap` + scikit-image"
    cost = "1 + {n_samples} forward"

    def method(self, forward):
        return captum_attr.KernelShap(forward)


@register
class FeatureAblation(_Superpixels):
    """Feature Ablation: the drop in the score when one superpixel is replaced by the baseline.

    The leave-one-out attribution (Zeiler and Fergus 2014, with segments for squares), run
    by captum's FeatureAblation over :func:`~explain.superpixels.superpixels`.
    """

    name = "ablation"
    formula = "score drop per superpixel"
    runs_on = "captum `FeatureAblation` + scikit-image"
    cost = "2 + {n_segments:~} forward"

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (2 + self.n_segments)

    def segment_passes(self, segments: int) -> int:
        return 2 + segments

    def score_segments(self, coalitions: Coalitions, segments: int, rows: int) -> Tensor:
        return seeded_scores(captum_attr.FeatureAblation, coalitions, segments, rows, None)

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        rows = self.rows(images, self.planned_passes(images))
        return captum_attr.FeatureAblation(scored).attribute(
            images,
            baselines=self.baselines(scored, images),
            target=scored.target(k),
            feature_mask=self.superpixel_masks(scored, images),
            perturbations_per_eval=rows_per_pass(rows, len(images)),
        )


@register
class ShapleyValueSampling(_Superpixels):
    """Shapley value sampling: each superpixel's average gain in the score when it joins the
    superpixels before it, over random orders.

    For each of ``n_samples`` random permutations of the superpixels, they are switched on one
    after the other, from the baseline to the image, and each gets the score's change as it
    joins; its value is the mean of those changes, an unbiased estimate of its Shapley value.
    Each permutation's changes add up to S(x) - S(baseline), so the values do too (efficiency).

    Castro, Gomez and Tejada, "Polynomial calculation of the Shapley value based on sampling",
    Computers & Operations Research 2009, sec. 3; Strumbelj and Kononenko, "An Efficient
    Explanation of Individual Classifications using Game Theory", JMLR 2010, sec. 3. Runs
    captum's ShapleyValueSampling over :func:`~explain.superpixels.superpixels`, one image at a
    time on its own seeded stream (the permutations come from ``seed``), switched-off
    superpixels taking the baseline; each pixel gets its superpixel's value. The switched-on
    copies of a permutation run forward only, in inner batches from the memory budget.
    """

    name = "shapley-sampling"
    formula = (
        "Shapley values of SLIC superpixels: each one's mean gain as it joins the others in "
        "{n_samples:code} random orders; they add up to S(x) - S(x')"
    )
    runs_on = "captum `ShapleyValueSampling` + scikit-image"
    cost = "2 + {n_samples} x {n_segments:~} forward"

    def __init__(self, model: nn.Module, *, n_samples: int = 25, **options):
        super().__init__(model, **options)
        self.n_samples = positive_int("n_samples", n_samples)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (2 + self.n_samples * self.n_segments)

    def segment_passes(self, segments: int) -> int:
        return 2 + self.n_samples * segments

    def score_segments(self, coalitions: Coalitions, segments: int, rows: int) -> Tensor:
        return seeded_scores(
            captum_attr.ShapleyValueSampling, coalitions, segments, rows, self.seed, n_samples=self.n_samples
        )

    def attribute(self, scored: ScoredModel, images: Tensor, k: int) -> Tensor:
        masks, baselines = self.superpixel_masks(scored, images), self.baselines(scored, images)
        target = scored.target(k)
        rows = self.rows(images, self.planned_passes(images))
        method = captum_attr.ShapleyValueSampling(scored)
        per_image = []
        for i in range(len(images)):  # each image on its own seeded stream, as LIME and KernelSHAP
            with seeded(self.seed, images.device):
                per_image.append(
                    method.attribute(
                        images[i : i + 1],
                        baselines=baselines[i : i + 1],
                        target=slice_target(target, slice(i, i + 1)),
                        feature_mask=masks[i : i + 1],
                        n_samples=self.n_samples,
                        perturbations_per_eval=rows,
                    )
                )
        return torch.cat(per_image)


@register
class RISE(Batched):
    """RISE: the average of random masks, each weighted by the target's probability on
    the image under that mask.

    S = 1 / (N p) * sum_i P(class | x * M_i) M_i over ``n_masks`` masks M_i: binary grids
    whose cells are kept with probability ``p``, upsampled bilinearly to cells of
    ``cell_size`` pixels and cut at a random shift of up to one cell. P is the softmax of the
    logits (a callable target's score as it is); masked pixels are 0 in the model's input.

    Petsiuk, Das and Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box
    Models", BMVC 2018, sec. 3 (eq. 6 and the masks of sec. 3.2). The masks are D-RISE's
    (``explain.methods.drise.rise_masks``), drawn from ``seed``: every image gets the
    same masks, so its map does not depend on its batch. The defaults are the paper's for
    ResNet-50: 4000 masks, p = 0.5, a 7 x 7 grid (``cell_size=None``: a seventh of the longer
    side). The masked copies run forward only, in inner batches from the memory budget, every
    target of a call from the same passes. ``raw`` is the saliency, (N, 1, H, W).
    """

    name = "rise"
    formula = (
        "masks weighted by the class probability of the masked image: Σ P(c|x⊙M) M / (N p) "
        "({n_masks:code}, 7 x 7 cells, {p:code}); `raw` (N, 1, H, W)"
    )
    runs_on = "explain, D-RISE's masks"
    family = "perturbation attribution"
    cost = "1 + {n_masks} forward"
    backward = False
    images_only = "its masks are 2-D grids over an image; use occlusion, whose window has the inputs' rank"

    def __init__(
        self, model: nn.Module, *, n_masks: int = 4000, cell_size: int | None = None, p: float = 0.5, **options
    ):
        super().__init__(model, **options)
        self.n_masks = positive_int("n_masks", n_masks)
        self.cell_size = None if cell_size is None else positive_int("cell_size", cell_size)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"p, the share of cells a mask keeps, must lie in (0, 1]; got {p!r}")
        self.p = float(p)

    def planned_passes(self, images: Tensor) -> int:
        return len(images) * (1 + self.n_masks)

    def attribute_targets(self, scored: ScoredModel, images: Tensor) -> list[Tensor]:
        size = (images.shape[-2], images.shape[-1])
        cell = self.cell_size or math.ceil(max(size) / 7)
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**31 - 1, ()))  # the caller's stream
        grids, shifts = mask_grids(self.n_masks, size, cell_size=cell, p=self.p, seed=seed)
        grids = grids.to(images.device)
        total, targets = len(images) * self.n_masks, scored.num_targets
        step = self.rows(images, total)
        saliency = images.new_zeros((targets, len(images), *size), dtype=torch.float32)
        with torch.no_grad():
            for start in range(0, total, step):
                pairs = torch.arange(start, min(start + step, total))
                rows, which = (pairs // self.n_masks).to(images.device), pairs % self.n_masks
                masks = upsampled_masks(grids[which.to(grids.device)], shifts[which], size, cell)
                advance(len(pairs))
                output = scored.model(images[rows] * masks[:, None].to(images.dtype))
                for k in range(targets):
                    weights = self.probabilities(scored, output, k, rows)
                    saliency[k].index_add_(0, rows, weights.float()[:, None, None] * masks.float())
        return [(map_ / (self.n_masks * self.p))[:, None].to(images.dtype) for map_ in saliency]

    def probabilities(self, scored: ScoredModel, output, k: int, rows: Tensor) -> Tensor:
        """P(target k | masked image) of each row: the softmax of the logits at the target's
        class, or a callable target's score."""
        if scored.custom is not None:
            return scored.explained_scores(output, k, rows)
        ids = scored.ids_of(k)[rows]
        return class_logits(output).float().softmax(dim=1).gather(1, ids[:, None]).squeeze(1)
