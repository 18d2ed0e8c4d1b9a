"""Kept so that ``from explain.cam import GradCAM`` goes on working: the methods live in
:mod:`explain.methods`, grouped by family."""

from .methods import gradient_cams
from .methods.cam_base import Captured, explain_together
from .methods.gradient_cams import *  # noqa: F403

__all__ = ["Captured", "explain_together", *gradient_cams.__all__]
