"""From options to work (the command line's words, checked against the model): ``--target``
for each task, ``--method`` and ``--method-option`` into checked explainers, and ``--metrics``
into metric names and settings; ``--max-memory``; the warning before a run whose methods cost
far more than the rest."""

from __future__ import annotations

import ast
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from PIL import Image
from torch import Tensor

from ..base import Explainer, NotApplicable, keyword_parameters
from ..catalogue import method_class, method_names
from ..drawing import normalization_of
from ..errors import Option, UsageError, is_out_of_memory
from ..images import ImageError, load_rgb
from ..metrics.registry import METRICS, metric
from ..models import LoadedModel
from ..options import LOCALISATION_METRICS, PIXEL_METRICS, STEP_METRICS
from ..passes import parse_memory
from ..similarity import SimilarityTarget
from ..targets import class_index
from ..tasks import DetectionTarget, SegmentationTarget
from .options import NameList

#: A run warns where its costliest methods cost over this many times the median of the others.
COSTLY_RATIO = 10.0
#: A method that costs over this many forward passes of the model per image is costly on its own.
COSTLY_PASSES = 2000.0
#: The options the messages here are most about (see :class:`~explain.errors.Option`).
TARGET, TASK, METHODS, LAYER = Option("target"), Option("task"), Option("methods"), Option("layer")
METHOD_OPTIONS, METRICS_OPTION, REGIONS = Option("method_options"), Option("metrics"), Option("regions")
#: The methods' keyword options that an option of the run sets for every method that takes
#: them (``target_layer`` by ``layer``), which ``method_options`` refuses.
FLAG_OPTIONS = {
    "target_layer": Option("layer"),
    "eigen_smooth": Option("eigen_smooth"),
    "aug_smooth": Option("aug_smooth"),
    "reduction": Option("reduction"),
    "class_names": Option("model"),
}


@dataclass(frozen=True)
class TargetSpec:
    """What to explain: ``labels`` are the manifest's target column, one per output.

    For segmentation and detection, ``targets`` is what the explainers are checked with
    (a :class:`~explain.tasks.SegmentationTarget`, or a placeholder box) and ``select`` the
    :meth:`~explain.tasks.DetectionTarget.select` arguments that pick each image's boxes."""

    labels: tuple[str, ...]
    targets: int | SegmentationTarget | DetectionTarget | SimilarityTarget | None = None
    topk: int | None = None
    select: dict | None = None


def parse_target(text: str, class_names: list[str]) -> TargetSpec:
    text = text.strip()
    match = re.fullmatch(r"top-?k?[:=]?(\d+)", text, flags=re.IGNORECASE)
    if match:
        k = int(match.group(1))
        if not 1 <= k <= len(class_names):
            raise UsageError(TARGET, f" {text}: K must lie in 1..{len(class_names)}")
        labels = tuple(f"top{rank}" for rank in range(1, k + 1))
        return TargetSpec(labels) if k == 1 else TargetSpec(labels, topk=k)
    if re.fullmatch(r"\d+", text):
        class_id = int(text)
        if class_id >= len(class_names):
            raise UsageError(
                TARGET, f" {class_id}: the model has {len(class_names)} classes (0..{len(class_names) - 1})"
            )
    else:
        try:
            class_id = class_index(text, class_names)
        except ValueError as error:
            raise UsageError(TARGET, f": {error}") from None
    return TargetSpec((str(class_id),), targets=class_id)


def is_similarity_target(text: str) -> bool:
    """Whether ``--target`` asks for the similarity to an image (``similar:IMAGE``)."""
    return re.match(r"\s*similar[:=]", text, flags=re.IGNORECASE) is not None


def parse_similarity_target(text: str, loaded: LoadedModel, task: str) -> TargetSpec:
    """``--target similar:IMAGE``: the cosine similarity of each image's embedding (the model's
    (N, D) output) to IMAGE's, preprocessed as the inputs are and embedded once."""
    if task != "classify":
        raise UsageError(
            TARGET,
            " similar:IMAGE explains an embedding, the (N, D) output of an embedding model or a "
            f"classifier, not a {task} model's output",
        )
    path = re.sub(r"^\s*similar[:=]", "", text, flags=re.IGNORECASE).strip()
    if not path:
        raise UsageError(TARGET, " similar:IMAGE names the reference image, e.g. ", TARGET, " similar:photos/cat.jpg")
    try:
        picture = load_rgb(path)
    except ImageError as error:
        raise UsageError(TARGET, f" {text.strip()}: cannot read the reference image {path}: {error}") from None
    preprocess = cast(Callable[[Image.Image], Tensor], loaded.preprocess)
    image = preprocess(picture).unsqueeze(0).to(loaded.device)
    try:
        target = SimilarityTarget.of_image(loaded.model, image)
    except ValueError as error:
        raise UsageError(TARGET, f" {text.strip()}: {error}") from None
    return TargetSpec((f"similar:{path}",), targets=target)


def parse_task_target(text: str, task: str, class_names: list[str]) -> TargetSpec:
    """--target for segmentation (top1, or a class over its predicted mask) and detection
    (top1, box:I, a class, score:T, or a class and score:T)."""
    text = text.strip()
    if re.fullmatch(r"top-?k?[:=]?(\d+)", text, flags=re.IGNORECASE) and not re.fullmatch(r"top-?1", text, flags=re.I):
        raise UsageError(
            TARGET,
            f" {text}: topk applies to ",
            TASK,
            " classify; with ",
            TASK,
            f" {task} name one class, or "
            + ("top1" if task == "segment" else "score:T for every box scoring at least T"),
        )
    if task == "segment":
        if re.fullmatch(r"top-?1", text, flags=re.IGNORECASE):
            return TargetSpec(("top1",), SegmentationTarget())
        class_id = _class_id(text, class_names)
        return TargetSpec((str(class_id),), SegmentationTarget(class_id))
    select: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if re.fullmatch(r"top-?1", part, flags=re.IGNORECASE):
            continue
        match = re.fullmatch(r"(box|score)[:=](.+)", part, flags=re.IGNORECASE)
        try:
            if match and match[1].lower() == "box":
                select["index"] = int(match[2])
                if select["index"] < 0:
                    raise ValueError
            elif match:
                select["min_score"] = float(match[2])
            else:
                select["label"] = _class_id(part, class_names)
        except ValueError:
            raise UsageError(
                TARGET, f" {text}: box:I takes a box index (0, 1, ...), score:T a score such as 0.5"
            ) from None
    if "index" in select and len(select) > 1:
        raise UsageError(TARGET, f" {text}: pick a box by its index alone (box:I), or by class and/or score:T")
    placeholder = DetectionTarget([[0.0, 0.0, 1.0, 1.0]], [0])  # for checking the explainers: scores 0
    return TargetSpec((text,), placeholder, select=select)


def _class_id(text: str, class_names: list[str]) -> int:
    if re.fullmatch(r"\d+", text):
        class_id = int(text)
        if class_names and class_id >= len(class_names):
            raise UsageError(
                TARGET, f" {class_id}: the model has {len(class_names)} classes (0..{len(class_names) - 1})"
            )
        return class_id
    try:
        return class_index(text, class_names)
    except ValueError as error:
        raise UsageError(TARGET, f": {error}") from None


def class_name(class_names: list[str], class_id: int) -> str:
    """The name of ``class_id``, or the id as text where the model names no such class."""
    return class_names[class_id] if 0 <= class_id < len(class_names) else str(class_id)


def build_explainers(
    names: NameList | str,
    loaded: LoadedModel,
    layer: NameList | str,
    target: TargetSpec,
    method_options: dict | None = None,
    **options,
) -> list:
    """One explainer per method, each checked once on a blank image so that mistakes in the
    method, layer or target surface now, as usage errors, and the auto layer is fixed.

    ``options`` (eigen_smooth, aug_smooth, reduction) and the layers go to every named method
    that takes them (a method that takes one but cannot use it says so); one that no named
    method takes is a usage error. With ``all``, each goes only where it applies, and methods
    whose definition does not apply to the model (:class:`~explain.NotApplicable`: CAM
    without a pooled linear head, attention methods on a CNN) are left out with a note.
    ``method_options`` (:func:`parse_method_options`) go to their own method alone, which
    ``names`` must include."""
    names, layer = NameList.parse(names), NameList.parse(layer, "auto")
    everything = names.every
    wanted = method_names() if everything else list(names.names)
    if not wanted:
        raise UsageError(METHODS, " is empty; see `explain methods`")
    if not layer.auto:
        options = dict(options, target_layer=list(layer.names))
    classes = method_classes(wanted)
    for option in options:
        if not any(accepts_option(cls, option) for cls in classes.values()):
            about = Option("layer" if option == "target_layer" else option)
            raise UsageError(about, f" applies to none of the methods {', '.join(wanted)}; see `explain methods`")
    method_options = method_options or {}
    for cls, own in method_options.items():
        if cls not in classes.values():
            raise UsageError(
                *method_option_flags(cls, own), f": {cls.name} is not among ", METHODS, f" {names}; add it to ", METHODS
            )
    explainers: list[Explainer] = []
    for name, cls in classes.items():
        applies = option_applies if everything else accepts_option
        given = {option: value for option, value in options.items() if applies(cls, option)}
        own = method_options.get(cls, {})
        flags = method_option_flags(cls, own) if own else (METHODS, f" {name} ", LAYER, f" {layer}")
        if own and "target_layer" in given:  # the layer may be what the options do not fit
            flags = (LAYER, f" {layer} ", *flags)
        if cls.per_concept:  # maps per concept of the whole batch: no per-image files to write
            why = "its maps are per concept of a batch, not per target: the Python API gives them"
            if not everything:
                raise UsageError(METHODS, f" {name}: {why}")
            print(f"explain: --method all: leaving out {name}: {why}", file=sys.stderr)
            continue
        try:
            cam = cls(loaded.model, class_names=loaded.class_names, **given, **own)
            cam.check(loaded.example, target.targets, topk=target.topk)
        except NotApplicable as error:
            if not everything:
                raise UsageError(METHODS, f" {name}: {error}") from None
            print(f"explain: --method all: leaving out {name}: {why_not(error)}", file=sys.stderr)
            continue
        except ValueError as error:  # the library's word for a mistake in what it was given
            raise UsageError(*flags, f": {error}") from None
        except Exception as error:  # on a blank image, any other failure is a setup problem
            if is_out_of_memory(error):
                raise  # a resource failure, not a mistake in the options: main() says so
            raise UsageError(*flags, f": {type(error).__name__}: {error}") from None
        if cam.name not in (e.name for e in explainers):
            explainers.append(cam)
    return explainers


def method_classes(names: list[str]) -> dict[str, type[Explainer]]:
    """{name: its method's class}; an unknown name is a usage error with the names it is close to."""
    classes = {}
    for name in names:
        try:
            classes[name] = method_class(name)
        except ValueError as error:
            raise UsageError(METHODS, f": {error}") from None
    return classes


def parse_method_options(entries: Sequence[str]) -> dict[type[Explainer], dict[str, Any]]:
    """``--method-option METHOD:KEY=VALUE`` entries as keyword options by method class.

    An entry is cut at its first ``=``, and what comes before at its last ``:``: METHOD may
    hold a colon (``smoothgrad:ig``), KEY never does. METHOD is matched as ``--method``
    names are (case, dashes and underscores ignored), KEY is a keyword of its class's
    ``__init__`` (dashes read as underscores), and VALUE a Python literal where it is one
    (``32``, ``0.5``, ``None``, ``'text'``; ``3,2,2`` a tuple; ``true``, ``false``, ``none``
    in any case), else a string. Mistakes are :class:`~explain.errors.UsageError` s.

    >>> options = parse_method_options(["IG:n-steps=32", "lrp:composite=epsilon-plus-flat", "layer-ig:neuron=3,2,2"])
    >>> {cls.name: values for cls, values in options.items()}
    {'ig': {'n_steps': 32}, 'lrp': {'composite': 'epsilon-plus-flat'}, 'layer-ig': {'neuron': (3, 2, 2)}}
    >>> parse_method_options(["smoothgrad:ig:n_samples=10"])[method_class("smoothgrad:ig")]
    {'n_samples': 10}
    """
    options: dict[type[Explainer], dict[str, Any]] = {}
    for entry in [entries] if isinstance(entries, str) else entries:  # one entry, from a Python caller
        head, equals, text = entry.partition("=")
        method, colon, key = head.rpartition(":")
        method, key, text = method.strip(), key.strip().replace("-", "_"), text.strip()
        if not (equals and colon and method and key and text):
            raise UsageError(
                METHOD_OPTIONS,
                f" {entry}: give METHOD:KEY=VALUE, such as ig:n_steps=32, "
                "lrp:composite=epsilon-plus-flat or layer-ig:neuron=3,2,2",
            )
        try:
            cls = method_class(method)
        except ValueError as error:
            raise UsageError(METHOD_OPTIONS, f" {entry}: {error}") from None
        if key in FLAG_OPTIONS:
            raise UsageError(
                METHOD_OPTIONS,
                f" {entry}: {key} is set by ",
                FLAG_OPTIONS[key],
                " for all the methods; use ",
                FLAG_OPTIONS[key],
                ", not ",
                METHOD_OPTIONS,
            )
        if not accepts_option(cls, key):
            takes = [name for name in keyword_parameters(cls) if name not in FLAG_OPTIONS]
            raise UsageError(METHOD_OPTIONS, f" {entry}: {cls.name} takes no {key}; its options: {', '.join(takes)}")
        own = options.setdefault(cls, {})
        if key in own:
            raise UsageError(METHOD_OPTIONS, f" {entry}: {cls.name}'s {key} is given twice; keep one")
        own[key] = _literal(text)
    return options


def _literal(text: str) -> Any:
    words = {"true": True, "false": False, "none": None}
    if text.lower() in words:
        return words[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def method_option_text(options: dict[str, Any]) -> str:
    """A method's options as its settings record them: `` key=value`` each, the value without
    spaces.

    >>> method_option_text({"n_steps": 32, "neuron": (3, 2, 2), "composite": "epsilon-plus-flat"})
    ' n_steps=32 neuron=(3,2,2) composite=epsilon-plus-flat'
    """
    return "".join(f" {_setting(key, value)}" for key, value in options.items())


def method_option_flags(cls: type[Explainer], options: dict[str, Any]) -> tuple[str | Option, ...]:
    """The ``method_options`` entries that give ``cls`` its ``options``, as parts of a
    :class:`~explain.errors.UsageError` (``--method-option ig:n_steps=32`` on the command line)."""
    parts: list[str | Option] = []
    for key, value in options.items():
        parts += [" "] * bool(parts) + [METHOD_OPTIONS, f" {cls.name}:{_setting(key, value)}"]
    return tuple(parts)


def _setting(key: str, value: Any) -> str:
    return f"{key}={value if isinstance(value, str) else repr(value).replace(' ', '')}"


def why_not(error: NotApplicable) -> str:
    """Why a method does not apply to the model, in one short sentence: the reason its error
    gives, without the details after a colon, the remedy after a semicolon (which speaks to a
    Python caller) or the asides in parentheses.

    >>> why_not(NotApplicable("CAM needs a pooled linear head (as in ResNet); pass fc_layer="))
    'CAM needs a pooled linear head'
    >>> why_not(NotApplicable("rollout saw no attention: the model computes none through F.sdpa"))
    'rollout saw no attention'
    """
    reason = str(error)
    while re.search(r"\([^()]*\)", reason):
        reason = re.sub(r"\s*\([^()]*\)", "", reason)
    return reason.split(";")[0].split(": ")[0].strip()


def accepts_option(cls: type[Explainer], option: str) -> bool:
    """Whether ``cls(model, ...)`` takes the keyword ``option``, through ``**options`` too."""
    return option in keyword_parameters(cls)


def option_applies(cls: type[Explainer], option: str) -> bool:
    """Whether ``option`` applies to a method: it takes it, and eigen_smooth only where the
    map is a sum over channels, a layer only where the method explains through one."""
    if option == "eigen_smooth" and not getattr(cls, "channel_sum", False):
        return False
    if option == "target_layer" and not cls.needs_layer:
        return False
    return accepts_option(cls, option)


def parse_metrics(value: NameList | str, with_regions: bool = False) -> list[str]:
    """Metric names from a list or ``all`` (every metric, the localisation ones only
    ``with_regions``); unknown names and localisation metrics without regions are usage
    errors that say what to pass."""
    given = NameList.parse(value)
    if given.every:
        return [name for name, spec in METRICS.items() if with_regions or spec.needs != "regions"]
    names = []
    for part in given.names:
        try:
            names.append(metric(part).name)
        except ValueError as error:
            raise UsageError(METRICS_OPTION, f": {error}") from None
    if not names:
        raise UsageError(METRICS_OPTION, f" is empty; known metrics: {', '.join(METRICS)}")
    needing = [name for name in names if name in LOCALISATION_METRICS]
    if needing and not with_regions:
        raise UsageError(
            METRICS_OPTION,
            f" {','.join(needing)}: these metrics need the objects' regions; pass ",
            REGIONS,
            " FILE (a CSV of boxes image,x0,y0,x1,y1 in model-input pixels, or a folder of masks)",
        )
    return list(dict.fromkeys(names))


def metric_options(metrics: list[str], step: int | None, preprocess=None) -> dict[str, dict]:
    """Each metric's keyword options from ``--step`` (the pixels per step of the step metrics)
    and, for the metrics that read the images' 8-bit pixels (PIC's ``sic``), the
    normalisation of the model's ``preprocess``, where it has one."""
    options = _step_options(metrics, step)
    if preprocess is not None and any(name in PIXEL_METRICS for name in metrics):
        try:
            normalization = normalization_of(preprocess)
        except ValueError:  # the images are taken to be in [0, 1]; the metric says so if not
            return options
        for name in (name for name in metrics if name in PIXEL_METRICS):
            options.setdefault(name, {})["normalization"] = normalization
    return options


def _step_options(metrics: list[str], step: int | None) -> dict[str, dict]:
    if step is None:
        return {}
    if not any(name in STEP_METRICS for name in metrics):
        raise UsageError(
            Option("step"),
            f" applies to none of the metrics {', '.join(metrics)}; it sets the pixels per step "
            f"of {', '.join(STEP_METRICS)}",
        )
    return {name: {"step": step} for name in metrics if name in STEP_METRICS}


def max_memory_option(value: str | int | None) -> int | None:
    """``--max-memory`` in bytes (None: the default budget); a usage error shows the form."""
    try:
        return parse_memory(value)
    except ValueError:
        raise UsageError(
            Option("max_memory"), f" {value}: give a size such as 2GB, 512MiB or 1.5GiB, or a number of bytes"
        ) from None


def method_costs(explainers: list, example) -> dict[str, float]:
    """Each explainer's estimated cost per image, in forward passes of the model
    (:meth:`~explain.Explainer.pass_cost` on ``example``, one image)."""
    return {cam.name: float(cam.pass_cost(example)) for cam in explainers}


def estimated_costs(explainers: list, example, *, quiet: bool) -> dict[str, float]:
    """:func:`method_costs`, with :func:`cost_warning` on stderr where it warns (unless ``quiet``)."""
    costs = method_costs(explainers, example)
    warning = cost_warning(costs)
    if warning and not quiet:
        print(warning, file=sys.stderr)
    return costs


def cost_warning(costs: dict[str, float]) -> str | None:
    """The warning before a run whose costliest method costs over :data:`COSTLY_RATIO` times
    the median of the run's other methods: the three costliest (those above that median)
    with their shares of the run's estimated time; else, where a method costs over :data:`COSTLY_PASSES` forward
    passes per image, its cost; else None.

    >>> print(cost_warning({"sscam": 36000, "iscam": 9000, "scorecam": 1000, "gradcam": 3, "layercam": 3}))
    explain: warning: sscam (78 %), iscam (20 %) and scorecam (2 %) take ~100 % of this run's estimated time; \
leave them out of --method to go faster
    >>> print(cost_warning({"scorecam": 3840}))
    explain: warning: scorecam costs ~3,840 forward passes of the model per image: expect a long run
    >>> cost_warning({"gradcam": 3, "layercam": 3, "scorecam": 12}) is None
    True
    """
    ranked = sorted(costs, key=costs.__getitem__, reverse=True)
    total = sum(costs.values())
    if len(ranked) > 1 and total > 0:
        usual = statistics.median(costs[name] for name in ranked[1:])
        if costs[ranked[0]] > COSTLY_RATIO * usual:
            costly = [name for name in ranked[:3] if costs[name] > usual]
            shares = {name: 100 * costs[name] / total for name in costly}
            named = _joined([f"{name} ({_percent(share)})" for name, share in shares.items()])
            them = "them" if len(costly) > 1 else "it"
            return (
                f"explain: warning: {named} take{'s' * (len(costly) == 1)} ~{_percent(sum(shares.values()))} of "
                f"this run's estimated time; leave {them} out of --method to go faster"
            )
    heavy = [name for name in ranked if costs[name] > COSTLY_PASSES][:3]
    if not heavy:
        return None
    named = _joined(
        [
            f"{name} costs ~{costs[name]:,.0f}" if i == 0 else f"{name} ~{costs[name]:,.0f}"
            for i, name in enumerate(heavy)
        ]
    )
    return f"explain: warning: {named} forward passes of the model per image: expect a long run"


def _percent(share: float) -> str:
    return "<1 %" if share < 0.5 else f"{share:.0f} %"


def _joined(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
