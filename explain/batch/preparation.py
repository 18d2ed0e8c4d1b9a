"""Checking ``explain run``'s options against the model: the task, the target, the methods and
their layers, the metrics, and the settings recorded with each output."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields

from ..catalogue import method_class
from ..errors import Option, UsageError, worded
from ..layers import backbone_layer
from ..methods import BaseCAM
from ..metrics.registry import METRICS
from ..models import LoadedModel, load_model
from ..options import LOCALISATION_METRICS
from ..passes import pass_settings
from .decoding import ModelInputs, crop_zoom, pickled_decoding
from .explainers import (
    METHODS,
    METRICS_OPTION,
    TARGET,
    TASK,
    TargetSpec,
    build_explainers,
    estimated_costs,
    is_similarity_target,
    max_memory_option,
    method_option_text,
    metric_options,
    option_applies,
    parse_method_options,
    parse_metrics,
    parse_similarity_target,
    parse_target,
    parse_task_target,
)
from .manifest import concept_count
from .options import CheckedRun, EvaluateOptions, NameList, RunOptions
from .segment_sources import SEGMENTS, FolderSegments, ModelSegments, segment_source

#: What a model of each task returns, as the messages say it.
RETURNS = {"classify": "(N, classes) logits", "segment": "(N, C, H, W) logits per pixel", "detect": "boxes"}


@dataclass(kw_only=True)
class PreparedRun(CheckedRun):
    """What a run needs besides its images, checked against the model: the same for the local
    engine and each Ray actor. Its plain values are a :class:`~explain.batch.options.CheckedRun`
    (what the Ray engine's driver, which never loads the model, gets: :meth:`checked`), to which
    it adds the model, the target, the built explainers and what they need."""

    options: RunOptions
    loaded: LoadedModel
    target: TargetSpec
    explainers: list
    metric_options: dict
    #: method -> its estimated cost per image, in forward passes of the model
    costs: dict[str, float] = field(default_factory=dict)
    #: --segments: each image's segments, for the methods that take them (None: no --segments)
    segments: FolderSegments | ModelSegments | None = None

    def checked(self, messages: str = "") -> CheckedRun:
        """The plain values, with how the decode step preprocesses (the Ray engine's: images only)."""
        if self.loaded.kind != "images":
            raise UsageError(
                f"{self.options.model} takes {self.loaded.kind}, which run on the local engine: leave ",
                Option("engine"),
                " ray out",
            )
        plain = {f.name: getattr(self, f.name) for f in fields(CheckedRun)}
        plain.update(decoding=pickled_decoding(ModelInputs(self.loaded.preprocess), self.loaded.example))
        return CheckedRun(**dict(plain, messages=messages))


def prepare_run(args: RunOptions) -> PreparedRun:
    """Load the model and check the options against it: the task, the target, the methods and
    their layers, the metrics. Mistakes are :class:`UsageError` s that say what to pass. Warns
    (unless quiet) where some methods cost far more than the rest (:func:`cost_warning`)."""
    max_memory_option(args.max_memory)
    method_options = parse_method_options(args.method_options)
    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    if args.max_pixels is not None:
        # Pillow checks its limit on every new image, the model's crops included.
        input_pixels = loaded.example.shape[-1] * loaded.example.shape[-2]
        if 0 < args.max_pixels < input_pixels:
            raise UsageError(Option("max_pixels"), f" must be at least the model's input size, {input_pixels}")
    task = _run_task(args, loaded)
    if loaded.kind != "images" and args.metrics:
        raise UsageError(METRICS_OPTION, f" applies to images; {args.model} takes {loaded.kind}")
    if is_similarity_target(args.target):
        target = parse_similarity_target(args.target, loaded, task)
    elif task == "classify":
        target = parse_target(args.target, loaded.class_names)
    else:
        target = parse_task_target(args.target, task, loaded.class_names)
    metrics = _run_metrics(args)
    settings_of_metrics = metric_options(metrics, args.step, loaded.preprocess)
    #: the flags that set an option of every method that takes it
    flag_options: dict[str, bool | str] = {name: True for name in ("eigen_smooth", "aug_smooth") if getattr(args, name)}
    if args.reduction != "abs-sum":
        flag_options["reduction"] = args.reduction
    layer = args.layer
    if task != "classify":
        layer = _task_layer(args, loaded, task, metrics)
    explainers, layers = checked_explainers(args, loaded, layer, target, method_options, **flag_options)
    if metrics:  # (--task segment and detect run CAMs only: crp is refused there already)
        explainers = without_concepts(
            args, explainers, (METRICS_OPTION, " score the map of a target"), ("without ", METRICS_OPTION)
        )
    segments = _segments(args, loaded, task, explainers, metrics)
    return PreparedRun(
        methods=[cam.name for cam in explainers],
        labels=list(target.labels),
        layers=layers,
        settings=_method_settings(args, task, flag_options, explainers, method_options),
        task=task,
        metrics=metrics,
        metric_columns=[column for name in metrics for column in METRICS[name].columns],
        fixed_batch=loaded.fixed_batch,
        device=loaded.device.type,
        class_names=list(loaded.class_names),
        zoom=crop_zoom(loaded.preprocess) if loaded.kind == "images" else None,
        concepts={cam.name: concept_count(cam) for cam in explainers if concept_count(cam)},
        options=args,
        loaded=loaded,
        target=target,
        explainers=explainers,
        metric_options=settings_of_metrics,
        costs=estimated_costs(explainers, loaded.example, quiet=args.quiet),
        segments=segments,
    )


def _run_metrics(args: RunOptions) -> list[str]:
    """--metrics (with --step) checked: the metric names of a run."""
    metrics = parse_metrics(args.metrics, with_regions=True) if args.metrics else []
    if args.metrics and args.metrics.every:  # every metric that needs no regions
        metrics = [name for name in metrics if name not in LOCALISATION_METRICS]
    if any(name in LOCALISATION_METRICS for name in metrics):
        raise UsageError(
            METRICS_OPTION,
            f": {', '.join(n for n in metrics if n in LOCALISATION_METRICS)} need the objects' regions, "
            "which `explain evaluate --regions FILE` takes",
        )
    if metrics and is_similarity_target(args.target):
        raise UsageError(
            METRICS_OPTION,
            " rescore the explained class, and ",
            TARGET,
            " similar:IMAGE explains a similarity, not a class; leave out ",
            METRICS_OPTION,
            ", or explain a class",
        )
    if args.step is not None and not metrics:
        raise UsageError(Option("step"), " goes with ", METRICS_OPTION, " (it sets the metrics' pixels per step)")
    return metrics


def checked_explainers(
    args: RunOptions | EvaluateOptions,
    loaded: LoadedModel,
    layer: NameList | str,
    target: TargetSpec,
    method_options: dict,
    **flag_options,
) -> tuple[list, dict[str, str]]:
    """The explainers of ``args.methods`` built and checked on one blank image
    (:func:`~explain.batch.explainers.build_explainers`) under the job's memory budget, with
    each method's layers (comma-separated), as a run and an evaluation record them."""
    with pass_settings(max_memory=args.max_memory, progress=False):
        explainers = build_explainers(args.methods, loaded, layer, target, method_options, **flag_options)
        layers = {cam.name: ",".join(cam.layer_names(loaded.example)) for cam in explainers}
    return explainers, layers


def without_concepts(
    args: RunOptions | EvaluateOptions,
    explainers: list,
    scored: tuple[str | Option, ...],
    fix: tuple[str | Option, ...],
) -> list:
    """The explainers but the concept methods (crp), whose maps are per concept, not the map
    of a target that metrics score (``scored``: what scores them, as parts of a
    :class:`~explain.errors.UsageError`): left out of --method all with a note, a usage error
    that says to run it ``fix`` where named."""
    concepts = [cam.name for cam in explainers if concept_count(cam)]
    if not concepts:
        return explainers
    why = ("its maps are per concept, and ", *scored)
    if not args.methods.every:
        raise UsageError(METHODS, f" {', '.join(concepts)}: ", *why, "; run it ", *fix)
    for name in concepts:
        print(f"explain: --method all: leaving out {name}: {worded(why)}", file=sys.stderr)
    return [cam for cam in explainers if not concept_count(cam)]


def _segments(
    args: RunOptions, loaded: LoadedModel, task: str, explainers: list, metrics: list[str]
) -> FolderSegments | ModelSegments | None:
    """--segments, checked against the task, the methods and the metrics."""
    if not args.segments:
        return None
    if task != "classify" or loaded.kind != "images":
        raise UsageError(
            SEGMENTS, f" applies to classifiers of images; {args.model} is a {task} model of {loaded.kind}"
        )
    if not any(cam.takes_segments for cam in explainers):
        raise UsageError(
            SEGMENTS,
            f" applies to none of the methods {', '.join(cam.name for cam in explainers)}; it goes with "
            "occlusion, lime, kernelshap, ablation, shapley-sampling and xrai",
        )
    again = [name for name in metrics if METRICS[name].needs == "explainer"]
    if again:
        raise UsageError(
            METRICS_OPTION,
            f" {','.join(again)} explain perturbed copies of the images again, which the ",
            SEGMENTS,
            " do not follow; leave them out with ",
            SEGMENTS,
            " (the metrics that rescore the map apply: deletion, insertion, ...)",
        )
    return segment_source(args.segments, loaded, args.trust_model_file)


def _method_settings(
    args: RunOptions, task: str, flag_options: dict, explainers: list, method_options: dict
) -> dict[str, str]:
    """Each method's settings that shape its outputs: they are recorded with its outputs, so
    that changing an option (a flag or a --method-option) on resume redoes the methods it
    applies to and no other."""
    common = f"model={args.model} weights={args.weights or '-'} cmap={args.cmap} alpha={args.alpha:g}"
    if task != "classify":
        common += f" task={task}" + (f" target={args.target}" if task == "detect" else "")
    settings = {}
    for cam in explainers:
        applied = {name: value for name, value in flag_options.items() if option_applies(type(cam), name)}
        settings[cam.name] = common + "".join(
            f" {name}=1" if value is True else f" {name}={value}" for name, value in applied.items()
        )
        settings[cam.name] += method_option_text(method_options.get(type(cam), {}))
        if args.segments and cam.takes_segments:
            settings[cam.name] += f" segments={args.segments}"
        if applied.get("reduction") == "sum":
            settings[cam.name] += f" signed_cmap={args.signed_cmap}"
    return settings


def _run_task(args: RunOptions, loaded: LoadedModel) -> str:
    """--task, checked against what the model does; by default what the model does."""
    task = args.task or loaded.task
    if task != loaded.task:
        raise UsageError(
            TASK,
            f" {task}: {args.model} is a {loaded.task} model (it returns {RETURNS[loaded.task]}); use ",
            TASK,
            f" {loaded.task}, or leave ",
            TASK,
            " out",
        )
    return task


def _task_layer(args: RunOptions, loaded: LoadedModel, task: str, metrics: list[str]) -> NameList:
    """The checks that apply to segmentation and detection runs, and the layer to explain
    (``--layer auto``: the backbone's last spatial layer)."""
    if metrics:
        raise UsageError(
            METRICS_OPTION,
            " applies to ",
            TASK,
            f" classify; the metrics perturb images and rescore classes, not {task} targets",
        )
    if args.aug_smooth:
        raise UsageError(
            Option("aug_smooth"),
            " applies to ",
            TASK,
            " classify: the flipped and rescaled copies would need "
            f"the {'region' if task == 'segment' else 'boxes'} flipped and rescaled too",
        )
    if args.methods.every:
        raise UsageError(
            METHODS,
            " all includes methods that explain class logits only; with ",
            TASK,
            f" {task} name the CAMs to run, e.g. gradcam,eigencam",
        )
    classes = []
    for name in args.methods.names:
        try:
            cls = method_class(name)
        except ValueError as error:
            raise UsageError(METHODS, f": {error}") from None
        if not issubclass(cls, BaseCAM) and getattr(cls, "task", None) != task:
            also = ", and drise" if task == "detect" else ""
            raise UsageError(
                METHODS,
                f" {name}: with ",
                TASK,
                f" {task} the command line runs CAMs (gradcam, eigencam, scorecam, ...){also}; "
                "explain.tasks serves other methods from Python",
            )
        classes.append(cls)
    if not args.layer.auto or not any(cls.needs_layer for cls in classes):
        return args.layer  # D-RISE alone takes no layer
    try:
        return NameList.parse(backbone_layer(loaded.model, loaded.example))
    except ValueError as error:
        raise UsageError(Option("layer"), f" auto: {error}") from None
