"""What every explainer shares: the :class:`Explainer` base class, :class:`NotApplicable`,
and the method registry that :func:`register` fills (:func:`registered` reads it).

The registry holds what has been registered so far; :mod:`explain.catalogue` lists and
makes the methods by name, with the built-in ones registered. Everything else that names
the methods (the exports, ``explain methods``, the Methods page and the families guide, the
tests' lists) reads the registry and the class attributes: a method is its class.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Sequence
from typing import ClassVar

from torch import Tensor, nn

from .checks import INPUT_KINDS, spatial_dims
from .concurrency import model_lock
from .explanation import Explanation
from .hooks import unwrapped
from .passes import call_settings
from .targets import Targets

__all__ = [
    "FAMILIES",
    "TRAINING_OPTIONS",
    "Explainer",
    "NotApplicable",
    "OptionDefault",
    "check_training_options",
    "cost_text",
    "keyword_parameters",
    "listing_key",
    "method_key",
    "register",
    "registered",
    "registered_class",
    "with_defaults",
]

#: The options of the methods that make maps inside a training loop (``Explainer.trains``).
TRAINING_OPTIONS = ("train_mode", "create_graph")
#: The families of methods (``Explainer.family``) in the order everything lists them: the
#: registry, ``explain methods``, the Methods page. Within a family the methods go by name;
#: a family not named here comes after these, by name.
FAMILIES = (
    "gradient CAM",
    "gradient-free CAM",
    "perturbation CAM",
    "gradient attribution",
    "layer attribution",
    "perturbation attribution",
    "relevance",
    "transformer attention",
)

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
        training = [name for name, method in registered().items() if method.trains]
        raise NotApplicable(
            f"{cls.name or cls.__name__} has no training mode ({', '.join(f'{n}=True' for n in asked)}): only the "
            "gradient CAMs made of one forward and one backward pass are differentiable maps of the model as it "
            f"trains; use {', '.join(training[:-1])} or {training[-1]}"
        )


def keyword_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword options that ``cls(model, ...)`` takes, through its bases' ``**options``: the
    parameters of its ``__init__`` after ``self`` and ``model``, then, while an ``__init__``
    passes ``**options`` on, those of the next one along the MRO. ``train_mode`` and
    ``create_graph`` count for the methods that ``trains`` only: the others refuse them.

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
    if not getattr(cls, "trains", True):  # passed on to a base that refuses them
        for name in TRAINING_OPTIONS:
            found.pop(name, None)
    return found


def method_key(name: str) -> str:
    """The registry's key of a method name: names ignore case, dashes, underscores and spaces.

    >>> method_key("Grad-CAM++")
    'gradcam++'
    """
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


class Explainer:
    """Base class: an explainer is made once per model and called on batches of images.

    A call, ``explainer(images, targets=None, *, topk=None, segments=None, max_memory=None,
    progress=None)``, returns an :class:`~explain.Explanation`. It holds the model's lock
    (:mod:`explain.concurrency`): threads that share a model take turns. ``max_memory`` is the
    budget of the inner batches of a method that runs extra passes (such as ``"2GB"``;
    default: half the memory available on the device) and ``progress`` shows a progress bar
    (True), none (False) or one once a call of more than one pass has run a second (None);
    see :mod:`explain.passes`.
    A model wrapped in ``nn.DataParallel``, ``DistributedDataParallel`` or ``torch.compile``
    is explained through the module inside (:func:`~explain.hooks.unwrapped`): ``self.model``
    is that module.

    Subclasses set ``name`` (the registered method name), ``family`` and ``cost``, and
    implement ``_explain(images, targets, *, topk)``, which the call runs (and, where they
    take ``segments=``, ``_explain_segments``); the call itself (``__call__``) is this class's.
    """

    name: ClassVar[str] = ""
    #: The kind of method, as ``explain methods`` groups them (one of :data:`~explain.base.FAMILIES`).
    family: ClassVar[str] = ""
    #: Passes through the model per image and target, with the default settings, as
    #: :meth:`~explain.Explainer.planned_passes` counts them: a template whose ``{option}`` fields
    #: :func:`~explain.base.cost_text` writes out with the option's default ("``{n_steps}``" reads
    #: "n_steps (50)"; see :class:`~explain.base.OptionDefault` for the forms), so that the text follows the defaults.
    cost: ClassVar[str] = ""
    #: The map's formula in one line (Markdown), as the guide's tables of methods show it: a
    #: template as ``cost`` is (:func:`~explain.base.with_defaults`).
    formula: ClassVar[str] = ""
    #: What computes the map (captum's class, zennit, explain), for the guide's tables.
    runs_on: ClassVar[str] = ""
    #: Whether the method explains through a target layer (``target_layer=``).
    needs_layer: ClassVar[bool] = False
    #: Whether the method's passes run backward as well as forward.
    backward: ClassVar[bool] = True
    #: Whether the method takes ``train_mode=`` and ``create_graph=`` (maps inside a training loop).
    trains: ClassVar[bool] = False
    #: Why the method applies to images (N, C, H, W) only; empty where it applies to volumes,
    #: videos (N, C, D, H, W) and signals (N, C, L) too.
    images_only: ClassVar[str] = ""
    #: Whether a call takes ``segments=``: the caller's segments, which the method scores
    #: (:class:`~explain.methods.segment_attribution.TakesSegments`).
    takes_segments: ClassVar[bool] = False
    #: Whether the maps are per concept (N, k, ...), found across the batch, not per target
    #: (Deep Feature Factorization): a call takes no targets, and the batch CLI leaves it out.
    per_concept: ClassVar[bool] = False
    #: Whether the maps of each target are its image's most relevant concepts, ``concepts``
    #: of them (Concept Relevance Propagation): maps (N, targets * concepts, ...), which the
    #: batch CLI writes one overlay per concept, its id and relevance in the manifest.
    per_image_concepts: ClassVar[bool] = False

    def __init__(self, model: nn.Module, *, class_names: Sequence[str] | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = unwrapped(model)  # DataParallel, DistributedDataParallel, torch.compile
        self.class_names = list(class_names) if class_names is not None else getattr(model, "class_names", None)

    def __call__(
        self,
        images: Tensor,
        targets: Targets = None,
        *,
        topk: int | None = None,
        segments: object = None,
        max_memory: int | float | str | None = None,
        progress: bool | None = None,
    ) -> Explanation:
        """Explain ``targets`` (default: each image's top class) for a batch of images.

        The call holds the model's lock (:mod:`explain.concurrency`): threads that share a
        model take turns.

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
            a k axis after N: (N, k, H, W)); not with ``targets``.
        segments:
            Each image's segments, which the method scores instead of its own features
            (the perturbation methods and XRAI, whose ``takes_segments`` is True): a list
            with one entry per image, boolean masks (K, H, W) at the images' size, which may
            overlap, or a label image (H, W) of integers, one segment per value (see
            :mod:`explain.segments`); the result's ``segment_scores`` holds one score per
            segment.
        max_memory:
            What the method's extra passes may take at once, such as ``"2GB"`` or a number
            of bytes (default: half the memory available on the images' device); see
            :mod:`explain.passes`.
        progress:
            True: a progress bar at once; False: none; None: a bar once a call of more than
            one pass has run a second.

        Returns
        -------
        Explanation
            The maps, at the input's size, with what they explain.
        """
        if segments is not None and not self.takes_segments:
            takes = ", ".join(cls.name for cls in _REGISTRY.values() if cls.takes_segments)
            raise ValueError(
                f"{self.name} takes no segments=; leave them out, or use a method that scores them: {takes}"
            )
        with model_lock(self.model), call_settings(max_memory, progress):
            if segments is None:
                return self._explain(images, targets, topk=topk)
            return self._explain_segments(images, targets, topk, segments)

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        """What a call computes, under the model's lock and the call's settings: what each
        method implements. A method that runs another explainer on the same model calls its
        ``_explain``, inside its own call."""
        raise NotImplementedError

    def _explain_segments(self, images: Tensor, targets: Targets, topk: int | None, segments: object) -> Explanation:
        """What a call with ``segments=`` computes, in methods that ``takes_segments``."""
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

    @classmethod
    def cost_fields(cls) -> dict[str, object]:
        """Fields of the ``cost`` and ``formula`` templates that are no option's default: what
        :meth:`~explain.Explainer.planned_passes` counts from the defaults on a 224 x 224 image, where that
        depends on the image."""
        return {}

    def pass_cost(self, images: Tensor) -> float:
        """The cost of a call on ``images`` in forward passes of one image: a backward pass
        counts as two forward ones (it computes two products per layer to the forward's one)."""
        return self.planned_passes(images) * (3.0 if self.backward else 1.0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"


class OptionDefault:
    """An option's default in a template of a method's text (``cost``, ``formula``; see
    :func:`~explain.base.with_defaults`): ``{name}`` reads "name (value)", ``{name:~}`` "name (~value)" (a
    value the method approaches), ``{name:+1}`` "name + 1 (value + 1)", ``{name:len}``
    "len(name) (len(value))", ``{name:code}`` "`name` (value)" (Markdown) and
    ``{name:value}`` the value alone.

    >>> "{n_steps} x {areas:len}".format(n_steps=OptionDefault("n_steps", 50), areas=OptionDefault("areas", (1, 2)))
    'n_steps (50) x len(areas) (2)'
    """

    def __init__(self, name: str, value: object):
        self.name, self.value = name, value

    def __format__(self, spec: str) -> str:
        value = self.value
        if spec == "value":
            return str(value)
        if spec == "code":
            return f"`{self.name}` ({value})"
        if spec == "~":
            return f"{self.name} (~{value})"
        if spec == "len":
            return f"len({self.name}) ({len(value)})"  # type: ignore[arg-type]  # a sequence's default
        if spec.startswith("+"):
            return f"{self.name} + {int(spec[1:])} ({value + int(spec[1:])})"  # type: ignore[operator]  # a number
        if spec:
            raise ValueError(f"unknown form {{{self.name}:{spec}}}; use ~, +N, len, code or value")
        return f"{self.name} ({value})"


def with_defaults(cls: type[Explainer], template: str) -> str:
    """``template`` (a text of ``cls``: its ``cost``, its ``formula``) with its ``{option}``
    fields written out from the defaults of ``cls``'s options (:func:`~explain.base.keyword_parameters`,
    see :class:`~explain.base.OptionDefault` for the forms) and the fields its ``cost_fields()`` computes,
    so that the text follows the defaults.

    >>> from explain.methods import IntegratedGradients
    >>> with_defaults(IntegratedGradients, "{n_steps:code} steps")
    '`n_steps` (50) steps'
    """
    fields: dict[str, object] = {name: OptionDefault(name, p.default) for name, p in keyword_parameters(cls).items()}
    fields.update(cls.cost_fields())
    try:
        return template.format_map(fields)
    except KeyError as missing:
        raise ValueError(f"{cls.__name__}'s text {template!r} names {missing}, which is none of its options") from None


def cost_text(cls: type[Explainer]) -> str:
    """``cls.cost`` written out from ``cls``'s defaults (:func:`~explain.base.with_defaults`).

    >>> from explain.methods import IntegratedGradients, Occlusion
    >>> cost_text(IntegratedGradients)
    '1 forward + n_steps (50) forward + backward'
    >>> cost_text(Occlusion)
    '2 + 169 forward at 224 x 224 (window 32, stride 16)'
    """
    return with_defaults(cls, cls.cost)


def register(cls: type[Explainer]) -> type[Explainer]:
    """Class decorator that makes a method available to :func:`explain.explainer` by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name` to be registered")
    _REGISTRY[method_key(cls.name)] = cls
    return cls


def registered() -> dict[str, type[Explainer]]:
    """The methods registered so far, by name: by family (in the order of :data:`~explain.base.FAMILIES`,
    others after them), then by name. The built-in ones register when :mod:`explain.methods`
    is imported (see :mod:`explain.catalogue`, which imports it)."""
    return {cls.name: cls for cls in sorted(_REGISTRY.values(), key=listing_key)}


def listing_key(cls: type[Explainer]) -> tuple[int, str, str]:
    """Where ``cls`` comes in a listing: its family's place in :data:`~explain.base.FAMILIES` (a family not
    there after them, by its name), then its name.

    >>> from explain.methods import GradCAM, Saliency
    >>> sorted([Saliency, GradCAM], key=listing_key)[0].name
    'gradcam'
    """
    rank = FAMILIES.index(cls.family) if cls.family in FAMILIES else len(FAMILIES)
    return rank, cls.family if rank == len(FAMILIES) else "", cls.name


def registered_class(method: str) -> type[Explainer]:
    """The class registered so far as ``method`` (see :func:`method_key`); a ``ValueError``
    names the closest registered names otherwise."""
    cls = _REGISTRY.get(method_key(method))
    if cls is None:
        close = difflib.get_close_matches(method_key(method), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(_REGISTRY[c].name for c in close)}? " if close else ""
        raise ValueError(f"unknown method {method!r}; {hint}known methods: {', '.join(registered())}")
    return cls
