"""Finding and decoding the images: inputs from files, folders, globs and lists, their output
names, and the DataLoader stages that decode them beside the model."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision import transforms

from ..images import IMAGE_EXTENSIONS, ImageError, load_rgb
from ..overlay import denormalize, normalization_of
from .common import UsageError


def default_workers(device: torch.device) -> int:
    """Decode processes for a run: on a GPU the CPU cores are free for decoding; on the CPU
    the model's threads already keep every core busy, and decoders beside them only compete.
    (On this project's 2-core machine: 46.5 images/s with 0 workers, 41.5 with 2.)"""
    cores = os.cpu_count() or 1
    if device.type != "cpu":
        return min(4, cores)
    return min(4, max(0, cores - torch.get_num_threads()))


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
