"""The catalogue of methods: every registered method, the built-in ones included, by name.

Importing this module imports :mod:`explain.methods` and :mod:`explain.concepts` (``crp``),
whose classes register themselves (:func:`explain.register`), so the catalogue lists them;
a class registered later is listed too.

>>> "gradcam" in method_names()
True
"""

from __future__ import annotations

import inspect

from torch import nn

from .base import Explainer, check_training_options, cost_text, registered, registered_class
from .concepts import ConceptRelevance  # noqa: F401 -- registers crp, the concept layer's method
from .methods import tunnel_class  # (importing the methods registers the built-in ones)

__all__ = ["describe_methods", "explainer", "method_class", "method_names"]


def method_names() -> list[str]:
    """Names of the registered methods, for :func:`explainer`: by family (in the order of
    :data:`~explain.base.FAMILIES`), then by name.

    >>> "gradcam" in method_names()
    True
    """
    return list(registered())


def describe_methods() -> dict[str, dict[str, str | bool]]:
    """Each method's name with its family, cost (:func:`~explain.base.cost_text`: written out
    from its defaults), whether it needs a target layer, and the first paragraph of its
    docstring, on one line; in the order of :func:`method_names`.

    >>> describe_methods()["gradcam"]["family"], describe_methods()["ig"]["needs_layer"]
    ('gradient CAM', False)
    """
    return {
        name: {
            "family": cls.family,
            "cost": cost_text(cls),
            "needs_layer": cls.needs_layer,
            "description": " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split()),
        }
        for name, cls in registered().items()
    }


def explainer(method: str, model: nn.Module, **kwargs) -> Explainer:
    """Make an explainer by method name; names ignore case, dashes and underscores.

    >>> import torchvision
    >>> cam = explainer("Grad-CAM++", torchvision.models.resnet18())
    >>> type(cam).__name__
    'GradCAMPlusPlus'

    ``KIND:METHOD`` wraps a method in a :class:`~explain.NoiseTunnel` (KIND ``smoothgrad``,
    ``smoothgrad-sq`` or ``vargrad``), the options going to the method but ``n_samples`` and
    ``noise_level``:

    >>> type(explainer("smoothgrad:ig", torchvision.models.resnet18(), n_steps=8, n_samples=10)).__name__
    'SmoothGradOfIntegratedGradients'

    ``train_mode=True`` or ``create_graph=True`` (maps inside a training loop) raise
    :class:`~explain.NotApplicable` for the methods that have no such mode.
    """
    cls = method_class(method)
    check_training_options(cls, kwargs)
    return cls(model, **kwargs)


def method_class(method: str) -> type[Explainer]:
    """The class registered as ``method``; names ignore case, dashes and underscores.
    ``KIND:METHOD`` names a noise tunnel of ``METHOD`` (see :func:`explainer`).

    >>> method_class("grad_cam").__name__, method_class("VarGrad:GuidedBP").name
    ('GradCAM', 'vargrad:guidedbp')
    """
    kind, colon, wrapped = method.partition(":")
    if colon:
        return tunnel_class(kind, method_class(wrapped.strip()))
    return registered_class(method)
