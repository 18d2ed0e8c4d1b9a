"""Kept so that ``from explain.cam import GradCAM`` goes on working: the methods live in
:mod:`explain.methods`, grouped by family."""

from .methods.cam_base import Captured, explain_together
from .methods.gradient_cams import (
    EigenGradCAM,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    GradientCAM,
    HiResCAM,
    LayerCAM,
    XGradCAM,
)

__all__ = [
    "Captured",
    "EigenGradCAM",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "GradientCAM",
    "HiResCAM",
    "LayerCAM",
    "XGradCAM",
    "explain_together",
]
