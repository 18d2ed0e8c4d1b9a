"""What every explainer shares: the :class:`Explainer` base class, :class:`NotApplicable`,
and the method registry that :func:`register` fills (:func:`registered` reads it).

The registry holds what has been registered so far; :mod:`explain.catalogue` lists and
makes the methods by name, with the built-in ones registered."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Sequence
from typing import ClassVar

from torch import Tensor, nn

from .checks import INPUT_KINDS, spatial_dims
from .concurrency import model_lock
from .explanation import Explanation
from .passes import call_settings
from .targets import Targets

__all__ = [
    "TRAINING_OPTIONS",
    "Explainer",
    "NotApplicable",
    "check_training_options",
    "keyword_parameters",
    "method_key",
    "register",
    "registered",
    "registered_class",
]

#: The options of the methods that make maps inside a training loop (``Explainer.trains``).
TRAINING_OPTIONS = ("train_mode", "create_graph")

_REGISTRY: dict[str, type[Explainer]] = {}


class NotApplicable(ValueError):
    """The method's definition does not apply to this model (CAM without a linear head over
    a pooled map, attention methods on a model without global self-attention). ``explain run
    --method all`` leaves such methods out instead of failing."""


def check_training_options(cls: type[Explainer], options: dict) -> None:
    """Raise :class:`NotApplicable` where ``options`` ask ``cls`` for maps inside a training
    loop (``train_mode=True``, ``create_graph=True``) and the method makes none."""
    asked = [name for name in TRAINING_OPTIONS if options.get(name)]
    if asked and not cls.trains:
        raise NotApplicable(
            f"{cls.name or cls.__name__} has no training mode ({', '.join(f'{n}=True' for n in asked)}): only the "
            "gradient CAMs made of one forward and one backward pass are differentiable maps of the model as it "
            "trains; use gradcam, gradcam++, hirescam, layercam, xgradcam or gradcam-elementwise"
        )


def keyword_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword options that ``cls(model, ...)`` takes, through its bases' ``**options``: the
    parameters of its ``__init__`` after ``self`` and ``model``, then, while an ``__init__``
    passes ``**options`` on, those of the next one along the MRO.

    >>> from explain.methods import IntegratedGradients
    >>> list(keyword_parameters(IntegratedGradients))[:2]
    ['n_steps', 'method']
    """
    found: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = list(inspect.signature(init).parameters.values())[2:]  # self, model
        found.update(
            (p.name, p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            for p in parameters
            if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL) and p.name not in found
        )
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            break
    return found


def method_key(name: str) -> str:
    """The registry's key of a method name: names ignore case, dashes, underscores and spaces.

    >>> method_key("Grad-CAM++")
    'gradcam++'
    """
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


class Explainer:
    """Base class: an explainer is made once per model and called on batches of images.

    Subclasses set ``name`` (the registered method name) and implement ``__call__``, which
    returns an :class:`~explain.Explanation`. Each call holds the model's lock
    (:mod:`explain.concurrency`): threads that share a model take turns.

    Every call also takes ``max_memory=`` (the budget of the inner batches of a method that
    runs extra passes, such as ``"2GB"``; default: half the memory available on the device)
    and ``progress=`` (True: a progress bar; False: none; None: a bar once a call of more
    than one pass has run a second); see :mod:`explain.passes` and :meth:`__call__`.
    """

    name: ClassVar[str] = ""
    #: The kind of method, as ``explain methods`` groups them.
    family: ClassVar[str] = ""
    #: Passes through the model per image and target, with the default settings.
    cost: ClassVar[str] = ""
    #: Whether the method explains through a target layer (``target_layer=``).
    needs_layer: ClassVar[bool] = False
    #: Whether the method's passes run backward as well as forward.
    backward: ClassVar[bool] = True
    #: Whether the method takes ``train_mode=`` and ``create_graph=`` (maps inside a training loop).
    trains: ClassVar[bool] = False
    #: Why the method applies to images (N, C, H, W) only; empty where it applies to volumes,
    #: videos (N, C, D, H, W) and signals (N, C, L) too.
    images_only: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__call__" in cls.__dict__:
            # each subclass's own __call__, wrapped once where the class is made
            cls.__call__ = _holding_model_lock(cls.__dict__["__call__"])  # type: ignore[method-assign]

    def __init__(self, model: nn.Module, *, class_names: Sequence[str] | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.class_names = list(class_names) if class_names is not None else getattr(model, "class_names", None)

    def __call__(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        """Explain ``images``: every method's call (it also takes ``max_memory=`` and
        ``progress=``, which each subclass's call gains).

        Parameters
        ----------
        images:
            A float tensor, preprocessed as the model takes it: (N, C, H, W) images, or
            (N, C, D, H, W) volumes and videos and (N, C, L) signals for the methods that
            apply to them.
        targets:
            What to explain: None (each image's top class), a class id or name for every
            image, one per image (a sequence or a tensor), a callable of the model's output
            that returns one score per image, or a segmentation, detection or similarity
            target object.
        topk:
            Explain each image's ``topk`` most probable classes in one call (the maps gain
            a k axis after N); not with ``targets``.
        max_memory:
            What the method's extra passes may take at once, such as ``"2GB"`` or a number
            of bytes (default: half the memory available on the images' device).
        progress:
            True: a progress bar at once; False: none; None: a bar once the call has run a
            second.

        Returns
        -------
        Explanation
            The maps, at the input's size, with what they explain.
        """
        raise NotImplementedError

    def check(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> None:
        """Raise now what a call on such images would raise for a mistake in the setup (the
        model, layer or targets); methods whose calls are costly check more cheaply."""
        self(images, targets, topk=topk)

    def check_applies(self, images: Tensor) -> None:
        """Raise :class:`NotApplicable` where ``images`` are volumes or signals and the method
        applies to images only (see ``images_only``)."""
        spatial = spatial_dims(images)
        if self.images_only and spatial != 2:
            kind = INPUT_KINDS.get(spatial, ("inputs", ""))[0]
            raise NotApplicable(
                f"{self.name} applies to images only, not {kind} of shape {tuple(images.shape)}: {self.images_only}"
            )

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        """Names of the layers the maps of ``images`` come from (``Explanation.layers``)."""
        return self(images[:1]).layers

    def planned_passes(self, images: Tensor) -> int:
        """The rows a call on ``images`` (one target each) runs through the model, forward
        and, where :attr:`~explain.Explainer.backward`, backward: what its progress counts and its cost is
        estimated from. One pass of the images unless the method runs more."""
        return len(images)

    def pass_cost(self, images: Tensor) -> float:
        """The cost of a call on ``images`` in forward passes of one image: a backward pass
        counts as two forward ones (it computes two products per layer to the forward's one)."""
        return self.planned_passes(images) * (3.0 if self.backward else 1.0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"


def _holding_model_lock(call):
    @functools.wraps(call)
    def locked(self: Explainer, *args, max_memory=None, progress=None, **kwargs):
        with model_lock(self.model), call_settings(max_memory, progress):
            return call(self, *args, **kwargs)

    signature = inspect.signature(call)
    if "max_memory" not in signature.parameters:
        locked.__signature__ = _with_pass_options(signature)  # type: ignore[attr-defined]  # read by inspect.signature
    return locked


def _with_pass_options(signature: inspect.Signature) -> inspect.Signature:
    parameters = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in ("max_memory", "progress")
    ]
    tail = [p for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    return signature.replace(parameters=parameters + extra + tail)


def register(cls: type[Explainer]) -> type[Explainer]:
    """Class decorator that makes a method available to :func:`explain.explainer` by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name` to be registered")
    _REGISTRY[method_key(cls.name)] = cls
    return cls


def registered() -> dict[str, type[Explainer]]:
    """The methods registered so far, by name, in the order they were registered. The
    built-in ones register when :mod:`explain.methods` is imported (see
    :mod:`explain.catalogue`, which imports it)."""
    return {cls.name: cls for cls in _REGISTRY.values()}


def registered_class(method: str) -> type[Explainer]:
    """The class registered so far as ``method`` (see :func:`method_key`); a ``ValueError``
    names the closest registered names otherwise."""
    cls = _REGISTRY.get(method_key(method))
    if cls is None:
        close = difflib.get_close_matches(method_key(method), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(_REGISTRY[c].name for c in close)}? " if close else ""
        raise ValueError(f"unknown method {method!r}; {hint}known methods: {', '.join(registered())}")
    return cls
