"""The ``explain`` command: CAM and attribution heatmap overlays for folders of images.

    explain run INPUT... --out DIR [--method gradcam,saliency,ig] [--target top1|ID|NAME|topk:K]
                        [--task classify|segment|detect]
    explain evaluate INPUT... --out DIR [--methods gradcam,ig] [--metrics deletion,insertion,road]
    explain methods
    explain layers MODEL

``explain run`` decodes images in DataLoader workers, explains them in batches on the
model's device and writes overlays from a thread pool, so decoding, compute and PNG
encoding overlap. ``explain evaluate`` scores the maps with :mod:`explain.metrics` through
:mod:`explain.evaluation`. Every file is written atomically (scores.csv by whole-line
appends); re-running a command skips outputs (scores) that are already complete. Exit
codes: 0 all done, 1 some inputs failed, 2 usage error, 130 stopped by Ctrl-C.
"""

from __future__ import annotations

import argparse
import inspect
import io
import logging
import os
import re
import signal
import sys
import threading
import time
import warnings
import zipfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn
from torchvision import transforms
from tqdm import tqdm

from . import __version__, models
from .base import NotApplicable, describe_methods, method_class, methods
from .methods import BaseCAM, explain_together
from .methods.attribution_base import REDUCTIONS
from .heap import ReusedHeap
from .hooks import preserved_state
from .evaluation import (
    evaluate,
    format_summary,
    plot_curves,
    plot_randomisation,
    plot_summary,
    read_regions,
    score,
    summary_table,
)
from .evaluation import files as evaluation_files
from .images import IMAGE_EXTENSIONS, ImageError, load_rgb
from .metrics.registry import METRICS, metric
from .layers import candidate_layers, find_target_layer
from .overlay import denormalize, normalization_of, overlay
from .report import (
    atomic_write,
    encode_npz,
    encode_png,
    read_manifest,
    remove_temp_files,
    write_index,
    write_manifest,
)
from .targets import class_index
from .tasks import DetectionTarget, SegmentationTarget, crop_padding, segmentation_logits
from .tasks import models as task_models

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
MANIFEST = "manifest.jsonl"
MODEL_FILE_SUFFIXES = (".pt", ".pth", ".pt2", ".ts", ".jit", ".pkl", ".bin", ".ckpt")
#: Metrics that need --regions, and those that take --step.
LOCALISATION = tuple(name for name, spec in METRICS.items() if spec.needs == "regions")
STEP_METRICS = ("deletion", "insertion", "pixel-flipping")


class UsageError(Exception):
    """A mistake in the command line; the message says how to fix it."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"explain: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="explain",
        description="Explain PyTorch image classifiers with Grad-CAM-family heatmaps.",
    )
    parser.add_argument("--version", action="version", version=f"explain {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    defaults = argparse.ArgumentDefaultsHelpFormatter

    run = commands.add_parser(
        "run", formatter_class=defaults, help="write heatmap overlays for images, folders and lists",
        description="Write one heatmap overlay per image, method and target under --out, with "
        "manifest.jsonl and index.html. Re-running the same command skips finished outputs. "
        "Exit status: 0 all ok, 1 some inputs failed, 2 usage error, 130 interrupted.",
    )
    run.add_argument("inputs", nargs="+", metavar="INPUT",
                     help="image files, folders (searched recursively), glob patterns (quoted), "
                     "or @list.txt naming one input per line")
    run.add_argument("--out", "-o", required=True, type=Path, help="output folder")
    _add_model_options(run)
    run.add_argument("--method", "-m", default="gradcam",
                     help="method(s), comma-separated, or 'all'; see `explain methods`")
    run.add_argument("--layer", default="auto",
                     help="target layer(s), comma-separated; see `explain layers MODEL`")
    run.add_argument("--target", default="top1",
                     help="what to explain. classify: top1, a class id, a class name, or topk:K for the K best; "
                     "segment: top1 (the predicted class covering the most pixels, background aside) or a class id "
                     "or name, over its predicted mask; detect: top1 (the best box), box:I (the I-th box), a class "
                     "id or name (its boxes), score:T (boxes scoring at least T), or a class and score:T joined "
                     "by a comma")
    run.add_argument("--task", choices=task_models.TASKS, default=None,
                     help="what the model does: classify (a class per image), segment (a class per pixel: maps "
                     "explain a class over its region) or detect (boxes: maps explain a detected box, one output "
                     "per box) [default: inferred from the model]")
    run.add_argument("--batch-size", "-b", type=_positive_int, default=16)
    run.add_argument("--eigen-smooth", action="store_true",
                     help="map by the first principal component of each method's per-channel terms "
                     "(CAMs that are a sum over channels)")
    run.add_argument("--aug-smooth", action="store_true",
                     help="average each map over flipped and rescaled copies of the image (6 passes)")
    run.add_argument("--reduction", choices=REDUCTIONS, default="abs-sum",
                     help="how attribution methods reduce the colour channels to one map; 'sum' keeps "
                     "the sign (shown with --signed-cmap)")
    run.add_argument("--cmap", default="jet", help="matplotlib colormap of the heatmap")
    run.add_argument("--signed-cmap", default="RdBu_r",
                     help="diverging matplotlib colormap of signed maps (--reduction sum)")
    run.add_argument("--alpha", type=float, default=0.5, help="heatmap opacity, 0..1")
    run.add_argument("--save-maps", action="store_true",
                     help="also write each image's maps (scaled and raw) as .npz next to its overlays")
    run.add_argument("--workers", "-j", type=_non_negative_int, default=None,
                     help="processes decoding images, and threads writing overlays (0: decode in the "
                     "main process, write from one thread) [default: on cuda up to 4; on cpu the "
                     "cores the model's threads leave free, up to 4]")
    run.add_argument("--overwrite", action="store_true", help="redo outputs that are already complete")
    run.add_argument("--max-pixels", type=_non_negative_int, default=None,
                     help="refuse images with more pixels as decompression bombs (0: no limit) "
                     "[default: Pillow's limit, %d]" % Image.MAX_IMAGE_PIXELS)
    run.add_argument("--quiet", "-q", action="store_true", help="no progress bar; errors and the summary line still print")
    run.add_argument("--metrics", default=None,
                     help="also score each map with these metrics (comma-separated; see `explain evaluate --help`): "
                     "values per row in the manifest, their summary in index.html")
    _add_step_option(run)
    run.set_defaults(handler=run_command)

    scoring = commands.add_parser(
        "evaluate", formatter_class=defaults, help="score methods with faithfulness and other metrics",
        description="Explain the images with each method and score the maps with each metric. Writes under --out: "
        "scores.csv (one row per image, method, target and metric column), failures.csv, curves.jsonl, "
        "summary.csv, summary.md and plots/*.png; prints the summary (mean ± std per method and metric, * marks "
        "the best). Re-running skips the scores already in scores.csv. Exit status: 0 all ok, 1 some images "
        "or metrics failed, 2 usage error, 130 interrupted.",
    )
    scoring.add_argument("inputs", nargs="+", metavar="INPUT",
                          help="image files, folders (searched recursively), glob patterns (quoted), "
                          "or @list.txt naming one input per line")
    scoring.add_argument("--out", "-o", required=True, type=Path, help="output folder")
    _add_model_options(scoring)
    scoring.add_argument("--methods", "--method", "-m", default="gradcam",
                          help="method(s), comma-separated, or 'all'; see `explain methods`")
    scoring.add_argument("--metrics", default="deletion,insertion",
                          help="metric(s), comma-separated, or 'all' (every metric; the localisation ones only "
                          "with --regions): " + ", ".join(METRICS))
    scoring.add_argument("--layer", default="auto",
                          help="target layer(s), comma-separated; see `explain layers MODEL`")
    scoring.add_argument("--target", default="top1",
                          help="class to explain: top1, a class id, a class name, or topk:K for the K best")
    scoring.add_argument("--batch-size", "-b", type=_positive_int, default=16)
    _add_step_option(scoring)
    scoring.add_argument("--regions", type=Path, metavar="FILE",
                          help="where the objects are, for " + ", ".join(LOCALISATION) + ": a CSV with the header "
                          "image,x0,y0,x1,y1 (boxes in pixels of the model input, after resizing and cropping; "
                          "image: file name, stem or path) or a folder of masks named by the images' stems")
    scoring.add_argument("--workers", "-j", type=_non_negative_int, default=None,
                          help="processes decoding images (0: decode in the main process) [default: as for run]")
    scoring.add_argument("--overwrite", action="store_true", help="redo scores already in scores.csv")
    scoring.add_argument("--max-pixels", type=_non_negative_int, default=None,
                          help="refuse images with more pixels as decompression bombs (0: no limit) "
                          "[default: Pillow's limit, %d]" % Image.MAX_IMAGE_PIXELS)
    scoring.add_argument("--quiet", "-q", action="store_true", help="no progress bar; errors and the summary still print")
    scoring.set_defaults(handler=evaluate_command)

    listing = commands.add_parser("methods", help="list the explanation methods",
                                  description="List the registered methods with their family, their cost "
                                  "per image and target, whether they explain through a --layer, and a "
                                  "one-line description.")
    listing.set_defaults(handler=methods_command)

    layers = commands.add_parser(
        "layers", formatter_class=defaults, help="list a model's candidate target layers",
        description="List the layers with spatial outputs, in execution order, with their output "
        "shapes; '*' marks the layer picked when --layer is auto.",
    )
    layers.add_argument("model", metavar="MODEL",
                        help="efficientnet_lite0, a torchvision model name, or a model file")
    _add_model_options(layers, with_model=False)
    layers.set_defaults(handler=layers_command)
    return parser


def _add_model_options(parser: argparse.ArgumentParser, with_model: bool = True) -> None:
    if with_model:
        parser.add_argument("--model", default=models.BUNDLED,
                            help="efficientnet_lite0 (bundled), a torchvision classification, segmentation or "
                            "detection model name, timm:NAME for a timm model, a folder holding a Hugging Face image "
                            "classifier (save_pretrained), a torch.export .pt2 file, or a pickled nn.Module (needs "
                            "--trust-model-file)")
    parser.add_argument("--weights", help="state-dict file (.safetensors, or loaded weights_only) for a torchvision "
                        "or timm model name; nothing is downloaded unless you name torchvision's weights (DEFAULT)")
    parser.add_argument("--trust-model-file", action="store_true",
                        help="allow loading a pickled nn.Module, which runs code from the file")
    parser.add_argument("--device", help="torch device [default: cuda if available, else cpu]")


def _add_step_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step", type=_positive_int, default=None,
                        help="pixels removed or inserted per step by " + ", ".join(STEP_METRICS) + " (fewer steps "
                        "run faster) [default: each metric's own: one row of the image for deletion and insertion, "
                        "1 %% of it for pixel-flipping]")


def default_workers(device: torch.device) -> int:
    """Decode processes for a run: on a GPU the CPU cores are free for decoding; on the CPU
    the model's threads already keep every core busy, and decoders beside them only compete.
    (On this project's 2-core machine: 46.5 images/s with 0 workers, 41.5 with 2.)"""
    cores = os.cpu_count() or 1
    if device.type != "cpu":
        return min(4, cores)
    return min(4, max(0, cores - torch.get_num_threads()))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


# --------------------------------------------------------------------------- models


@dataclass
class LoadedModel:
    model: nn.Module
    preprocess: object
    class_names: list[str]
    device: torch.device
    example: Tensor  # one preprocessed image on the device
    fixed_batch: bool = False  # an exported program that only takes batches of one
    random_weights: bool = False  # a torchvision architecture named without --weights
    task: str = "classify"  # what the model does: classify, segment or detect (see explain.tasks)


def pick_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("CUDA is not available on this machine; use --device cpu")
    return device


def load_model(spec: str, weights: str | None, trust: bool, device_name: str | None) -> LoadedModel:
    device = pick_device(device_name)
    path = Path(spec)
    named = spec.startswith(models.TIMM_PREFIX) or models.is_huggingface_folder(spec)
    if named or not (path.suffix.lower() in MODEL_FILE_SUFFIXES or os.sep in spec or path.is_file()):
        task = task_models.torchvision_task(spec)
        try:
            if task is None:
                model, preprocess, class_names = models.load(spec, weights, device=device)
                task = "classify"
            else:
                model, preprocess, class_names = task_models.load(spec, weights, device=device)
        except (ValueError, FileNotFoundError, RuntimeError) as error:
            raise UsageError(f"{error}") from None
        fixed_batch = False
        random_weights = weights is None and not models.is_bundled(spec) and not models.is_huggingface_folder(spec)
    else:
        if not path.is_file():
            raise UsageError(
                f"model file {spec} does not exist; pass an existing file, {models.BUNDLED!r}, "
                "or a torchvision model name such as resnet50"
            )
        if weights:
            raise UsageError(
                "--weights goes with a model name (e.g. --model resnet50 --weights FILE); "
                "a model file carries its own weights"
            )
        try:
            model, crop = _read_model_file(path, trust)
        except UsageError:
            raise
        except Exception as error:  # a corrupt or foreign file: say which, not a traceback
            raise UsageError(f"cannot load model file {path}: {_in_brief(error)}") from None
        model = model.to(device).eval()
        task = task_models.task_of(model)
        preprocess = models.imagenet_preprocess(resize=round(max(crop) * 256 / 224), crop=crop)
        if task == "detect":  # a detector normalises the images itself
            preprocess = task_models.preprocess_for(model, task)
        class_names = getattr(model, "class_names", None)
        fixed_batch = path.suffix.lower() == ".pt2" and not _accepts_batches(model, preprocess, device)
        random_weights = False
    example = preprocess(Image.new("RGB", (256, 256), (124, 116, 104))).unsqueeze(0).to(device)
    if class_names is None or task is None:
        with torch.no_grad():
            output = model(example)
        task = task or task_models.task_of_output(output)
        if task is None:
            raise UsageError(f"{spec} returns {type(output).__name__}, not (N, num_classes) logits, (N, C, H, W) "
                             "segmentation logits, or a detector's boxes")
    if class_names is None:
        if task == "detect":
            class_names = []  # unknown: labels are shown as ids
        else:
            classes = output.shape[1] if task == "classify" else segmentation_logits(output).shape[1]
            class_names = models.imagenet_classes() if classes == 1000 else [str(i) for i in range(classes)]
        model.class_names = class_names
    return LoadedModel(model, preprocess, list(class_names), device, example, fixed_batch, random_weights, task)


def _read_model_file(path: Path, trust: bool) -> tuple[nn.Module, tuple[int, int]]:
    """A module and its input size (H, W) from a .pt2 export or a pickled nn.Module."""
    names = []
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    if any(name.endswith("/archive_format") for name in names):
        with _export_log_kept() as logged:  # torch.export logs the cause, then raises a vaguer error
            try:
                program = torch.export.load(path)
            except Exception:
                causes = [record.exc_info[1] for record in logged if record.exc_info]
                if not causes:
                    raise
                raise causes[0] from None
        return torch.export.unflatten(program), _exported_input_size(program)
    if any("/code/" in name or name.endswith("constants.pkl") for name in names):
        raise UsageError(
            f"{path} is a TorchScript file; Grad-CAM needs hooks on the model's layers, which "
            "TorchScript does not support. Export the model with torch.export.save(torch.export.export("
            "model, (example,), dynamic_shapes=...), 'model.pt2') and pass the .pt2 file, or pass "
            "--model ARCH --weights state_dict.pth for a torchvision architecture"
        )
    try:
        with warnings.catch_warnings():  # a foreign file's first byte reads as an unknown pickle protocol
            warnings.simplefilter("ignore", UserWarning)
            loaded = torch.load(path, map_location="cpu", weights_only=not trust)
    except Exception as error:
        # weights_only loading names the first Python object it refuses; other failures
        # (not a torch file, cut short) are no reason to suggest trusting the file.
        if trust or "Unsupported global" not in str(error):
            detail = "" if "Weights only load failed" in str(error) else f" ({_in_brief(error)})"
            raise UsageError(f"cannot load {path}: not a PyTorch file, or a damaged one{detail}") from None
        raise UsageError(
            f"{path} holds pickled Python objects (a whole nn.Module?), and loading those runs "
            "code from the file. If you trust it, add --trust-model-file; otherwise save "
            "model.state_dict() and pass --model ARCH --weights FILE, or export a .pt2 with torch.export"
        ) from None
    if isinstance(loaded, nn.Module):
        return loaded, (224, 224)
    if isinstance(loaded, dict):
        raise UsageError(
            f"{path} holds a state dict, not a model; name the architecture and pass the file as "
            f"weights: --model resnet50 --weights {path}"
        )
    raise UsageError(f"{path} holds a {type(loaded).__name__}, not an nn.Module")


def _in_brief(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"


@contextmanager
def _export_log_kept() -> Iterator[list[logging.LogRecord]]:
    """Collect what torch.export logs instead of letting it print a traceback."""
    records: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        records.append(record)
        return False  # dropped before any handler, torch's own included

    log = logging.getLogger("torch.export")
    log.addFilter(keep)
    try:
        yield records
    finally:
        log.removeFilter(keep)


def _exported_input_size(program) -> tuple[int, int]:
    inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in inputs:
            shape = getattr(node.meta.get("val"), "shape", ())
            if len(shape) == 4 and all(isinstance(side, int) for side in shape[2:]):
                return int(shape[2]), int(shape[3])
            break
    return 224, 224


def _accepts_batches(model: nn.Module, preprocess, device: torch.device) -> bool:
    pair = preprocess(Image.new("RGB", (256, 256))).unsqueeze(0).repeat(2, 1, 1, 1).to(device)
    try:
        with torch.no_grad():
            model(pair)
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------- targets and methods


@dataclass(frozen=True)
class TargetSpec:
    """What to explain: ``labels`` are the manifest's target column, one per output.

    For segmentation and detection, ``targets`` is what the explainers are checked with
    (a :class:`~explain.tasks.SegmentationTarget`, or a placeholder box) and ``select`` the
    :meth:`~explain.tasks.DetectionTarget.select` arguments that pick each image's boxes."""

    labels: tuple[str, ...]
    targets: int | SegmentationTarget | DetectionTarget | None = None
    topk: int | None = None
    select: dict | None = None


def parse_target(text: str, class_names: list[str]) -> TargetSpec:
    text = text.strip()
    match = re.fullmatch(r"top-?k?[:=]?(\d+)", text, flags=re.IGNORECASE)
    if match:
        k = int(match.group(1))
        if not 1 <= k <= len(class_names):
            raise UsageError(f"--target {text}: K must lie in 1..{len(class_names)}")
        labels = tuple(f"top{rank}" for rank in range(1, k + 1))
        return TargetSpec(labels) if k == 1 else TargetSpec(labels, topk=k)
    if re.fullmatch(r"\d+", text):
        class_id = int(text)
        if class_id >= len(class_names):
            raise UsageError(f"--target {class_id}: the model has {len(class_names)} classes (0..{len(class_names) - 1})")
    else:
        try:
            class_id = class_index(text, class_names)
        except ValueError as error:
            raise UsageError(f"--target: {error}") from None
    return TargetSpec((str(class_id),), targets=class_id)


def parse_task_target(text: str, task: str, class_names: list[str]) -> TargetSpec:
    """--target for segmentation (top1, or a class over its predicted mask) and detection
    (top1, box:I, a class, score:T, or a class and score:T)."""
    text = text.strip()
    if re.fullmatch(r"top-?k?[:=]?(\d+)", text, flags=re.IGNORECASE) and not re.fullmatch(r"top-?1", text, flags=re.I):
        raise UsageError(f"--target {text}: topk applies to --task classify; with --task {task} name one class, or "
                         + ("top1" if task == "segment" else "score:T for every box scoring at least T"))
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
            raise UsageError(f"--target {text}: box:I takes a box index (0, 1, ...), score:T a score such as 0.5") from None
    if "index" in select and len(select) > 1:
        raise UsageError(f"--target {text}: pick a box by its index alone (box:I), or by class and/or score:T")
    placeholder = DetectionTarget([[0.0, 0.0, 1.0, 1.0]], [0])  # for checking the explainers: scores 0
    return TargetSpec((text,), placeholder, select=select)


def _class_id(text: str, class_names: list[str]) -> int:
    if re.fullmatch(r"\d+", text):
        class_id = int(text)
        if class_names and class_id >= len(class_names):
            raise UsageError(f"--target {class_id}: the model has {len(class_names)} classes (0..{len(class_names) - 1})")
        return class_id
    try:
        return class_index(text, class_names)
    except ValueError as error:
        raise UsageError(f"--target: {error}") from None


def _class_name(class_names: list[str], class_id: int) -> str:
    return class_names[class_id] if 0 <= class_id < len(class_names) else str(class_id)


def build_explainers(names: str, loaded: LoadedModel, layer: str, target: TargetSpec, **options) -> list:
    """One explainer per method, each checked once on a blank image so that mistakes in the
    method, layer or target surface now, as usage errors, and the auto layer is fixed.

    ``options`` (eigen_smooth, aug_smooth, reduction) and the layers go to every named method
    that takes them (a method that takes one but cannot use it says so); one that no named
    method takes is a usage error. With ``all``, each goes only where it applies, and methods
    whose definition does not apply to the model (:class:`~explain.NotApplicable`: CAM
    without a pooled linear head, attention methods on a CNN) are left out with a note."""
    everything = names.strip().lower() == "all"
    wanted = methods() if everything else [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        raise UsageError("--method is empty; see `explain methods`")
    if layer.strip().lower() != "auto":
        options = dict(options, target_layer=[n.strip() for n in layer.split(",") if n.strip()])
    classes = {}
    for name in wanted:
        try:
            classes[name] = method_class(name)
        except ValueError as error:
            raise UsageError(f"--method: {error}") from None
    for option in options:
        if not any(_accepts(cls, option) for cls in classes.values()):
            flag = "--layer" if option == "target_layer" else "--" + option.replace("_", "-")
            raise UsageError(f"{flag} applies to none of the methods {', '.join(wanted)}; see `explain methods`")
    explainers = []
    for name, cls in classes.items():
        applies = _takes if everything else _accepts
        given = {option: value for option, value in options.items() if applies(cls, option)}
        try:
            cam = cls(loaded.model, class_names=loaded.class_names, **given)
            cam.check(loaded.example, target.targets, topk=target.topk)
        except NotApplicable as error:
            if not everything:
                raise UsageError(f"--method {name}: {error}") from None
            print(f"explain: --method all: leaving out {name}, which does not apply to this model: {error}",
                  file=sys.stderr)
            continue
        except Exception as error:  # on a blank image, any failure is a setup problem
            raise UsageError(f"--method {name} --layer {layer}: {type(error).__name__}: {error}") from None
        if cam.name not in (e.name for e in explainers):
            explainers.append(cam)
    return explainers


def _accepts(cls: type, option: str) -> bool:
    """Whether ``cls(model, ...)`` takes the keyword ``option``, through ``**options`` too."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters
        if option in parameters:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return False
    return False


def _takes(cls: type, option: str) -> bool:
    """Whether ``option`` applies to a method: it takes it, and eigen_smooth only where the
    map is a sum over channels, a layer only where the method explains through one."""
    if option == "eigen_smooth" and not getattr(cls, "channel_sum", False):
        return False
    if option == "target_layer" and not cls.needs_layer:
        return False
    return _accepts(cls, option)


# --------------------------------------------------------------------------- inputs


@dataclass
class Source:
    """One input image and where its outputs go."""

    input: str            # as found from the command line; the manifest's `input`
    path: str             # absolute
    base: str = ""        # absolute: the folder argument it was found in, else its own folder
    folder: str = ""      # output subfolder that mirrors the input tree, posix style
    stem: str = ""        # start of its output names
    error: str | None = None


def collect_inputs(arguments: list[str], out_dir: Path) -> list[Source]:
    """Expand files, folders, globs and @lists into sources, without duplicates, and lay out
    their outputs: the tree under the common parent of the folder arguments (and of the
    files' own folders) is mirrored under --out."""
    out_abs = os.path.abspath(out_dir)
    found: dict[str, Source] = {}

    def add(path: str, error: str | None = None, base: str | None = None) -> None:
        absolute = os.path.abspath(path)
        if absolute not in found and not _inside(absolute, out_abs):
            found[absolute] = Source(path, absolute, os.path.abspath(base or os.path.dirname(absolute)), error=error)

    def expand(argument: str, from_list: bool) -> None:
        if argument.startswith("@") and not from_list:
            for line in _read_list(argument[1:]):
                expand(line, from_list=True)
        elif os.path.isdir(argument):
            for path in _walk_images(argument, out_abs):
                add(path, base=argument)
        elif os.path.exists(argument):
            add(argument)
        elif any(char in argument for char in "*?["):
            import glob

            matches = sorted(glob.glob(argument, recursive=True))
            if not matches and not from_list:
                raise UsageError(f"no files match {argument!r}")
            for match in matches:
                if os.path.isdir(match):
                    for path in _walk_images(match, out_abs):
                        add(path, base=match)
                elif Path(match).suffix.lower() in IMAGE_EXTENSIONS:
                    add(match)
        elif from_list:
            add(argument, error="file not found")
        else:
            raise UsageError(f"{argument}: no such file or folder")

    for argument in arguments:
        expand(argument, from_list=False)
    if not found:
        raise UsageError(f"no images found in {' '.join(arguments)}")
    sources = list(found.values())
    _lay_out(sources)
    return sources


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _read_list(list_file: str) -> list[str]:
    try:
        lines = Path(list_file).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UsageError(f"cannot read list file @{list_file}: {error.strerror or error}") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _walk_images(folder: str, out_abs: str) -> list[str]:
    """Image files under ``folder``, sorted, skipping hidden entries and the output folder."""
    paths = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not _inside(os.path.abspath(os.path.join(root, d)), out_abs))
        paths.extend(
            os.path.join(root, name) for name in sorted(files)
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS
        )
    return paths


def _lay_out(sources: list[Source]) -> None:
    present = [s for s in sources if s.error is None] or sources
    root = os.path.commonpath([s.base for s in present])
    for source in sources:
        folder = os.path.relpath(os.path.dirname(source.path), root)
        source.folder = "" if folder == "." or folder.startswith("..") else Path(folder).as_posix()
    stems: dict[tuple[str, str], int] = {}
    for source in sources:
        key = (source.folder, Path(source.path).stem.lower())
        stems[key] = stems.get(key, 0) + 1
    taken: set[tuple[str, str]] = set()
    for source in sources:
        name = Path(source.path).name
        unique = stems[(source.folder, Path(name).stem.lower())] == 1
        source.stem = Path(name).stem if unique else name
        while (source.folder, source.stem.lower()) in taken:  # e.g. a.png and a.png.jpg beside a.jpg
            source.stem += "_"
        taken.add((source.folder, source.stem.lower()))


def _safe(text: str) -> str:
    return re.sub(r"[^\w.+-]+", "_", text).strip("_")[:48] or "class"


# --------------------------------------------------------------------------- the run


class _Inputs:
    """The model's preprocessing, split between the decode workers and the model's device.

    Where it ends by scaling to [0, 1] and normalising (``ToTensor`` + ``Normalize``, or
    torchvision's ``weights.transforms()``), the workers stop at the uint8 crop and the rest
    runs batched on the device: a quarter of the bytes between processes, less CPU per image,
    the exact crop pixels for the overlays, and bitwise the same model input. Any other
    preprocessing runs whole in the workers.
    """

    def __init__(self, preprocess):
        self.mean, self.std = normalization_of(preprocess)
        self.in_workers, self.uint8 = preprocess, False
        steps = preprocess.transforms if isinstance(preprocess, transforms.Compose) else []
        if len(steps) >= 2 and type(steps[-2]) is transforms.ToTensor and type(steps[-1]) is transforms.Normalize:
            self.in_workers, self.uint8 = transforms.Compose([*steps[:-2], transforms.PILToTensor()]), True
        elif _is_torchvision_classification_preset(preprocess):
            self.in_workers, self.uint8 = transforms.Compose([
                transforms.Resize(preprocess.resize_size, preprocess.interpolation, antialias=preprocess.antialias),
                transforms.CenterCrop(preprocess.crop_size),
                transforms.PILToTensor(),
            ]), True

    def model_input(self, images: Tensor) -> Tensor:
        """What the model takes, from a batch the workers made, on the batch's device."""
        if not self.uint8:
            return images
        return transforms.functional.normalize(images.float().div(255), self.mean, self.std)

    def pictures(self, images: Tensor, model_input: Tensor) -> np.ndarray:
        """(N, H, W, 3) uint8 images to draw the overlays on."""
        if not self.uint8:
            images = (denormalize(model_input, self.mean, self.std) * 255).round().to(torch.uint8)
        return images.permute(0, 2, 3, 1).cpu().numpy()


def _is_torchvision_classification_preset(preprocess) -> bool:
    # weights.transforms(); its class lives in a private torchvision module, so match by name.
    kind = type(preprocess)
    return kind.__name__ == "ImageClassification" and kind.__module__.startswith("torchvision.")


class _Decode(torch.utils.data.Dataset):
    """Decoded, preprocessed images; failures come back as an error message."""

    def __init__(self, paths: list[str], preprocess, draft_size: int):
        self.paths, self.preprocess, self.draft_size = paths, preprocess, draft_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        try:
            image = load_rgb(self.paths[index], draft_size=self.draft_size)
        except ImageError as error:
            return index, None, str(error)
        try:
            return index, self.preprocess(image), None
        except Exception as error:  # a preprocess that cannot handle this image
            return index, None, f"preprocessing failed: {type(error).__name__}: {error}"


@dataclass
class _Batch:
    groups: list[tuple[list[int], Tensor]]  # (dataset indices, stacked images) per image shape
    failures: list[tuple[int, str]]

    def pin_memory(self) -> _Batch:  # called by the DataLoader when pin_memory=True
        return _Batch([(indices, images.pin_memory()) for indices, images in self.groups], self.failures)


def _collate(items) -> _Batch:
    by_shape: dict[tuple, list] = {}
    failures = []
    for index, tensor, error in items:
        if tensor is None:
            failures.append((index, error))
        else:
            by_shape.setdefault((tuple(tensor.shape), tensor.dtype), []).append((index, tensor))
    groups = [([i for i, _ in group], torch.stack([t for _, t in group])) for group in by_shape.values()]
    return _Batch(groups, failures)


def _init_worker(max_pixels, _worker_id: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    if max_pixels is not None:
        Image.MAX_IMAGE_PIXELS = max_pixels or None


class _StopFlag:
    """First Ctrl-C: finish the current batch, then stop. Second Ctrl-C: stop now."""

    def __init__(self):
        self.set = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.set = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nexplain: stopping after the current batch (Ctrl-C again to stop now)", file=sys.stderr)

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _write_outputs(out_dir: Path, picture: np.ndarray, maps: np.ndarray, rows: list[dict],
                   npz: dict | None, cmap: str, alpha: float, signed: bool = False,
                   marks: list[dict] | None = None) -> list[dict]:
    """Overlay and save one image's maps for one method (one map per target); runs in a thread.
    ``marks`` are per map what :func:`overlay` draws on top (``boxes`` and ``labels``, ``outline``)."""
    try:
        for k, (heat, row) in enumerate(zip(maps, rows)):
            path = out_dir / row["output"]
            path.parent.mkdir(parents=True, exist_ok=True)
            drawn = overlay(picture, heat, cmap=cmap, alpha=alpha, signed=signed, **(marks[k] if marks else {}))
            atomic_write(path, encode_png(drawn))
        if npz is not None:
            atomic_write(out_dir / rows[0]["maps"], encode_npz(**npz))
    except Exception as error:
        return [dict(row, status="failed", error=f"cannot write output: {error}") for row in rows]
    return [dict(row, status="ok") for row in rows]


def run_command(args) -> int:
    if not 0.0 <= args.alpha <= 1.0:
        raise UsageError(f"--alpha must lie in 0..1, got {args.alpha}")
    import matplotlib

    if args.cmap not in matplotlib.colormaps:
        raise UsageError(f"unknown --cmap {args.cmap!r}; use a matplotlib colormap such as jet, turbo, viridis")
    if args.signed_cmap not in matplotlib.colormaps:
        raise UsageError(f"unknown --signed-cmap {args.signed_cmap!r}; use a diverging matplotlib colormap such as "
                         "RdBu_r, bwr, coolwarm")
    out_dir: Path = args.out
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file; pass a folder")
    sources = collect_inputs(args.inputs, out_dir)
    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    if args.max_pixels is not None:
        # Pillow checks its limit on every new image, the model's crops included.
        input_pixels = loaded.example.shape[-1] * loaded.example.shape[-2]
        if 0 < args.max_pixels < input_pixels:
            raise UsageError(f"--max-pixels must be at least the model's input size, {input_pixels}")
    if args.workers is None:
        args.workers = default_workers(loaded.device)
    task = _run_task(args, loaded)
    if task == "classify":
        target = parse_target(args.target, loaded.class_names)
    else:
        target = parse_task_target(args.target, task, loaded.class_names)
    metrics = parse_metrics(args.metrics, with_regions=True) if args.metrics else []
    if any(name in LOCALISATION for name in metrics):
        raise UsageError(f"--metrics: {', '.join(n for n in metrics if n in LOCALISATION)} need the objects' regions, "
                         "which `explain evaluate --regions FILE` takes")
    if args.step is not None and not metrics:
        raise UsageError("--step goes with --metrics (it sets the metrics' pixels per step)")
    metric_options = _metric_options(metrics, args.step)
    options = {name: True for name in ("eigen_smooth", "aug_smooth") if getattr(args, name)}
    if args.reduction != "abs-sum":
        options["reduction"] = args.reduction
    layer = args.layer
    if task != "classify":
        layer = _task_layer(args, loaded, task, metrics)
    explainers = build_explainers(args.method, loaded, layer, target, **options)
    layers = {cam.name: ",".join(cam.layer_names(loaded.example)) for cam in explainers}
    # Each method's outputs record the settings that shaped them, so that changing an option
    # on resume redoes the methods it applies to and no other.
    common = f"model={args.model} weights={args.weights or '-'} cmap={args.cmap} alpha={args.alpha:g}"
    if task != "classify":
        common += f" task={task}" + (f" target={args.target}" if task == "detect" else "")
    settings = {}
    for cam in explainers:
        applied = {name: value for name, value in options.items() if _takes(type(cam), name)}
        settings[cam.name] = common + "".join(
            f" {name}=1" if value is True else f" {name}={value}" for name, value in applied.items())
        if applied.get("reduction") == "sum":
            settings[cam.name] += f" signed_cmap={args.signed_cmap}"
    _warn_if_random(loaded, args.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _sole_run(out_dir), _pixel_limit(args.max_pixels):
        remove_temp_files(out_dir)
        run = _Run if task == "classify" else _TaskRun
        return run(args, out_dir, sources, loaded, target, explainers, layers, settings,
                   metrics, metric_options).execute()


def _run_task(args, loaded: LoadedModel) -> str:
    """--task, checked against what the model does; by default what the model does."""
    task = getattr(args, "task", None) or loaded.task
    if task != loaded.task:
        raise UsageError(f"--task {task}: {args.model} is a {loaded.task} model (it returns "
                         + {"classify": "(N, classes) logits", "segment": "(N, C, H, W) logits per pixel",
                            "detect": "boxes"}[loaded.task] + f"); use --task {loaded.task}, or leave --task out")
    return task


def _task_layer(args, loaded: LoadedModel, task: str, metrics: list[str]) -> str:
    """The checks that apply to segmentation and detection runs, and the layer to explain
    (``--layer auto``: the backbone's last spatial layer)."""
    if metrics:
        raise UsageError(f"--metrics applies to --task classify; the metrics perturb images and rescore classes, "
                         f"not {task} targets")
    if args.aug_smooth:
        raise UsageError(f"--aug-smooth applies to --task classify: the flipped and rescaled copies would need "
                         f"the {'region' if task == 'segment' else 'boxes'} flipped and rescaled too")
    if args.method.strip().lower() == "all":
        raise UsageError(f"--method all includes methods that explain class logits only; with --task {task} name "
                         "the CAMs to run, e.g. gradcam,eigencam")
    for name in (n.strip() for n in args.method.split(",") if n.strip()):
        try:
            cls = method_class(name)
        except ValueError as error:
            raise UsageError(f"--method: {error}") from None
        if not issubclass(cls, BaseCAM):
            raise UsageError(f"--method {name}: with --task {task} the command line runs CAMs (gradcam, eigencam, "
                             "scorecam, ...); explain.tasks serves other methods from Python")
    if args.layer.strip().lower() != "auto":
        return args.layer
    try:
        return task_models.backbone_layer(loaded.model, loaded.example)
    except ValueError as error:
        raise UsageError(f"--layer auto: {error}") from None


@contextmanager
def _sole_run(out_dir: Path, command: str = "run") -> Iterator[None]:
    """Hold a lock on ``out_dir`` for the run: a second run there would delete this one's
    temporary files and both would rewrite the manifest. The kernel drops the lock when the
    process ends, even by SIGKILL, so it never goes stale. Where there is no flock (Windows),
    runs are not locked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(
                f"another `explain {command}` is writing to {out_dir}; wait for it to finish or pass another --out"
            ) from None
        yield
    finally:
        os.close(fd)


@contextmanager
def _pixel_limit(max_pixels: int | None) -> Iterator[None]:
    """Pillow's decompression-bomb limit for the run (0: none), restored afterwards."""
    previous = Image.MAX_IMAGE_PIXELS
    if max_pixels is not None:
        Image.MAX_IMAGE_PIXELS = max_pixels or None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


class _Run:
    """One ``explain run``: plans which outputs are missing, makes them, and reports."""

    #: What the model does; the manifest's ``task``.
    task = "classify"

    def __init__(self, args, out_dir, sources, loaded, target, explainers, layers, settings,
                 metrics=(), metric_options=None):
        self.args, self.out_dir, self.sources, self.loaded = args, out_dir, sources, loaded
        self.target, self.explainers, self.layers, self.settings = target, explainers, layers, settings
        self.metrics, self.metric_options = list(metrics), metric_options or {}
        self.metric_columns = [column for name in self.metrics for column in METRICS[name].columns]
        self.reported: set[str] = set()
        self.inputs = _Inputs(loaded.preprocess)
        self.rows: dict[tuple, dict] = {}
        for row in read_manifest(out_dir / MANIFEST):
            self.rows[(row.get("input"), row.get("method"), row.get("target"))] = row
        self.plan: list[tuple] = []  # every output of this run, in manifest order
        self.pending: dict[int, list] = {}  # source index -> explainers still to run
        self.stats = {"ok": 0, "skipped": 0, "failed": 0}
        self.reports_written = 0.0
        self.reports_cost = 0.0

    # -- planning

    def _keys(self, source: Source, method: str) -> list[tuple]:
        return [(source.input, method, label) for label in self.target.labels]

    def _complete(self, key: tuple) -> bool:
        row = self.rows.get(key)
        return bool(
            row and row.get("status") in ("ok", "skipped")
            and row.get("settings") == self.settings.get(key[1]) and row.get("layer") == self.layers.get(key[1])
            and row.get("output") and (self.out_dir / row["output"]).is_file()
            and (not self.args.save_maps or (row.get("maps") and (self.out_dir / row["maps"]).is_file()))
            and all(column in (row.get("metrics") or {}) for column in self.metric_columns)
        )

    def _make_plan(self) -> None:
        for index, source in enumerate(self.sources):
            for cam in self.explainers:
                keys = self._keys(source, cam.name)
                self.plan.extend(keys)
                if source.error:
                    self._fail(source, cam.name, source.error)
                elif not self.args.overwrite and all(self._complete(key) for key in keys):
                    for key in keys:
                        self.rows[key] = dict(self.rows[key], status="skipped", error=None)
                        self.stats["skipped"] += 1
                else:
                    self.pending.setdefault(index, []).append(cam)

    # -- rows

    def _row(self, source: Source, method: str, label: str, **values) -> dict:
        row = dict.fromkeys(("target_id", "target_name", "target_probability", "predicted_id",
                             "predicted_name", "predicted_probability", "output", "maps", "error", "metrics",
                             "region"))
        row.update(input=source.input, method=method, layer=self.layers[method], target=label,
                   settings=self.settings[method], task=self.task)
        row.update(values)
        return row

    def _record(self, rows: list[dict]) -> None:
        for row in rows:
            self.rows[(row["input"], row["method"], row["target"])] = row
            self.stats[row["status"]] += 1
            if row["status"] == "failed" and row.get("output"):
                self._report_error(row["input"], f"{row['method']}: {row['error']}")

    def _fail(self, source: Source, method: str, error: str) -> None:
        self._record([self._row(source, method, label, status="failed", error=error)
                      for label in self.target.labels])

    def _report_error(self, where: str, error: str) -> None:
        tqdm.write(f"explain: failed: {where}: {error}", file=sys.stderr)

    def _save_reports(self, final: bool = False, summary: str = "") -> None:
        """Rewrite manifest.jsonl and index.html. Until the run completes, the manifest also
        keeps the earlier rows of outputs not redone yet, so that a killed run loses nothing."""
        start = time.monotonic()
        planned = [self.rows[key] for key in self.plan if key in self.rows]
        write_manifest(self.out_dir / MANIFEST, planned if final else list(self.rows.values()))
        table = self._metric_table(planned)
        write_index(self.out_dir, planned, summary or "in progress", format_summary(table, "html") if table else "")
        self.reports_written = time.monotonic()
        self.reports_cost = self.reports_written - start

    def _metric_table(self, rows: list[dict]) -> list[dict]:
        """The summary of the metric values of ``rows`` (mean ± std per method and column)."""
        if not self.metrics:
            return []
        return summary_table({"method": row["method"], "metric": column, "value": value}
                             for row in rows if row.get("status") in ("ok", "skipped")
                             for column, value in (row.get("metrics") or {}).items())

    def _scores(self, cam, images: Tensor, result) -> dict[tuple[int, int], dict]:
        """--metrics for one method's explanation of a batch: {(image, target rank): {column: value}};
        a metric that fails is reported and left out."""
        found = score(cam, images, result, self.metrics, options=self.metric_options, method=cam.name)
        for failure in found.failures:
            message = f"{cam.name} {failure['metric']}: {failure['error']}"
            if message not in self.reported:
                self.reported.add(message)
                self._report_error("--metrics", message)
        values: dict[tuple[int, int], dict] = {}
        for row in found.rows:
            values.setdefault((row["image"], row["rank"]), {})[row["metric"]] = round(row["value"], 6)
        return values

    def _maybe_save_reports(self) -> None:
        # Rewriting both files after every batch is cheap until they are large; this keeps
        # it under ~5 % of the run, and a kill loses at most the rows since the last write.
        if time.monotonic() - self.reports_written >= 20 * self.reports_cost:
            self._save_reports()

    # -- the loop

    def execute(self) -> int:
        self._make_plan()
        work = sorted(self.pending)
        args = self.args
        batch_size = 1 if self.loaded.fixed_batch else args.batch_size
        example = self.loaded.example
        loader = torch.utils.data.DataLoader(
            _Decode([self.sources[i].path for i in work], self.inputs.in_workers, 2 * max(example.shape[-2:])),
            batch_size=batch_size,
            num_workers=args.workers,
            collate_fn=_collate,
            pin_memory=self.loaded.device.type == "cuda",
            worker_init_fn=partial(_init_worker, args.max_pixels),
        )
        progress = tqdm(total=len(work), unit="img", disable=args.quiet or not work, file=sys.stderr, dynamic_ncols=True)
        saver = ThreadPoolExecutor(max_workers=max(1, args.workers), thread_name_prefix="explain-save")
        in_flight: deque[Future] = deque()
        stop = _StopFlag()
        heap = ReusedHeap()
        started = time.perf_counter()
        done = 0
        interrupted = completed = False
        try:
            with stop:
                self._save_reports()
                for batch in loader:
                    for index, error in batch.failures:
                        source = self.sources[work[index]]
                        self._report_error(source.input, error)
                        for cam in self.pending[work[index]]:
                            self._fail(source, cam.name, error)
                    for indices, images in batch.groups:
                        self._explain([work[i] for i in indices], images, saver, in_flight)
                    while in_flight and (in_flight[0].done() or len(in_flight) > 2 * batch_size * len(self.explainers)):
                        self._record(in_flight.popleft().result())
                    count = len(batch.failures) + sum(len(i) for i, _ in batch.groups)
                    done += count
                    progress.update(count)
                    self._maybe_save_reports()
                    heap.after_batch()
                    if stop.set:
                        interrupted = True
                        break
                while in_flight:
                    self._record(in_flight.popleft().result())
                completed = not interrupted
        except KeyboardInterrupt:
            interrupted = True
        finally:
            saver.shutdown(wait=True, cancel_futures=True)
            while in_flight:
                future = in_flight.popleft()
                if future.done() and not future.cancelled():
                    self._record(future.result())
            progress.close()
            summary = self._summary(done, time.perf_counter() - started, not completed)
            self._save_reports(final=completed, summary=summary)
        table = self._metric_table([self.rows[key] for key in self.plan if key in self.rows])
        if table:
            print(format_summary(table))
        print(summary)
        if interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if self.stats["failed"] else EXIT_OK

    def _explain(self, source_indices: list[int], images: Tensor, saver, in_flight: deque) -> None:
        model_input = self.inputs.model_input(images.to(self.loaded.device, non_blocking=True))
        pictures = self.inputs.pictures(images, model_input)
        cams = [cam for cam in self.explainers if any(cam in self.pending[i] for i in source_indices)]
        # One bad batch must not end the run, nor one method fail the others. The CAMs share
        # one forward and backward pass; the other methods run, and may fail, on their own.
        targets, topk = self.target.targets, self.target.topk
        shared = [cam for cam in cams if isinstance(cam, BaseCAM)]
        outcome: dict = {}
        try:
            outcome.update(zip(shared, explain_together(shared, model_input, targets, topk=topk)))
        except Exception:
            pass  # each CAM on its own, below, so that the error lands on the one that fails
        for cam in cams:
            if cam not in outcome:
                try:
                    outcome[cam] = cam(model_input, targets, topk=topk)
                except Exception as error:
                    outcome[cam] = error
        results = [outcome[cam] for cam in cams]
        for cam, result in zip(cams, results):
            if isinstance(result, Exception):
                for i in source_indices:
                    if cam in self.pending[i]:
                        self._report_error(self.sources[i].input, f"{cam.name}: {result}")
                        self._fail(self.sources[i], cam.name, f"{type(result).__name__}: {result}")
        done = [(cam, result) for cam, result in zip(cams, results) if not isinstance(result, Exception)]
        if not done:
            return
        best_probability, best_id = done[0][1].logits.float().softmax(dim=1).max(dim=1)
        best_probability, best_id = best_probability.cpu().tolist(), best_id.cpu().tolist()
        names = self.loaded.class_names
        for cam, result in done:
            scores = self._scores(cam, model_input, result) if self.metrics else {}
            maps, ids, probabilities = result.maps, result.targets, result.probabilities
            if maps.dim() == 3:
                maps, ids, probabilities = maps[:, None], ids[:, None], probabilities[:, None]
            maps, ids, probabilities = maps.cpu().numpy(), ids.cpu().tolist(), probabilities.cpu().tolist()
            one_target = result.targets.dim() == 1  # raw then lacks the targets' axis
            raw = {name: (r[:, None] if one_target else r).cpu().numpy() for name, r in result.raw_layers.items()}
            for j, i in enumerate(source_indices):
                if cam not in self.pending[i]:
                    continue
                source = self.sources[i]
                prefix = f"{source.folder}/{source.stem}" if source.folder else source.stem
                rows = [
                    self._row(
                        source, cam.name, label,
                        target_id=class_id, target_name=names[class_id],
                        target_probability=round(probability, 6),
                        predicted_id=best_id[j], predicted_name=names[best_id[j]],
                        predicted_probability=round(best_probability[j], 6),
                        output=f"{prefix}__{_safe(cam.name)}__{class_id}-{_safe(names[class_id])}.png",
                        maps=f"{prefix}__{_safe(cam.name)}.npz" if self.args.save_maps else None,
                        metrics=scores.get((j, rank)),
                    )
                    for rank, (label, class_id, probability) in enumerate(zip(self.target.labels, ids[j], probabilities[j]))
                ]
                npz = None
                if self.args.save_maps:
                    npz = {"maps": maps[j], "targets": np.asarray(ids[j])}
                    npz.update({f"raw_{name}": r[j] for name, r in raw.items()})
                in_flight.append(saver.submit(
                    _write_outputs, self.out_dir, pictures[j], maps[j], rows, npz,
                    self.args.signed_cmap if result.signed else self.args.cmap, self.args.alpha, result.signed,
                ))

    def _summary(self, images: int, elapsed: float, interrupted: bool) -> str:
        ok, skipped, failed = self.stats["ok"], self.stats["skipped"], self.stats["failed"]
        rate = images / elapsed if elapsed > 0 else 0.0
        text = (
            f"explain: {ok} ok, {skipped} skipped (already complete), {failed} failed; "
            f"{images} images in {elapsed:.1f} s ({rate:.2f} images/s); "
            f"see {self.out_dir / 'index.html'} and {self.out_dir / MANIFEST}"
        )
        if interrupted:
            text = "explain: interrupted, run the same command again to finish. " + text[len("explain: "):]
        return text


class _TaskRun(_Run):
    """One ``explain run`` of a segmentation or detection model.

    Each batch runs the model once to read its targets: per image, the class and region of
    the --target (:class:`~explain.tasks.SegmentationTarget`), or the boxes it selects
    (:meth:`~explain.tasks.DetectionTarget.select`), each box explained on its own copy of
    the image. An output is named after its class (segment) or its box (``box3``, the box's
    index in the detector's output), its overlay draws the region's outline or the box, and
    its manifest row records the region or the box (``region``). As the boxes are known only
    once the detector has run, an image's outputs enter the plan when they are made; a
    finished image is known by its rows with the same settings.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.task = self.loaded.task
        self.in_plan: set[tuple] = set()

    def _keys(self, source: Source, method: str) -> list[tuple]:
        if self.task == "detect":
            found = [key for key, row in self.rows.items() if key[:2] == (source.input, method)
                     and row.get("task") == "detect" and row.get("region") and row.get("settings") == self.settings[method]]
            if found:
                return found
        return super()._keys(source, method)

    def _make_plan(self) -> None:
        for index, source in enumerate(self.sources):
            for cam in self.explainers:
                keys = self._keys(source, cam.name)
                if source.error:
                    self._fail(source, cam.name, source.error)
                elif not self.args.overwrite and all(self._complete(key) for key in keys):
                    for key in keys:
                        self._record([dict(self.rows[key], status="skipped", error=None)])
                else:
                    self.pending.setdefault(index, []).append(cam)

    def _record(self, rows: list[dict]) -> None:
        for row in rows:
            key = (row["input"], row["method"], row["target"])
            if key not in self.in_plan:
                self.in_plan.add(key)
                self.plan.append(key)
        super()._record(rows)

    def _explain(self, source_indices: list[int], images: Tensor, saver, in_flight: deque) -> None:
        model, names = self.loaded.model, self.loaded.class_names
        model_input = self.inputs.model_input(images.to(self.loaded.device, non_blocking=True))
        pictures = self.inputs.pictures(images, model_input)
        cams = [cam for cam in self.explainers if any(cam in self.pending[i] for i in source_indices)]

        def fail(positions, cam, error: str) -> None:
            for j in positions:
                if cam in self.pending[source_indices[j]]:
                    self._report_error(self.sources[source_indices[j]].input, f"{cam.name}: {error}")
                    self._fail(self.sources[source_indices[j]], cam.name, error)

        try:
            target, owners, records, marks, predicted = self._targets(model, model_input)
        except Exception as error:  # the model or the target fails on this batch
            for cam in cams:
                fail(range(len(source_indices)), cam, f"{type(error).__name__}: {error}")
            return
        # Boxes are explained --batch-size rows at a time: an image can hold hundreds.
        step = len(owners) if self.task == "segment" else self.args.batch_size
        outcome: dict = {cam: [] for cam in cams}  # per CAM: (maps, raw layers) per chunk, or the error
        for start in range(0, len(owners), max(step, 1)):
            rows = list(range(start, min(start + step, len(owners))))
            if self.task == "segment":
                chunk, batch = target, model_input
            else:
                chunk = target.subset(rows)
                batch = model_input[chunk.image_ids.to(model_input.device)]
            for cam, result in zip(cams, self._explain_rows(cams, batch, chunk)):
                if isinstance(outcome[cam], Exception):
                    continue
                if isinstance(result, Exception):
                    outcome[cam] = result
                    continue
                if self.task == "detect":
                    result = crop_padding(result, model)
                outcome[cam].append((result.maps.cpu().numpy(), {n: r.cpu().numpy() for n, r in result.raw_layers.items()}))
        empty = [j for j in range(len(source_indices)) if j not in owners]
        for cam in cams:
            fail(empty, cam, f"no detected box matches --target {self.target.labels[0]}")
            if isinstance(outcome[cam], Exception):
                fail(sorted(set(owners)), cam, f"{type(outcome[cam]).__name__}: {outcome[cam]}")
                continue
            if not outcome[cam]:
                continue
            maps = np.concatenate([maps for maps, _ in outcome[cam]])
            raw = {name: np.concatenate([layers[name] for _, layers in outcome[cam]]) for name in outcome[cam][0][1]}
            for j in sorted(set(owners)):
                i = source_indices[j]
                if cam not in self.pending[i]:
                    continue
                source = self.sources[i]
                prefix = f"{source.folder}/{source.stem}" if source.folder else source.stem
                mine = [r for r, owner in enumerate(owners) if owner == j]
                rows = []
                for r in mine:
                    record = records[r]
                    name = _class_name(names, record["class_id"])
                    label = f"box{record['index']}" if self.task == "detect" else self.target.labels[0]
                    what = f"{label if self.task == 'detect' else record['class_id']}-{_safe(name)}"
                    best_id, best_probability = predicted[j]
                    rows.append(self._row(
                        source, cam.name, label, target_id=record["class_id"], target_name=name,
                        target_probability=record["probability"],
                        predicted_id=best_id, predicted_name=None if best_id is None else _class_name(names, best_id),
                        predicted_probability=best_probability,
                        output=f"{prefix}__{_safe(cam.name)}__{what}.png",
                        maps=f"{prefix}__{_safe(cam.name)}.npz" if self.args.save_maps else None,
                        region={key: value for key, value in record.items()
                                if key not in ("task", "class_id", "class_name", "probability")},
                    ))
                npz = None
                if self.args.save_maps:
                    npz = {"maps": maps[mine], "targets": np.asarray([records[r]["class_id"] for r in mine])}
                    npz.update({f"raw_{name}": r[mine] for name, r in raw.items()})
                in_flight.append(saver.submit(
                    _write_outputs, self.out_dir, pictures[j], maps[mine], rows, npz, self.args.cmap, self.args.alpha,
                    False, [marks[r] for r in mine],
                ))

    @staticmethod
    def _explain_rows(cams: list, batch: Tensor, target) -> list:
        """Each CAM's explanation of ``batch`` (or the error it raised): together, sharing
        their passes, or where that fails, each on its own so that the error lands on the one
        that fails."""
        try:
            return explain_together(cams, batch, target)
        except Exception:
            pass
        results = []
        for cam in cams:
            try:
                results.append(cam(batch, target))
            except Exception as error:
                results.append(error)
        return results

    def _targets(self, model: nn.Module, images: Tensor):
        """The batch's targets from one pass of the model: the target, the image of each of
        its rows, each row's record (class, region or box, probability) and overlay marks,
        and each image's prediction (class id, probability)."""
        names = self.loaded.class_names
        with preserved_state(model), torch.no_grad():
            output = model(images)
        n = len(images)
        if self.task == "segment":
            target = self.target.targets.resolve(output)
            probabilities = target.probabilities(output).tolist()
            records = [dict(target.describe(j, names), probability=_rounded(probabilities[j])) for j in range(n)]
            marks = [{"outline": target.mask[j if len(target.mask) > 1 else 0].cpu().numpy()} for j in range(n)]
            top = SegmentationTarget().resolve(output)
            best = top.probabilities(output).tolist()
            predicted = [(top.describe(j)["class_id"], _rounded(best[j])) for j in range(n)]
            return target, list(range(n)), records, marks, predicted
        target = DetectionTarget.select(output, **self.target.select)
        records = [dict(d.describe(names), probability=_rounded(d.score)) for d in target.detections]
        marks = [{"boxes": [d.box], "labels": [f"{_class_name(names, d.label)} {d.score:.2f}"]} for d in target.detections]
        tops = {d.image: (d.label, _rounded(d.score)) for d in DetectionTarget.select(output).detections}
        predicted = [tops.get(j, (None, None)) for j in range(n)]
        return target, target.image_ids.tolist(), records, marks, predicted


def _rounded(value: float | None) -> float | None:
    return None if value is None or value != value else round(float(value), 6)


# --------------------------------------------------------------------------- metrics


def parse_metrics(text: str, with_regions: bool = False, flag: str = "--metrics") -> list[str]:
    """Metric names from a comma-separated list or ``all`` (every metric, the localisation
    ones only ``with_regions``); unknown names and localisation metrics without regions are
    usage errors that say what to pass."""
    if text.strip().lower() == "all":
        return [name for name, spec in METRICS.items() if with_regions or spec.needs != "regions"]
    names = []
    for part in (p for p in text.split(",") if p.strip()):
        try:
            names.append(metric(part).name)
        except ValueError as error:
            raise UsageError(f"{flag}: {error}") from None
    if not names:
        raise UsageError(f"{flag} is empty; known metrics: {', '.join(METRICS)}")
    needing = [name for name in names if name in LOCALISATION]
    if needing and not with_regions:
        raise UsageError(f"{flag} {','.join(needing)}: these metrics need the objects' regions; pass --regions FILE "
                         "(a CSV of boxes image,x0,y0,x1,y1 in model-input pixels, or a folder of masks)")
    return list(dict.fromkeys(names))


def _metric_options(metrics: list[str], step: int | None) -> dict[str, dict]:
    if step is None:
        return {}
    if not any(name in STEP_METRICS for name in metrics):
        raise UsageError(f"--step applies to none of the metrics {', '.join(metrics)}; it sets the pixels per step "
                         f"of {', '.join(STEP_METRICS)}")
    return {name: {"step": step} for name in metrics if name in STEP_METRICS}


def _mask_geometry(preprocess):
    """The resizing and cropping of ``preprocess`` with nearest-neighbour resampling, for
    masks drawn on the original images; None where the preprocessing is not made of them."""
    nearest = transforms.InterpolationMode.NEAREST
    if _is_torchvision_classification_preset(preprocess):
        return transforms.Compose([transforms.Resize(preprocess.resize_size, nearest),
                                   transforms.CenterCrop(preprocess.crop_size)])
    if not isinstance(preprocess, transforms.Compose):
        return None
    steps = []
    for step in preprocess.transforms:
        if type(step) is transforms.Resize:
            steps.append(transforms.Resize(step.size, nearest, max_size=step.max_size))
        elif type(step) is transforms.CenterCrop:
            steps.append(step)
        elif type(step) not in (transforms.ToTensor, transforms.PILToTensor, transforms.Normalize,
                                transforms.ConvertImageDtype):
            return None
    return transforms.Compose(steps)


def _save_figure(path: Path, figure) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    atomic_write(path, buffer.getvalue())


class _Evaluate:
    """One ``explain evaluate``: plans which (image, method, metric) scores are missing from
    scores.csv, computes them batch by batch, appends them, and rebuilds the summary."""

    def __init__(self, args, out_dir, sources, loaded, target, explainers, metrics, options, regions):
        self.args, self.out_dir, self.sources, self.loaded = args, out_dir, sources, loaded
        self.target, self.metrics, self.options, self.regions = target, metrics, options, regions
        self.explainers = {cam.name: cam for cam in explainers}
        self.layers = {cam.name: ",".join(cam.layer_names(loaded.example)) for cam in explainers}
        self.metric_of = {column: name for name, spec in METRICS.items() for column in spec.columns}
        self.inputs = _Inputs(loaded.preprocess)
        self.scores_path, self.curves_path = out_dir / evaluation_files.SCORES, out_dir / evaluation_files.CURVES
        self.pending: dict[int, dict[str, list[str]]] = {}  # source index -> method -> metrics to compute
        self.failures: list[dict] = []
        self.reported: set[str] = set()
        self.stats = {"computed": 0, "skipped": 0, "failed": 0}

    def _settings(self, method: str, name: str) -> str:
        text = f"model={self.args.model} weights={self.args.weights or '-'} layer={self.layers[method]}"
        if "step" in self.options.get(name, {}):
            text += f" step={self.options[name]['step']}"
        if name in LOCALISATION:
            text += f" regions={self.args.regions}"
        return text

    # -- files

    def _compact(self) -> list[dict]:
        """Rewrite scores.csv and curves.jsonl with the latest row of each key; returns the scores."""
        rows = evaluation_files.latest(evaluation_files.read_csv(self.scores_path), ("image", "method", "target", "metric"))
        evaluation_files.rewrite(self.scores_path, evaluation_files.csv_lines(rows, evaluation_files.SCORE_FIELDS, header=True))
        curves = evaluation_files.latest(evaluation_files.read_jsonl(self.curves_path),
                                         ("image", "method", "target", "metric", "curve"))
        evaluation_files.rewrite(self.curves_path, evaluation_files.jsonl_lines(curves))
        self.curves = curves
        return rows

    # -- planning

    def _make_plan(self, rows: list[dict]) -> None:
        done = {(r.get("image"), r.get("method"), r.get("target"), r.get("metric"), r.get("settings")) for r in rows}
        for index, source in enumerate(self.sources):
            for method in self.explainers:
                for name in self.metrics:
                    settings = self._settings(method, name)
                    complete = all((source.input, method, label, column, settings) in done
                                   for label in self.target.labels for column in METRICS[name].columns)
                    if source.error:
                        self._fail([index], method, [name], source.error, per_image=True)
                    elif name in LOCALISATION and self.regions[index] is None:
                        self._fail([index], method, [name], f"no region for this image in {self.args.regions}",
                                   per_image=True)
                    elif complete and not self.args.overwrite:
                        self.stats["skipped"] += 1
                    else:
                        self.pending.setdefault(index, {}).setdefault(method, []).append(name)

    # -- recording

    def _fail(self, indices: list[int], method: str, names: list[str], error: str, per_image: bool = False) -> None:
        for index in indices:
            for name in names:
                self.failures.append({"image": self.sources[index].input, "method": method, "metric": name,
                                      "error": error})
                self.stats["failed"] += 1
            message = f"{self.sources[index].input}: {error}" if per_image else f"{method} {', '.join(names)}: {error}"
            if message not in self.reported:  # a method's or metric's error once, an image's once per image
                self.reported.add(message)
                tqdm.write(f"explain: failed: {message}", file=sys.stderr)

    def _record(self, indices: list[int], wanted: dict[str, list[str]], found) -> tuple[str, str]:
        """Failures noted; the new rows of scores.csv and curves.jsonl as text."""
        for failure in found.failures:
            names = wanted[failure["method"]] if failure["metric"] is None else [failure["metric"]]
            self._fail(indices, failure["method"], names, failure["error"])
        names, labels = self.loaded.class_names, self.target.labels
        order = {name: i for i, name in enumerate(self.metrics)}
        methods = list(self.explainers)
        rows = []
        for row in found.rows:
            name = self.metric_of[row["metric"]]
            target_id = row["target_id"]
            rows.append({
                "image": self.sources[indices[row["image"]]].input, "method": row["method"],
                "target": labels[row["rank"]], "target_id": target_id,
                "target_name": names[target_id] if 0 <= target_id < len(names) else "",
                "metric": row["metric"], "value": row["value"], "layer": self.layers[row["method"]],
                "settings": self._settings(row["method"], name),
                "_order": (row["image"], methods.index(row["method"]), order[name]),
            })
        rows.sort(key=lambda r: r.pop("_order"))
        self.stats["computed"] += len({(r["image"], r["method"], self.metric_of[r["metric"]]) for r in rows})
        curves = [
            {"image": self.sources[indices[c["image"]]].input, "method": c["method"], "target": labels[c["rank"]],
             "target_id": c["target_id"], "metric": c["metric"], "curve": c["curve"],
             "settings": self._settings(c["method"], c["metric"]), "steps": c["steps"].tolist(),
             "values": c["values"].tolist(), "step_labels": list(c["step_labels"]) if c["step_labels"] else None}
            for c in found.curves
        ]
        return (evaluation_files.csv_lines(rows, evaluation_files.SCORE_FIELDS),
                evaluation_files.jsonl_lines(curves))

    # -- the loop

    def execute(self) -> int:
        self._make_plan(self._compact())
        work = sorted(self.pending)
        args = self.args
        batch_size = 1 if self.loaded.fixed_batch else args.batch_size
        loader = torch.utils.data.DataLoader(
            _Decode([self.sources[i].path for i in work], self.inputs.in_workers, 2 * max(self.loaded.example.shape[-2:])),
            batch_size=batch_size, num_workers=args.workers, collate_fn=_collate,
            pin_memory=self.loaded.device.type == "cuda", worker_init_fn=partial(_init_worker, args.max_pixels),
        )
        progress = tqdm(total=len(work), unit="img", disable=args.quiet or not work, file=sys.stderr, dynamic_ncols=True)
        stop = _StopFlag()
        heap = ReusedHeap()
        started = time.perf_counter()
        done = 0
        interrupted = False
        try:
            with stop:
                for batch in loader:
                    for index, error in batch.failures:
                        source_index = work[index]
                        for method, names in self.pending[source_index].items():
                            self._fail([source_index], method, names, error, per_image=True)
                    texts = [self._evaluate([work[i] for i in indices], images) for indices, images in batch.groups]
                    evaluation_files.append_lines(self.scores_path, "".join(t[0] for t in texts))
                    evaluation_files.append_lines(self.curves_path, "".join(t[1] for t in texts))
                    count = len(batch.failures) + sum(len(i) for i, _ in batch.groups)
                    done += count
                    progress.update(count)
                    heap.after_batch()
                    if stop.set:
                        interrupted = True
                        break
        except KeyboardInterrupt:
            interrupted = True
        finally:
            progress.close()
            elapsed = time.perf_counter() - started
            self._report(done, elapsed, interrupted)
        if interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if self.stats["failed"] else EXIT_OK

    def _evaluate(self, indices: list[int], images: Tensor) -> tuple[str, str]:
        """Score one decoded group; images with the same work to do are scored together."""
        model_input = self.inputs.model_input(images.to(self.loaded.device, non_blocking=True))
        groups: dict[tuple, list[int]] = {}
        for position, index in enumerate(indices):
            key = tuple((method, tuple(names)) for method, names in self.pending[index].items())
            groups.setdefault(key, []).append(position)
        texts = []
        for key, positions in groups.items():
            wanted = {method: list(names) for method, names in key}
            members = [indices[p] for p in positions]
            regions = None
            if any(name in LOCALISATION for names in wanted.values() for name in names):
                regions = torch.stack([self.regions[i] for i in members]).to(self.loaded.device)
            found = evaluate(self.explainers, model_input[positions], wanted, targets=self.target.targets,
                             topk=self.target.topk, regions=regions, options=self.options)
            texts.append(self._record(members, wanted, found))
        return "".join(t[0] for t in texts), "".join(t[1] for t in texts)

    def _report(self, images: int, elapsed: float, interrupted: bool) -> None:
        """Rewrite the files from every row, draw the plots, print the summary."""
        rows = self._compact()
        out = self.out_dir
        evaluation_files.rewrite(out / evaluation_files.FAILURES,
                                 evaluation_files.csv_lines(self.failures, evaluation_files.FAILURE_FIELDS, header=True))
        table = summary_table(rows)
        evaluation_files.rewrite(out / "summary.csv",
                                 evaluation_files.csv_lines(table, evaluation_files.SUMMARY_FIELDS, header=True))
        legend = "mean ± std over images and targets; the arrow says which way is better; best per column marked"
        evaluation_files.rewrite(out / "summary.md", f"{format_summary(table, 'markdown')}\n\n{legend} in bold.\n"
                                 if table else "No scores yet.\n")
        if table:
            plots = out / "plots"
            plots.mkdir(exist_ok=True)
            for name, figure in plot_curves(self.curves).items():
                _save_figure(plots / f"curves_{_safe(name)}.png", figure)
            _save_figure(plots / "summary.png", plot_summary(table))
            randomisation = plot_randomisation(self.curves)
            if randomisation is not None:
                _save_figure(plots / "randomisation.png", randomisation)
            print(format_summary(table))
            print(legend + " with *.")
        computed, skipped, failed = self.stats["computed"], self.stats["skipped"], self.stats["failed"]
        rate = images / elapsed if elapsed > 0 else 0.0
        text = (f"explain: {computed} scored, {skipped} skipped (already in {evaluation_files.SCORES}), {failed} failed "
                f"(image x method x metric); {images} images in {elapsed:.1f} s ({rate:.2f} images/s); "
                f"see {out / 'summary.md'}, {out / evaluation_files.SCORES} and {out / 'plots'}")
        if interrupted:
            text = "explain: interrupted, run the same command again to finish. " + text[len("explain: "):]
        print(text)


def evaluate_command(args) -> int:
    out_dir: Path = args.out
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file; pass a folder")
    metrics = parse_metrics(args.metrics, with_regions=args.regions is not None)
    if args.regions is not None:
        if not args.regions.exists():
            raise UsageError(f"--regions {args.regions}: no such file or folder")
        if not any(name in LOCALISATION for name in metrics):
            raise UsageError(f"--regions is read only by {', '.join(LOCALISATION)}; add one of them to --metrics")
    options = _metric_options(metrics, args.step)
    sources = collect_inputs(args.inputs, out_dir)
    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    if loaded.task != "classify":
        raise UsageError(f"explain evaluate scores classifiers; {args.model} is a {loaded.task} model, which "
                         f"`explain run --task {loaded.task}` explains")
    if args.workers is None:
        args.workers = default_workers(loaded.device)
    target = parse_target(args.target, loaded.class_names)
    explainers = build_explainers(args.methods, loaded, args.layer, target)
    regions = [None] * len(sources)
    if args.regions is not None:
        try:
            regions = read_regions(args.regions, [s.path for s in sources], tuple(loaded.example.shape[-2:]),
                                   _mask_geometry(loaded.preprocess))
        except ValueError as error:
            raise UsageError(f"--regions: {error}") from None
    _warn_if_random(loaded, args.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _sole_run(out_dir, "evaluate"), _pixel_limit(args.max_pixels):
        remove_temp_files(out_dir)
        return _Evaluate(args, out_dir, sources, loaded, target, explainers, metrics, options, regions).execute()


def _warn_if_random(loaded: LoadedModel, model: str) -> None:
    if loaded.random_weights:
        print(f"explain: warning: {model} has random weights, so its maps explain an untrained model; "
              "pass --weights FILE (a state dict) or --weights DEFAULT (torchvision's, downloads)", file=sys.stderr)


# --------------------------------------------------------------------------- other commands


def methods_command(args) -> int:
    described = describe_methods()
    rows = [("method", "family", "layer", "cost per image and target", "")]
    rows += [(name, info["family"], "yes" if info["needs_layer"] else "-", info["cost"], info["description"])
             for name, info in described.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4])
    return EXIT_OK


def layers_command(args) -> int:
    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    infos = candidate_layers(loaded.model, loaded.example)
    if not infos:
        raise UsageError(f"{args.model} has no layer with a spatial (N, C, H, W) output")
    try:
        if loaded.task == "classify":
            auto = find_target_layer(loaded.model, loaded.example)
        else:
            auto = task_models.backbone_layer(loaded.model, loaded.example)
    except ValueError:
        auto = None
    name_width = max(len(info.name) for info in infos)
    type_width = max(len(info.module_type) for info in infos)
    print(f"  {'layer':<{name_width}}  {'type':<{type_width}}  output shape")
    for info in infos:
        mark = "*" if info.name == auto else " "
        shape = "x".join(map(str, info.shape[1:]))
        suffix = "  <- auto" if info.name == auto else ""
        print(f"{mark} {info.name:<{name_width}}  {info.module_type:<{type_width}}  {shape}{suffix}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
