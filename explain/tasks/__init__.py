"""Explaining segmentation and detection models: targets for a class over a region, and for
a detected box, that every explainer of the library takes as ``targets=``.

>>> import torch, torchvision
>>> from explain import GradCAM
>>> from explain.tasks import SegmentationTarget, backbone_layer
>>> model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
...     weights=None, weights_backbone=None, num_classes=3).eval()
>>> images = torch.rand(1, 3, 64, 64)
>>> target = SegmentationTarget()                   # the main class, over its predicted mask
>>> res = GradCAM(model, backbone_layer(model, images))(images, target)
>>> tuple(res.maps.shape), sorted(target.describe(0))
((1, 64, 64), ['box', 'class_id', 'class_name', 'kind', 'pixels', 'task'])

For detectors, :func:`explain_detections` picks the boxes and explains each one.
"""

from ..layers import backbone_layer
from ..model_tasks import segmentation_logits, task_of, task_of_output, torchvision_task
from .detection import Detection, DetectionTarget, crop_padding, detections_of, explain_detections
from .segmentation import SegmentationTarget

__all__ = [
    "Detection",
    "DetectionTarget",
    "SegmentationTarget",
    "backbone_layer",
    "crop_padding",
    "detections_of",
    "explain_detections",
    "segmentation_logits",
    "task_of",
    "task_of_output",
    "torchvision_task",
]
