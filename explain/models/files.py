"""Model files: state dicts (``.safetensors`` or ``torch.load``-able), programs saved with
``torch.export``, and pickled ``nn.Module`` objects, with what can go wrong reading them
said in words."""

from __future__ import annotations

import logging
import pickle
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import Option, UsageError, is_out_of_memory
from ..options import MODEL_FILE_SUFFIXES

#: The options the messages here name (see :class:`~explain.errors.Option`).
MODEL, WEIGHTS = Option("model"), Option("weights")

__all__ = ["MODEL_FILE_SUFFIXES", "read_model_file", "read_state_dict"]


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """The tensors of a state-dict file: ``.safetensors``, or anything ``torch.load`` reads with
    ``weights_only=True`` (a checkpoint's ``"state_dict"`` entry is taken). A file that is
    neither, or holds other Python objects, is a ``ValueError`` that names it; such a file is
    never loaded with ``weights_only=False``, which would run code from it."""
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path)
        with warnings.catch_warnings():  # a foreign file's first byte reads as an unknown pickle protocol
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        if is_out_of_memory(error):  # the machine's limit, not a damaged file: the caller says so
            raise
        if "Unsupported global" in str(error):
            raise ValueError(
                f"weights file {path} holds pickled Python objects besides tensors (a whole model, or a "
                "training checkpoint with its optimizer?), which are not loaded: unpickling runs code from "
                "the file. Save model.state_dict() with torch.save or safetensors and pass that file"
            ) from None
        # The unpickler's own errors (KeyError: 101, ...) say nothing to a reader.
        detail = "" if isinstance(error, (KeyError, EOFError, pickle.UnpicklingError)) else f" ({_in_brief(error)})"
        raise ValueError(
            f"cannot read weights file {path}: not a state dict saved by torch.save or "
            f"safetensors, or a damaged one{detail}"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict (got {type(state).__name__})")
    return state


def read_model_file(path: Path, trust: bool) -> tuple[nn.Module, tuple[int, int]]:
    """A module and its input size (H, W) from a .pt2 export or a pickled nn.Module (loaded
    only with ``trust``: unpickling runs code from the file). Any failure is a
    :class:`~explain.errors.UsageError` that names the file and what to do."""
    try:
        return _read_model_file(path, trust)
    except UsageError:
        raise
    except Exception as error:  # a corrupt or foreign file: say which, not a traceback
        if is_out_of_memory(error):  # the machine's limit, not a damaged file: the caller says so
            raise
        raise UsageError(f"cannot load model file {path}: {_in_brief(error)}") from None


def _read_model_file(path: Path, trust: bool) -> tuple[nn.Module, tuple[int, int]]:
    names = []
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    if any(name.endswith("/archive_format") for name in names):
        with _export_log_kept() as logged:  # torch.export logs the cause, then raises a vaguer error
            try:
                program = torch.export.load(path)
            except Exception:
                causes = [record.exc_info[1] for record in logged if record.exc_info and record.exc_info[1]]
                if not causes:
                    raise
                raise causes[0] from None
        return torch.export.unflatten(program), _exported_input_size(program)
    if any("/code/" in name or name.endswith("constants.pkl") for name in names):
        raise UsageError(
            f"{path} is a TorchScript file; Grad-CAM needs hooks on the model's layers, which "
            "TorchScript does not support. Export the model with torch.export.save(torch.export.export("
            "model, (example,), dynamic_shapes=...), 'model.pt2') and pass the .pt2 file, or pass ",
            MODEL,
            " ARCH ",
            WEIGHTS,
            " state_dict.pth for a torchvision architecture",
        )
    try:
        with warnings.catch_warnings():  # a foreign file's first byte reads as an unknown pickle protocol
            warnings.simplefilter("ignore", UserWarning)
            loaded = torch.load(path, map_location="cpu", weights_only=not trust)
    except Exception as error:
        if is_out_of_memory(error):
            raise
        # weights_only loading names the first Python object it refuses; other failures
        # (not a torch file, cut short) are no reason to suggest trusting the file.
        if trust or "Unsupported global" not in str(error):
            detail = "" if "Weights only load failed" in str(error) else f" ({_in_brief(error)})"
            raise UsageError(f"cannot load {path}: not a PyTorch file, or a damaged one{detail}") from None
        raise UsageError(
            f"{path} holds pickled Python objects (a whole nn.Module?), and loading those runs "
            "code from the file. If you trust it, add ",
            Option("trust_model_file"),
            "; otherwise save model.state_dict() and pass ",
            MODEL,
            " ARCH ",
            WEIGHTS,
            " FILE, or export a .pt2 with torch.export",
        ) from None
    if isinstance(loaded, nn.Module):
        return loaded, (224, 224)
    if isinstance(loaded, dict):
        raise UsageError(
            f"{path} holds a state dict, not a model; name the architecture and pass the file as weights: ",
            MODEL,
            " resnet50 ",
            WEIGHTS,
            f" {path}",
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
            shape = tuple(getattr(node.meta.get("val"), "shape", ()))
            if len(shape) == 4 and all(isinstance(side, int) for side in shape[2:]):
                return int(shape[2]), int(shape[3])
            break
    return 224, 224
