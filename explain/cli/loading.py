"""Loading the model to explain: names (torchvision, timm, Hugging Face folders, the bundled model),
exported programs and pickled modules, with the preprocessing and the task they imply."""

from __future__ import annotations

import logging
import os
import sys
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor, nn

from .. import models
from ..tasks import segmentation_logits
from ..tasks import models as task_models
from ..errors import UsageError

MODEL_FILE_SUFFIXES = (".pt", ".pth", ".pt2", ".ts", ".jit", ".pkl", ".bin", ".ckpt")


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
        # Random weights (a name without --weights) are drawn from a fixed seed, so that every
        # process of a run (the Ray engine's actors) and every rerun has the same model.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
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


def warn_if_random(loaded: LoadedModel, model: str) -> None:
    if loaded.random_weights:
        print(f"explain: warning: {model} has random weights (seed 0), so its maps explain an untrained model; "
              "pass --weights FILE (a state dict) or --weights DEFAULT (torchvision's, downloads)", file=sys.stderr)
