"""CAMs made of another CAM's maps: RefineCAM multiplies a base CAM's maps at several
layers. The base is any registered CAM, by name, with its options; its capture (one forward
pass, and one backward pass per target where it uses gradients) is the only model work.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..base import check_training_options, register, registered_class
from ..explanation import Explanation, scale_maps
from ..layers import LayerSpec
from ..targets import Targets
from .cam_base import BaseCAM, Captured

__all__ = ["RefineCAM"]


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
    cost = "the base CAM's: 1 forward + 1 backward to the earliest layer"
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
        plain = self.base_cam.explain(captured)
        size = captured.input_size
        product = torch.stack([scale_maps(raw, size) for raw in plain.raw_layers.values()]).prod(dim=0)
        return Explanation(
            scale_maps(product, size), plain.raw_layers, plain.logits, plain.targets, self.name, self.class_names
        )
