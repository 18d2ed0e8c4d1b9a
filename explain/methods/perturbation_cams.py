"""Perturbation CAMs: each channel is weighted by how the model's score answers a change
made with that channel, without gradients.

Score-CAM and its smoothed (SS-CAM) and integrated (IS-CAM) variants mask the input with
each channel's upsampled activation and run the whole model on the masked images;
Ablation-CAM zeroes each channel in turn and runs only the layers after the target
(:class:`~explain.methods.layer_replay.LayerReplay`). Both cost one forward pass per
channel, made as cheap as the method allows:

- batched, ``batch_size`` perturbed images (or activations) per pass, under
  ``torch.inference_mode()`` on the input's device; by default as many as fit in the memory
  budget, at the fastest size measured for the model (:func:`~explain.passes.inner_rows`),
  with a progress bar where the passes are many and Ctrl-C answered between two batches;
- exact shortcuts only: channels with identical activations share one masked pass, a
  constant channel (all zero in trained ReLU networks, often over half of the last layer)
  needs no pass in Score-CAM, and an all-zero channel none in Ablation-CAM, where zeroing it
  changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import register
from ..checks import check_finite_output, interpolation_mode, positive_int, spatial_axes
from ..hooks import preserved_state
from ..layers import LayerSpec
from ..passes import Passes, budget_rows, inner_rows, timed_chunks
from .cam_base import BaseCAM, Captured, principal_component, safe_divide
from .layer_replay import LayerReplay

__all__ = ["ISCAM", "SSCAM", "AblationCAM", "ScoreCAM"]


class PerturbationCAM(BaseCAM):
    """Base class: the map is sum_k w_k A^k with channel weights from perturbed passes."""

    uses_gradients = False
    backward = False
    family = "perturbation CAM"
    cost = "1 + C forward (C channels at the layer)"
    #: Masked passes per channel (SS-CAM and IS-CAM take it as an option).
    n_samples = 1

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        batch_size: int | None = None,
        **options,
    ):
        super().__init__(model, target_layer, **options)
        self.batch_size = None if batch_size is None else positive_int("batch_size", batch_size)

    def planned_passes(self, images: Tensor) -> int:
        """1 + C x samples per image, C the channels of the target layers (a pass of the
        first image finds them); channels with constant or repeated activations, which the
        method skips, are counted too."""
        captured = self.capture(images[:1])
        channels = sum(activations.shape[1] for activations in captured.activations.values())
        return len(images) * (1 + channels * self.n_samples)

    def check(self, images: Tensor, targets=None, *, topk: int | None = None) -> None:
        """The unperturbed pass alone: it meets every mistake in the model, layer or targets,
        at the cost of one forward pass instead of one per channel."""
        self.capture(images, targets, topk=topk)

    def channel_weights(self, captured: Captured, layer: str) -> Tensor:
        """(N, num_targets, C) weights of the channels of ``layer``."""
        raise NotImplementedError

    def layer_maps(self, captured: Captured, layer: str) -> Tensor:
        activations = captured.activations[layer]
        with preserved_state(self.model), torch.inference_mode():
            weights = self.channel_weights(captured, layer)
        maps = []
        for k in range(captured.num_targets):
            channel_weights = weights[:, k]  # (N, C)
            terms = channel_weights.reshape(*channel_weights.shape, *[1] * (activations.dim() - 2)) * activations
            maps.append(principal_component(terms) if self.eigen_smooth else terms.sum(dim=1))
        return torch.stack(maps, dim=1)


@register
class ScoreCAM(PerturbationCAM):
    """Score-CAM: channels weighted by the class probability of the image masked by them.

    H^k = s(Up(A^k)), the activation upsampled to the input size (bilinear; trilinear for
    volumes, linear for signals) and min-max
    scaled to [0, 1]; w_k = softmax(f(X * H^k))_c, the probability of the explained class
    for the masked image; L = ReLU(sum_k w_k A^k). A channel whose upsampled activation is
    constant carries no mask and gets w_k = 0, as in the authors' code. (The authors sum
    w_k Up(A^k) at input size; the sum here is at layer size and then upsampled, like every
    CAM of the library, so the ReLU comes before the upsampling.) For a callable target,
    its score replaces the probability.

    ``weighting="channel-softmax"`` gives pytorch-grad-cam's and torchcam's reading
    instead: w = softmax over channels of the masked images' target logits, constant
    channels scored with an all-zero mask.

    Wang et al., "Score-CAM: Score-Weighted Visual Explanations for Convolutional Neural
    Networks", CVPR Workshops 2020, eq. 6-8 and Algorithm 1;
    https://github.com/haofanwang/Score-CAM.
    """

    name = "scorecam"
    formula = "sum_k p_c(X ⊙ s(Up(A^k))) A^k"
    weightings = ("probability", "channel-softmax")

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        batch_size: int | None = None,
        weighting: str = "probability",
        **options,
    ):
        super().__init__(model, target_layer, batch_size=batch_size, **options)
        if weighting not in self.weightings:
            raise ValueError(f"weighting must be one of {', '.join(self.weightings)}; got {weighting!r}")
        self.weighting = weighting

    def sample_masks(self, masks: Tensor, channels: Tensor) -> Iterator[Tensor]:
        """The masks whose scores are averaged into a channel's score; ``masks`` (B, 1, H, W)
        are the scaled activations of ``channels`` (B,)."""
        yield masks

    def channel_weights(self, captured: Captured, layer: str) -> Tensor:
        activations = captured.activations[layer]
        images = captured.images
        n, channels = activations.shape[:2]
        softmax_over_channels = self.weighting == "channel-softmax"
        flat = activations.flatten(2)
        # One masked pass per distinct channel of each image (all constant channels share
        # the all-zero mask, which only the channel-softmax reading scores).
        row_owners: list[int] = []
        distinct_rows: list[Tensor] = []
        first_channels: list[Tensor] = []
        slots = torch.empty(n, channels, dtype=torch.long, device=flat.device)
        every_channel = torch.arange(channels, device=flat.device)
        for i in range(n):
            distinct, inverse = torch.unique(flat[i], dim=0, return_inverse=True)
            slots[i] = inverse + len(distinct_rows)
            distinct_rows.extend(distinct)
            row_owners.extend([i] * len(distinct))
            first = torch.full((len(distinct),), channels, device=flat.device)
            first_channels.append(first.scatter_reduce(0, inverse, every_channel, "amin"))
        rows = torch.stack(distinct_rows)
        owners = torch.tensor(row_owners, device=flat.device)
        firsts = torch.cat(first_channels)  # each distinct row's first channel
        constant_rows = rows.amax(dim=1) == rows.amin(dim=1)
        wanted = torch.arange(len(rows), device=flat.device)
        if not softmax_over_channels:
            wanted = wanted[~constant_rows]
        scores = torch.zeros(len(rows), captured.num_targets, device=flat.device)
        samples = self.n_samples
        step = inner_rows(self.model, images, backward=False, total=len(wanted) * samples, given=self.batch_size)
        with Passes(self.name, len(wanted) * samples) as passes:
            masks = rows.reshape(len(rows), 1, *activations.shape[2:])
            self._score_masks(captured, masks, owners, firsts, wanted, scores, step, passes)
        weights = scores[slots]  # (N, C, num_targets); constant channels unscored: 0
        if softmax_over_channels:
            weights = weights.softmax(dim=1)
        return weights.transpose(1, 2)

    def _score_masks(
        self,
        captured: Captured,
        activations: Tensor,
        owners: Tensor,
        firsts: Tensor,
        wanted: Tensor,
        scores: Tensor,
        step: int,
        passes: Passes,
    ) -> None:
        """Fill ``scores`` of the ``wanted`` distinct ``activations`` (R, 1, h, w) (or
        (R, 1, d, h, w), (R, 1, l)) as masks,
        ``step`` masked images per pass."""
        images, size, probability = captured.images, captured.input_size, self.weighting != "channel-softmax"
        buffer = images.new_empty((min(step, len(wanted)), *images.shape[1:]))  # reused
        for chunk in wanted.split(step):
            low = activations[chunk]
            up = F.interpolate(low, size=size, mode=interpolation_mode(len(size)), align_corners=False)
            space = spatial_axes(up)
            low_end = up.amin(dim=space, keepdim=True)
            span = up.amax(dim=space, keepdim=True) - low_end
            masks = safe_divide(up - low_end, span)
            sources = images[owners[chunk]]
            total: Tensor | float = 0.0
            count = 0
            for sample in self.sample_masks(masks, firsts[chunk]):
                masked = torch.mul(sources, sample.to(images.dtype), out=buffer[: len(chunk)])
                output = self.model(masked)
                total = total + captured.scores(output, owners[chunk], probability=probability)
                count += 1
                passes.advance(len(chunk))
            scores[chunk] = total / count


@register
class SSCAM(ScoreCAM):
    """SS-CAM: Score-CAM with each channel's score averaged over noisy masks.

    w_k = 1/N sum_i softmax(f(X * (H^k + delta_i)))_c, delta_i ~ N(0, noise^2) drawn per
    pixel; L = ReLU(sum_k w_k A^k). ``n_samples`` = 35 and ``noise`` = 2.0 follow torchcam
    (the paper's noise-on-the-mask variant). The noise of each channel and sample is drawn
    from a generator seeded with (``seed``, sample, channel), so an image's map depends
    neither on ``batch_size`` nor on the images beside it, and repeats. Channels with equal
    activations share one mask and its noise. Constant channels and the ``weighting``
    option are as in :class:`ScoreCAM`.

    Wang, Naidu et al., "SS-CAM: Smoothed Score-CAM for Sharper Visual Feature
    Localization", arXiv:2006.14255 (2020).
    """

    name = "sscam"
    formula = "Score-CAM, scores averaged over {n_samples:code} noisy masks"
    cost = "1 + C x {n_samples} forward"

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        n_samples: int = 35,
        noise: float = 2.0,
        seed: int = 0,
        batch_size: int | None = None,
        weighting: str = "probability",
        **options,
    ):
        super().__init__(model, target_layer, batch_size=batch_size, weighting=weighting, **options)
        self.n_samples, self.noise, self.seed = positive_int("n_samples", n_samples), float(noise), int(seed)

    def sample_masks(self, masks: Tensor, channels: Tensor) -> Iterator[Tensor]:
        for sample in range(self.n_samples):
            noise = torch.empty_like(masks)
            for row, channel in enumerate(channels.tolist()):
                key = hash((self.seed, sample, channel)) & 0x7FFF_FFFF_FFFF_FFFF  # ints hash the same in every run
                generator = torch.Generator(masks.device).manual_seed(key)
                noise[row].normal_(0.0, self.noise, generator=generator)
            yield masks + noise


@register
class ISCAM(ScoreCAM):
    """IS-CAM: Score-CAM with each channel's score integrated along a path of growing masks.

    M_i = sum_{j <= i} (j/N) H^k, w_k = 1/N sum_{i=1..N} softmax(f(X * M_i))_c;
    L = ReLU(sum_k w_k A^k), with ``n_samples`` N = 10 as in torchcam. Constant channels and
    the ``weighting`` option are as in :class:`ScoreCAM`.

    Naidu et al., "IS-CAM: Integrated Score-CAM for axiomatic-based explanations",
    arXiv:2010.03023 (2020).
    """

    name = "iscam"
    formula = "Score-CAM, scores integrated over {n_samples:code} growing masks"
    cost = "1 + C x {n_samples} forward"

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        n_samples: int = 10,
        batch_size: int | None = None,
        weighting: str = "probability",
        **options,
    ):
        super().__init__(model, target_layer, batch_size=batch_size, weighting=weighting, **options)
        self.n_samples = positive_int("n_samples", n_samples)

    def sample_masks(self, masks: Tensor, channels: Tensor) -> Iterator[Tensor]:
        coefficient = 0.0
        for i in range(1, self.n_samples + 1):
            coefficient += i / self.n_samples
            yield masks * coefficient


@register
class AblationCAM(PerturbationCAM):
    """Ablation-CAM: channels weighted by the relative drop of the score when zeroed.

    w_k = (y_c - y_c^k) / y_c, y_c^k the score with channel k of the layer set to zero
    (w_k = 0 where y_c = 0); L = ReLU(sum_k w_k A^k). Only the layers after the target run
    for each ablation, where the model can be split there (see
    :class:`~explain.methods.layer_replay.LayerReplay`); otherwise the whole model runs with
    the layer's output replaced. An all-zero channel gets w_k = 0 with no pass, since
    zeroing it changes nothing. (pytorch-grad-cam sets an ablated channel to min(A) - 1e7
    where the layer has negative values; the paper zeroes it, as here.)

    Desai & Ramaswamy, "Ablation-CAM: Visual Explanations for Deep Convolutional Network
    via Gradient-free Localization", WACV 2020, eq. 3-4.
    """

    name = "ablationcam"
    formula = "sum_k ((y_c - y_c with A^k zeroed) / y_c) A^k"
    cost = "1 forward + C forward of the layers after the target (C channels there)"

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        batch_size: int | None = None,
        **options,
    ):
        super().__init__(model, target_layer, batch_size=batch_size, **options)
        self._replays: dict[str, LayerReplay] = {}

    def replay(self, layer: str) -> LayerReplay:
        """The (cached) replay of the layers after ``layer``."""
        if layer not in self._replays:
            self._replays[layer] = LayerReplay(self.model, layer)
        return self._replays[layer]

    def channel_weights(self, captured: Captured, layer: str) -> Tensor:
        activations = captured.activations[layer]
        n, channels = activations.shape[:2]
        replay = self.replay(layer)
        everyone = torch.arange(n, device=activations.device)
        layer_output = captured.in_layer_layout(layer, activations, everyone)
        check_finite_output(captured.output, "Ablation-CAM")  # the replay's check compares outputs
        replay.prepare(captured.images, layer_output, captured.output)
        original = captured.scores(replay(layer_output, everyone), everyone)  # (N, num_targets)
        ablated = original[:, None, :].repeat(1, channels, 1)  # (N, C, num_targets)
        image_ids, channel_ids = (activations.flatten(2) != 0).any(dim=2).nonzero(as_tuple=True)
        with Passes(self.name, len(image_ids)) as passes:
            for chunk in self._chunks(captured, layer, len(image_ids)):
                rows, ablate = image_ids[chunk], channel_ids[chunk]
                changed = activations[rows]
                changed[torch.arange(len(chunk), device=changed.device), ablate] = 0
                ablated[rows, ablate] = captured.scores(
                    replay(captured.in_layer_layout(layer, changed, rows), rows), rows
                )
                passes.advance(len(chunk))
        return safe_divide(original[:, None, :] - ablated, original[:, None, :]).transpose(1, 2)

    def _chunks(self, captured: Captured, layer: str, total: int) -> Iterator[Tensor]:
        """The ablations' rows a batch at a time: ``batch_size``, or as many as fit in the
        memory budget (as whole-model passes: replays hold less) at the fastest size for the
        layers after the target, measured on the replays themselves."""
        images = captured.images
        if self.batch_size is not None:
            sizes: Iterator[int] = iter([self.batch_size] * -(-total // self.batch_size))
        else:
            most = budget_rows(self.model, images, backward=False, total=total)
            key = (tuple(captured.activations[layer].shape[1:]), images.dtype, str(images.device))
            sizes = timed_chunks(self.replay(layer), key, total, most)
        start = 0
        for size in sizes:
            yield torch.arange(start, min(start + size, total), device=images.device)
            start += size
