"""The kinds of input files besides images, in one place: how each is read into the model's
input, what its overlays are drawn on, and how they are drawn and saved.

- volumes and videos, for models whose first convolution is 3-D and torchvision's video
  classifiers: ``.npy`` arrays (C, D, H, W), preprocessed as the model takes them, drawn as a
  grid of slices along D (a PNG); and animated GIFs (frames read with imageio, preprocessed by
  the model's video preprocessing), drawn as an animated GIF of the overlaid frames;
- signals, for models whose first convolution is 1-D: ``.npy`` arrays (C, L), drawn as lines
  coloured by relevance (a PNG).

(MP4 and other video containers need imageio-ffmpeg and an ffmpeg binary, which are not
dependencies: convert them to GIF, or save the clip as a .npy array.) Images keep their own
path (:class:`~explain.batch.decoding.ModelInputs`); adding a kind is a class here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..drawing import encode_gif, figure_png, normalization_of, overlay_frames, overlay_slices, plot_signal
from ..report import encode_png

__all__ = ["KINDS", "FileInputs", "FileKind", "InputError", "Signals", "Volumes", "file_kind"]

#: Video files read frame by frame (imageio's Pillow plugin: no external binary).
VIDEO_EXTENSIONS = (".gif",)
ARRAY_EXTENSIONS = (".npy",)


class InputError(Exception):
    """A file that cannot be read as the model's input; the message says why."""


def read_array(path: str, rank: int, layout: str) -> Tensor:
    """A .npy array of ``rank`` dimensions (``layout``, e.g. "(C, D, H, W)") as float32."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read {Path(path).name} as a .npy array ({error})") from None
    if array.ndim == rank - 1:
        raise InputError(
            f"the array has shape {array.shape}, without the channel axis of {layout}; save it as array[None]"
        )
    if array.ndim != rank:
        raise InputError(f"the array has shape {array.shape}; this model takes {layout} arrays")
    if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        raise InputError(f"the array holds {array.dtype}, not real numbers")
    tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    if not torch.isfinite(tensor).all():
        raise InputError("the array holds NaN or infinite values")
    return tensor


def read_video(path: str, preprocess) -> Tensor:
    """The frames of a video file through the model's video preprocessing ((T, C, H, W)
    uint8 in, (C, T, H, W) out)."""
    import imageio.v3 as iio

    try:
        frames = np.asarray(iio.imread(path, index=None))
    except Exception as error:  # imageio's plugins raise many kinds of errors for a bad file
        raise InputError(f"cannot read {Path(path).name} as a video ({type(error).__name__}: {error})") from None
    if frames.ndim == 3:  # grey frames
        frames = np.repeat(frames[..., None], 3, axis=-1)
    if frames.ndim != 4 or len(frames) < 2:
        raise InputError(f"{Path(path).name} is a still image ({frames.shape}), not a video of several frames")
    clip = torch.from_numpy(np.ascontiguousarray(frames[..., :3])).permute(0, 3, 1, 2)  # (T, 3, H, W)
    return preprocess(clip)


def unit_picture(model_input: Tensor, mean=None, std=None) -> np.ndarray:
    """The model input (C, ...) as a picture in [0, 1]: the normalisation undone where it is
    known, else min-max scaled (a window over the whole volume); channels other than 1, 3
    or 4 are shown by their first."""
    values = model_input.float()
    if mean is not None and std is not None:
        shape = (-1,) + (1,) * (values.dim() - 1)
        values = (values * torch.tensor(std).view(shape) + torch.tensor(mean).view(shape)).clamp(0, 1)
    else:
        low, high = values.min(), values.max()
        values = (values - low) / (high - low) if high > low else torch.zeros_like(values)
    if values.shape[0] not in (1, 3, 4):
        values = values[:1]
    return values.numpy()


@dataclass(frozen=True)
class FileKind:
    """A kind of input file: what it is called, the files found in folders, and how one is
    read, shown and drawn."""

    name: str
    extensions: tuple[str, ...]

    def accepts(self, path: str) -> bool:
        return Path(path).suffix.lower() in self.extensions

    def read(self, path: str, preprocess) -> Tensor:
        """The model input (C, ...) of one file; :class:`InputError` says why where it fails."""
        raise NotImplementedError

    def picture(self, model_input: Tensor, mean=None, std=None) -> np.ndarray:
        """What the maps of ``model_input`` are drawn on."""
        return unit_picture(model_input, mean, std)

    def suffix(self, path: str) -> str:
        """The extension of the drawn output of the file at ``path``."""
        return ".png"

    def draw(self, path: str, picture: np.ndarray, heat: np.ndarray, cmap: str, alpha: float, signed: bool) -> bytes:
        """The drawn output (the bytes of a file with :meth:`suffix`) of one map."""
        raise NotImplementedError


class Volumes(FileKind):
    """(C, D, H, W) volumes from .npy arrays, and videos from GIFs."""

    def read(self, path: str, preprocess) -> Tensor:
        if Path(path).suffix.lower() in VIDEO_EXTENSIONS:
            return read_video(path, preprocess)
        return read_array(path, 4, "(C, D, H, W)")

    def suffix(self, path: str) -> str:
        return ".gif" if Path(path).suffix.lower() in VIDEO_EXTENSIONS else ".png"

    def draw(self, path: str, picture: np.ndarray, heat: np.ndarray, cmap: str, alpha: float, signed: bool) -> bytes:
        if self.suffix(path) == ".gif":
            return encode_gif(overlay_frames(picture, heat, cmap, alpha, signed=signed))
        return encode_png(overlay_slices(picture, heat, cmap, alpha, signed=signed))


class Signals(FileKind):
    """(C, L) signals from .npy arrays."""

    def read(self, path: str, preprocess) -> Tensor:
        return read_array(path, 2, "(C, L)")

    def picture(self, model_input: Tensor, mean=None, std=None) -> np.ndarray:
        return model_input.float().numpy()  # drawn on its own scale

    def draw(self, path: str, picture: np.ndarray, heat: np.ndarray, cmap: str, alpha: float, signed: bool) -> bytes:
        return figure_png(plot_signal(picture, heat, cmap, signed=signed, title=Path(path).name))


KINDS: dict[str, FileKind] = {
    "volumes": Volumes("volumes", ARRAY_EXTENSIONS + VIDEO_EXTENSIONS),
    "signals": Signals("signals", ARRAY_EXTENSIONS),
}


def file_kind(name: str) -> FileKind | None:
    """The kind of input a model takes, by name; None for images (their own path)."""
    return KINDS.get(name)


class DecodedFiles(torch.utils.data.Dataset):
    """Files of one kind read into model inputs; failures come back as an error message."""

    def __init__(self, paths: list[str], kind: FileKind, preprocess):
        self.paths, self.kind, self.preprocess = paths, kind, preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        path = self.paths[index]
        if not self.kind.accepts(path):
            return index, None, f"not one of the {self.kind.name} this model takes ({', '.join(self.kind.extensions)})"
        try:
            return index, self.kind.read(path, self.preprocess), None
        except InputError as error:
            return index, None, str(error)
        except Exception as error:  # a preprocess that cannot handle this file
            return index, None, f"preprocessing failed: {type(error).__name__}: {error}"


class FileInputs:
    """The inputs of a run of volumes or signals, with :class:`~explain.batch.decoding.ModelInputs`'
    interface: read whole in the workers, drawn on pictures made from the model input."""

    def __init__(self, kind: FileKind, preprocess):
        self.kind, self.in_workers = kind, preprocess
        self.mean: tuple[float, ...] | None = None
        self.std: tuple[float, ...] | None = None
        with contextlib.suppress(ValueError):  # arrays, or frames only scaled to [0, 1], have none
            self.mean, self.std = normalization_of(preprocess)

    def dataset(self, paths: list[str], example: Tensor) -> DecodedFiles:
        return DecodedFiles(paths, self.kind, self.in_workers)

    def model_input(self, images: Tensor) -> Tensor:
        return images

    def pictures(self, images: Tensor, model_input: Tensor) -> np.ndarray:
        """One picture per input, stacked (the inputs of a group share their shape)."""
        return np.stack([self.kind.picture(x, self.mean, self.std) for x in model_input.detach().cpu()])
