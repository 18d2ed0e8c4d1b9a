"""Mistakes in ``explain run``'s and ``explain evaluate``'s options that show without torch or
the model: method and metric names, the form of ``--target``, ``--method-option`` and
``--max-memory``, and flags that go together. The command answers them at once (in a tenth
of a second, where importing torch and loading a model takes seconds); what needs the model
(a class name, a layer, an option a method's class does not take) is checked once it loads,
by :mod:`explain.batch.preparation`, with the same messages.

>>> check_methods("gradcam, smoothgrad:ig")
>>> check_methods("gradcamm")
Traceback (most recent call last):
...
explain.errors.UsageError: --method: unknown method 'gradcamm'; did you mean gradcam, ...
"""

from __future__ import annotations

import difflib
import os
import re
import sys

from ..batch.options import NameList
from ..errors import UsageError
from ..options import LOCALISATION_METRICS, METRIC_NAMES, NOISE_TUNNELS, STEP_METRICS, parse_memory
from .method_table import METHOD_ROWS


def _key(name: str) -> str:
    """A method name as the registry keys it (:func:`explain.base.method_key`)."""
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


def _method_names() -> dict[str, str]:
    """The built-in methods by key (the table kept for a fast start), and the methods of the
    registry where this process has loaded it (a caller of :func:`~explain.cli.main` may
    have registered its own)."""
    names = {_key(row[0]): row[0] for row in METHOD_ROWS}
    base = sys.modules.get("explain.base")  # looked up, not imported: importing it loads torch
    if base is not None:
        names.update({_key(name): name for name in base.registered()})
    return names


def method_error(name: str) -> str | None:
    """What is wrong with the method name ``name`` (``KIND:METHOD`` for a noise tunnel), in
    the registry's words; None where it names a built-in method."""
    kind, colon, wrapped = name.partition(":")
    if colon:
        inner = method_error(wrapped.strip())
        if inner is not None:
            return inner
        if _key(kind) not in {_key(known) for known in NOISE_TUNNELS}:
            return f"unknown noise tunnel {kind.strip()!r}; use one of {', '.join(NOISE_TUNNELS)}"
        return None
    names = _method_names()
    if _key(name) in names:
        return None
    close = difflib.get_close_matches(_key(name), list(names), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(names[c] for c in close)}? " if close else ""
    return f"unknown method {name!r}; {hint}known methods: {', '.join(names.values())}"


def check_methods(value: str | NameList, flag: str = "--method") -> None:
    """``--method``: ``all`` or a comma-separated list of method names."""
    methods = NameList.parse(value)
    if methods.every:
        return
    names = methods.names
    if not names:
        raise UsageError(f"{flag} is empty; see `explain methods`")
    for name in names:
        error = method_error(name)
        if error is not None:
            raise UsageError(f"{flag}: {error}")


def metric_names(value: str | NameList, flag: str = "--metrics") -> list[str]:
    """``--metrics``: the metric names of a comma-separated list or ``all``, as
    :func:`explain.batch.explainers.parse_metrics` reads them (the localisation ones are left
    to the caller)."""
    metrics = NameList.parse(value)
    if metrics.every:
        return list(METRIC_NAMES)
    names = []
    for part in metrics.names:
        key = part.strip().lower().replace("_", "-")
        if key not in METRIC_NAMES:
            close = difflib.get_close_matches(key, list(METRIC_NAMES), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UsageError(f"{flag}: unknown metric {part!r}; {hint}known metrics: {', '.join(METRIC_NAMES)}")
        names.append(key)
    if not names:
        raise UsageError(f"{flag} is empty; known metrics: {', '.join(METRIC_NAMES)}")
    return names


def check_target(text: str) -> None:
    """The form of ``--target`` where it can be wrong whatever the model: ``topk:K`` with K a
    whole number of at least 1, ``box:I`` a box index, ``score:T`` a number, and
    ``similar:IMAGE`` an image file that exists."""
    text = text.strip()
    if re.match(r"similar[:=]", text, flags=re.IGNORECASE):
        path = re.sub(r"^similar[:=]", "", text, flags=re.IGNORECASE).strip()
        if not path:
            raise UsageError("--target similar:IMAGE names the reference image, e.g. --target similar:photos/cat.jpg")
        if not os.path.isfile(path):
            raise UsageError(f"--target {text}: cannot read the reference image {path}: file not found")
        return
    topk = re.fullmatch(r"top-?k[:=]?(.*)", text, flags=re.IGNORECASE)
    if topk is not None:
        if not re.fullmatch(r"\d+", topk[1].strip()):
            raise UsageError(f"--target {text}: topk:K takes a whole number of classes, such as topk:3")
        if int(topk[1]) < 1:
            raise UsageError(f"--target {text}: K must be at least 1")
        return
    for part in (p.strip() for p in text.split(",")):
        found = re.fullmatch(r"(box|score)[:=](.*)", part, flags=re.IGNORECASE)
        if found is None:
            continue
        value = found[2].strip()
        index = found[1].lower() == "box" and not re.fullmatch(r"\d+", value)
        if index or (found[1].lower() == "score" and not re.fullmatch(r"[0-9]*\.?[0-9]+(e-?\d+)?", value)):
            raise UsageError(f"--target {text}: box:I takes a box index (0, 1, ...), score:T a score such as 0.5")


def check_method_options(entries: list[str]) -> None:
    """The form of each ``--method-option`` entry and its method's name (the keys a method
    takes are checked once its class is imported)."""
    for entry in entries:
        head, equals, text = entry.partition("=")
        method, colon, key = head.rpartition(":")
        if not (equals and colon and method.strip() and key.strip() and text.strip()):
            raise UsageError(
                f"--method-option {entry}: give METHOD:KEY=VALUE, such as ig:n_steps=32, "
                "lrp:composite=epsilon-plus-flat or layer-ig:neuron=3,2,2"
            )
        error = method_error(method.strip())
        if error is not None:
            raise UsageError(f"--method-option {entry}: {error}")


def check_max_memory(value) -> None:
    try:
        parse_memory(value)
    except ValueError:
        raise UsageError(
            f"--max-memory {value}: give a size such as 2GB, 512MiB or 1.5GiB, or a number of bytes"
        ) from None


def check_step(step: int | None, metrics: list[str]) -> None:
    """``--step`` goes with a metric whose pixels per step it sets."""
    if step is None:
        return
    if not metrics:
        raise UsageError("--step goes with --metrics (it sets the metrics' pixels per step)")
    if not any(name in STEP_METRICS for name in metrics):
        raise UsageError(
            f"--step applies to none of the metrics {', '.join(metrics)}; it sets the pixels per step "
            f"of {', '.join(STEP_METRICS)}"
        )


def check_run_options(args) -> None:
    """``explain run``'s options that need no model (:class:`~explain.batch.options.RunOptions`)."""
    check_methods(args.methods)
    check_method_options(args.method_options)
    check_target(args.target)
    check_max_memory(args.max_memory)
    metrics = metric_names(args.metrics) if args.metrics else []
    if args.metrics and args.metrics.every:
        metrics = [name for name in metrics if name not in LOCALISATION_METRICS]
    needing = [name for name in metrics if name in LOCALISATION_METRICS]
    if needing:
        raise UsageError(
            f"--metrics: {', '.join(needing)} need the objects' regions, which `explain evaluate --regions FILE` takes"
        )
    if metrics and re.match(r"\s*similar[:=]", args.target, flags=re.IGNORECASE):
        raise UsageError(
            "--metrics rescore the explained class, and --target similar:IMAGE explains a similarity, not a "
            "class; leave out --metrics, or explain a class"
        )
    check_step(args.step, metrics)
    if args.labels is not None and not os.path.isfile(args.labels):
        raise UsageError(f"--labels {args.labels}: no such file; give a CSV of path,label lines")
    if args.atlas is not None:  # read again where the page is written; its mistakes said now
        from ..batch.page import atlas_links

        atlas_links(args.atlas, str(args.out))
        if "crp" not in args.methods.names and not args.methods.every:
            print(
                "explain: note: --atlas links the concepts of --method crp, which this run does not make",
                file=sys.stderr,
            )


def check_engine_options(options) -> None:
    """--address and --actors go with --engine ray, which needs Ray Data installed (said before
    the model loads)."""
    if options.engine == "ray":
        from ..batch.ray_cluster import import_ray

        import_ray()
        return
    for flag, value in (("--address", options.address), ("--actors", options.actors)):
        if value is not None:
            raise UsageError(f"{flag} applies to --engine ray; add --engine ray or leave {flag} out")


def check_evaluate_options(args) -> None:
    """``explain evaluate``'s options that need no model (:class:`~explain.batch.options.EvaluateOptions`)."""
    check_engine_options(args)
    check_methods(args.methods, "--methods")
    check_method_options(args.method_options)
    check_target(args.target)
    if re.match(r"\s*similar[:=]", args.target, flags=re.IGNORECASE):
        raise UsageError("explain evaluate scores classes: --target takes top1, a class id or name, or topk:K")
    check_max_memory(args.max_memory)
    metrics = metric_names(args.metrics)
    if args.metrics.every and args.regions is None:
        metrics = [name for name in metrics if name not in LOCALISATION_METRICS]
    needing = [name for name in metrics if name in LOCALISATION_METRICS]
    if needing and args.regions is None:
        raise UsageError(
            f"--metrics {','.join(needing)}: these metrics need the objects' regions; pass --regions FILE "
            "(a CSV of boxes image,x0,y0,x1,y1 in model-input pixels, or a folder of masks)"
        )
    if args.regions is not None:
        if not os.path.exists(args.regions):
            raise UsageError(f"--regions {args.regions}: no such file or folder")
        if not needing:
            raise UsageError(
                f"--regions is read only by {', '.join(LOCALISATION_METRICS)}; add one of them to --metrics"
            )
    check_step(args.step, metrics)
