"""CAMs made of another CAM's maps: RefineCAM multiplies a base CAM's maps at several
layers; SESS fuses a base CAM's maps of scaled, sliding patches of the image. The base is
any registered CAM, by name, with its options; its capture (one forward pass, and one
backward pass per target where it uses gradients) is the only model work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import check_training_options, register, registered_class
from ..checks import check_images
from ..explanation import Explanation, scale_maps
from ..layers import LayerSpec
from ..targets import Targets, class_logits, custom_target, select_targets
from .cam_base import BaseCAM, Captured

__all__ = ["SESS", "RefineCAM"]


@register
class RefineCAM(BaseCAM):
    """RefineCAM: a base CAM's maps at several layers, multiplied.

    L = s(prod_l s(L_l)), L_l the base CAM's map at layer l (after its ReLU), s resizing to
    the input (bilinear) and min-max scaling to [0, 1]. An early layer's map is sharp but
    noisy, a late layer's coarse but on the object: their product keeps what all layers agree
    on. The base is a registered CAM (``base``, default Grad-CAM++ as in the paper and both
    peers), made with the other options; pass the layers from early to late
    (``target_layer=["layer2", "layer3", "layer4"]``). With one layer the map is the base's.
    pytorch-grad-cam 1.5.7 scales at the input size, as here; torchcam 0.5.0 at the largest
    layer's size (correlation above 0.99 either way).

    "How to Evaluate and Refine your CAM", ICPR 2026, arXiv:2605.14641 (RefineCAM);
    pytorch-grad-cam's and torchcam's ``RefineCAM``.
    """

    name = "refinecam"
    formula = "prod over layers of the base CAM's scaled maps ({base:code})"
    family = "gradient CAM"
    cost = "as its base CAM: 1 forward + 1 backward to the earliest layer"
    shares_capture = False

    def __init__(self, model: nn.Module, target_layer: LayerSpec = None, *, base: str = "gradcam++", **options):
        check_training_options(type(self), options)
        cls = registered_class(base)
        if not issubclass(cls, BaseCAM) or cls is RefineCAM or not cls.shares_capture:
            raise ValueError(
                f"RefineCAM multiplies the maps of a CAM made from one capture at every layer; {base!r} is not "
                "such a CAM: pass base='gradcam++', 'gradcam', 'layercam', 'eigencam', 'scorecam', ..."
            )
        self.base_cam = cls(model, target_layer, **options)
        super().__init__(
            model,
            target_layer,
            class_names=self.base_cam.class_names,
            aug_smooth=self.base_cam.aug_smooth,
            reshape=self.base_cam.reshape,
        )
        self.base = base

    def target_layers(self, images: Tensor) -> dict[str, nn.Module]:
        return self.base_cam.target_layers(images)

    def planned_passes(self, images: Tensor) -> int:
        return self.base_cam.planned_passes(images)

    def pass_cost(self, images: Tensor) -> float:
        return self.base_cam.pass_cost(images)

    def capture(
        self, images: Tensor, targets: Targets = None, *, topk: int | None = None, gradients: bool | None = None
    ) -> Captured:
        """The base CAM's capture at every layer."""
        return self.base_cam.capture(images, targets, topk=topk, gradients=gradients)

    def explain(self, captured: Captured) -> Explanation:
        # The base's raw maps, not its Explanation: its maps (each layer scaled, averaged and
        # scaled again at the input size) would be thrown away.
        raw_layers = self.base_cam.raw_layer_maps(captured)
        size = captured.input_size
        scaled = [scale_maps(raw, size) for raw in raw_layers.values()]
        product = scaled[0]
        for factor in scaled[1:]:
            product = product * factor
        return Explanation(
            scale_maps(product, size), raw_layers, captured.logits, captured.targets, self.name, self.class_names
        )


def window_starts(length: int, window: int, step: int) -> list[int]:
    """The starts of the windows along a side of ``length``: every ``step``, the last one
    shifted back inside (so every window has the full size), as pytorch-grad-cam 1.5.7's.

    >>> window_starts(10, 4, 4)
    [0, 4, 6]
    """
    starts = []
    for start in range(0, length, step):
        if start + window >= length:
            starts.append(max(length - window, 0))
            break
        starts.append(start)
    return starts


def scaled_size(size: tuple[int, ...], scale: int) -> tuple[int, int]:
    """(H, W) with the shorter side resized to ``scale`` (torchvision's ``resize(x, scale)``)."""
    height, width = size
    if height <= width:
        return scale, int(scale * width / height)
    return int(scale * height / width), scale


def gaussian_blur(maps: Tensor, size: int = 11, sigma: float = 5.0) -> Tensor:
    """(N, H, W) maps blurred by a ``size`` x ``size`` Gaussian, borders reflected without
    repeating the edge (OpenCV's ``GaussianBlur`` default)."""
    offsets = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    kernel = (kernel / kernel.sum()).to(maps)
    pad = size // 2
    out = F.pad(maps[:, None], (pad, pad, pad, pad), mode="reflect")
    out = F.conv2d(out, kernel.view(1, 1, 1, size))
    return F.conv2d(out, kernel.view(1, 1, size, 1))[:, 0]


@register
class SESS(BaseCAM):
    """SESS, Saliency Enhancing with Scaling and Sliding: a base CAM over scaled, sliding
    patches of the image, fused.

    The image is resized to ``num_scales`` scales (its shorter side to ``w + i * round(w *
    scale_step_ratio)``, w the window, default the shorter side: 224, 288, ... on 224 x 224)
    and cut at each scale into w x w patches every ``step_size`` (default w; the last patch
    of a row or column shifted back inside). Each patch is scored by the target's softmax
    probability s_p (``use_softmax_scores``; else its logit), clipped at 0; the lowest
    ``pre_filter_ratio`` of the patches are dropped (pre-filtering). The base CAM's map of
    each kept patch (scaled to [0, 1]), weighted by s_p / max_p s_p (calibration), is pasted
    where the patch was taken and resized to the image; the fused map is, at each pixel, the
    mean of the pasted maps above ``theta`` (``pool="mean"``) or their maximum
    (``pool="max"``), blurred by an 11 x 11 Gaussian (sigma 5, ``smooth``) and scaled to [0, 1].
    With one scale and a window covering the image, the map is the base CAM's, blurred.
    ``base`` is a registered CAM (default Grad-CAM), made with the other options.

    Tyagi et al., "SESS: Saliency Enhancing with Scaling and Sliding", ECCV 2022,
    arXiv:2207.01769; pytorch-grad-cam 1.5.7's ``SESS`` (the defaults here are its).
    """

    name = "sess"
    formula = "mean over patches p of (s_p / max s) CAM(p), pasted back ({base:code})"
    family = "gradient CAM"
    cost = "per scale ({num_scales}) and patch: 1 forward + the passes of the base CAM"
    images_only = "it slides square windows over an image's height and width"
    shares_capture = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        base: str = "gradcam",
        num_scales: int = 12,
        scale_step_ratio: float = 2.0 / 7.0,
        scales: tuple[int, ...] | None = None,
        window_size: int | None = None,
        step_size: int | None = None,
        pre_filter_ratio: float = 0.0,
        theta: float = 0.0,
        pool: str = "mean",
        smooth: bool = True,
        use_softmax_scores: bool = True,
        batch_size: int = 32,
        **options,
    ):
        check_training_options(type(self), options)
        cls = registered_class(base)
        if not issubclass(cls, BaseCAM) or cls is SESS:
            raise ValueError(f"SESS fuses the maps of a CAM; {base!r} is none: pass base='gradcam', 'gradcam++', ...")
        if pool not in ("mean", "max"):
            raise ValueError(f"pool must be 'mean' (the paper's weighted average) or 'max', got {pool!r}")
        if not 0.0 <= pre_filter_ratio < 1.0:
            raise ValueError(f"pre_filter_ratio is the share of patches dropped, in [0, 1); got {pre_filter_ratio}")
        if num_scales < 1 or batch_size < 1:
            raise ValueError(f"num_scales and batch_size must be at least 1, got {num_scales} and {batch_size}")
        self.base_cam = cls(model, target_layer, **options)
        super().__init__(model, target_layer, class_names=self.base_cam.class_names, reshape=self.base_cam.reshape)
        self.base, self.num_scales, self.scale_step_ratio = base, num_scales, scale_step_ratio
        self.scales = None if scales is None else tuple(int(s) for s in scales)
        self.window_size, self.step_size, self.batch_size = window_size, step_size, batch_size
        self.pre_filter_ratio, self.theta, self.pool = pre_filter_ratio, theta, pool
        self.smooth, self.use_softmax_scores = bool(smooth), bool(use_softmax_scores)

    def windows(self, size: tuple[int, ...]) -> list[tuple[int, int, int, tuple[int, int]]]:
        """Every patch as (window, y, x, scaled size): its size, its corner at its scale."""
        window = self.window_size or min(size)
        step = self.step_size or window
        step_px = round(window * self.scale_step_ratio)
        scales = self.scales or tuple(window + step_px * i for i in range(self.num_scales))
        found: list[tuple[int, int, int, tuple[int, int]]] = []
        for scale in scales:
            if scale < window:
                raise ValueError(f"every scale must be at least the window ({window} pixels), got {scale}")
            shape = scaled_size(size, scale)
            for y in window_starts(shape[0], window, step):
                found.extend((window, y, x, shape) for x in window_starts(shape[1], window, step))
        return found

    def planned_passes(self, images: Tensor) -> int:
        patches = self.windows(tuple(images.shape[-2:]))
        kept = len(patches) - int(len(patches) * self.pre_filter_ratio)
        window = patches[0][0]
        per_patch = self.base_cam.planned_passes(images[:1, :, :window, :window])
        return len(images) * (len(patches) + kept * per_patch)

    def target_layers(self, images: Tensor) -> dict[str, nn.Module]:
        return self.base_cam.target_layers(images)

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        images = check_images(images, self.model)
        self.check_applies(images)
        if custom_target(targets) is not None:
            raise ValueError("SESS scores each patch by a class: pass class ids or names, not a callable target")
        with torch.no_grad():
            logits = class_logits(self.model(images))
        ids = select_targets(logits, targets, topk=topk, class_names=self.class_names)[1]
        columns = ids if ids.dim() == 2 else ids[:, None]
        fused = torch.stack(
            [torch.stack([self.fuse(images[i : i + 1], int(c)) for c in columns[i]]) for i in range(len(images))]
        )
        raw = fused if ids.dim() == 2 else fused[:, 0]
        layer = self.layer_names(images)[0]
        size = tuple(images.shape[-2:])
        return Explanation(scale_maps(raw, size), {layer: raw}, logits, ids, self.name, self.class_names)

    def patches(self, image: Tensor) -> tuple[Tensor, list]:
        """(P, C, w, w) patches of one image at every scale, and where each was taken."""
        found, resized = [], {}
        windows = self.windows(tuple(image.shape[-2:]))
        for window, y, x, shape in windows:
            if shape not in resized:
                resized[shape] = F.interpolate(image, size=shape, mode="bilinear", align_corners=False, antialias=True)
            found.append(resized[shape][0, :, y : y + window, x : x + window])
        return torch.stack(found), windows

    def scores(self, patches: Tensor, target: int) -> Tensor:
        """The target's score of each patch (softmax probability or logit), clipped at 0."""
        out = []
        with torch.no_grad():
            for batch in patches.split(self.batch_size):
                logits = class_logits(self.model(batch)).float()
                out.append((logits.softmax(dim=1) if self.use_softmax_scores else logits)[:, target])
        return torch.cat(out).clamp_min(0)

    def fuse(self, image: Tensor, target: int) -> Tensor:
        """The fused (H, W) map of one image and target (before the final scaling)."""
        height, width = image.shape[-2:]
        patches, windows = self.patches(image)
        scores = self.scores(patches, target)
        order = scores.argsort(stable=True)[int(len(scores) * self.pre_filter_ratio) :]
        top = scores[order[-1]]
        weights = scores[order] / top if top > 0 else torch.ones(len(order), device=scores.device)
        total = torch.zeros(height, width, device=image.device)
        counts = torch.zeros_like(total)
        for chunk, chunk_weights in zip(order.split(self.batch_size), weights.split(self.batch_size), strict=True):
            maps = self.base_cam._explain(patches[chunk], [target] * len(chunk)).maps.float()
            for cam, weight, index in zip(maps, chunk_weights, chunk.tolist(), strict=True):
                window, y, x, shape = windows[index]
                pasted = torch.zeros(shape, device=image.device)
                pasted[y : y + window, x : x + window] = cam * weight
                pasted = F.interpolate(pasted[None, None], size=(height, width), mode="bilinear", align_corners=False)
                pasted = pasted[0, 0]
                if self.pool == "max":
                    total = torch.maximum(total, pasted)
                else:
                    above = pasted > self.theta
                    total += torch.where(above, pasted, 0.0)
                    counts += above
        if self.pool == "mean":
            total = torch.where(counts > 0, total / counts.clamp_min(1), 0.0)
        return gaussian_blur(total[None])[0] if self.smooth else total
