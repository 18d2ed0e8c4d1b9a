"""``explain run --segments``: each image's segments, for the methods that score the caller's
segments (``Explainer.takes_segments``: occlusion, lime, kernelshap, ablation,
shapley-sampling, xrai), read from a folder of mask files or made by a segmentation model.

- ``--segments DIR``: one mask file per image, found by the image's stem: ``DIR/SUB/STEM``
  first (SUB: the image's subfolder under its folder argument, as its outputs mirror it),
  then ``DIR/STEM``, each ``.npy`` before ``.png``. A ``.npy`` holds a label image (H, W) of
  integers (one segment per value, 0 included; negative values: no segment) or masks
  (K, H, W) of booleans or 0/1, which may overlap; a ``.png`` holds a label image in one
  channel (modes L, P (the palette's indices), I;16, I, 1). A file at the image's own size
  goes through the model's resize and crop (nearest-neighbour), as the image did; a file at
  the model input's size is used as it is. Segments that the resizing leaves without a pixel
  get no score.
- ``--segments model:NAME`` (or ``model:NAME=WEIGHTS``, a state-dict file or DEFAULT): a
  segmentation model (any model ``--model`` takes whose output is (N, C, H, W) class
  logits, such as torchvision's fcn_resnet50, deeplabv3_mobilenet_v3_large or
  lraspp_mobilenet_v3_large) segments the model input's crop, normalised by its own
  preprocessing's mean and std, at that size; each class it predicts somewhere is a segment.

A segment is named in the manifest by its value (label images), its index (masks) or its class
name (a model). An image without usable segments (no file, a file that cannot be read or
does not fit) fails the rows of those methods with the reason; the other methods run.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torchvision import transforms

from ..drawing import normalization_of
from ..errors import Option, UsageError
from ..hooks import preserved_state
from ..model_tasks import segmentation_logits
from ..models import LoadedModel, load_model
from .decoding import mask_geometry
from .inputs import Source

__all__ = ["MASK_SUFFIXES", "MAX_SEGMENTS", "FolderSegments", "ImageSegments", "ModelSegments", "segment_source"]

#: The mask files of ``--segments DIR``, in the order they are looked for.
MASK_SUFFIXES = (".npy", ".png")
#: The most segments one image may have: each costs at least one pass of the model.
MAX_SEGMENTS = 4096
#: PNG modes that hold one label per pixel.
LABEL_MODES = ("1", "L", "P", "I", "I;16", "I;16B", "I;16L", "I;16N")
MODEL_PREFIX = "model:"
SEGMENTS = Option("segments")


@dataclass
class ImageSegments:
    """One image's segments at the model input's size, and each one's name in the manifest."""

    masks: Tensor  # (K, H, W) bool, on the CPU
    names: list[str]


def segment_source(spec: str, loaded: LoadedModel, trust: bool) -> FolderSegments | ModelSegments:
    """The segments ``--segments`` names, for images the model ``loaded`` explains; mistakes
    are :class:`UsageError` s."""
    size = (int(loaded.example.shape[-2]), int(loaded.example.shape[-1]))
    if spec.startswith(MODEL_PREFIX):
        name, _, weights = spec[len(MODEL_PREFIX) :].partition("=")
        if not name.strip():
            raise UsageError(SEGMENTS, " model:NAME names a segmentation model, e.g. model:lraspp_mobilenet_v3_large")
        segmenter = load_model(name.strip(), weights.strip() or None, trust, str(loaded.device))
        if segmenter.task != "segment" or segmenter.kind != "images":
            raise UsageError(
                SEGMENTS,
                f" {spec}: {name} is a {segmenter.task} model of {segmenter.kind}; name a segmentation model "
                "of images, whose output is (N, C, H, W) class logits (fcn_resnet50, deeplabv3_mobilenet_v3_large, "
                "lraspp_mobilenet_v3_large, or a model file)",
            )
        if segmenter.random_weights:
            print(
                f"explain: warning: the segmentation model {name} has random weights (seed 0), so its segments are "
                f"arbitrary; pass its weights: --segments model:{name}=FILE (a state dict) or =DEFAULT (downloads)",
                file=sys.stderr,
            )
        return ModelSegments(segmenter, size)
    folder = Path(spec)
    if not folder.is_dir():
        raise UsageError(
            SEGMENTS,
            f" {spec}: no such folder; give a folder of mask files named by the images' stems (.npy or "
            ".png), or model:NAME for a segmentation model's classes",
        )
    return FolderSegments(folder, loaded.preprocess, size)


class FolderSegments:
    """``--segments DIR``: each image's mask file, read and brought to the model input's size."""

    def __init__(self, folder: Path, preprocess, size: tuple[int, int]):
        self.folder, self.size = folder, size
        self.geometry = mask_geometry(preprocess, transforms.InterpolationMode.NEAREST_EXACT)

    def __call__(self, sources: list[Source], pictures: np.ndarray) -> list[ImageSegments | str]:
        """Each source's segments, or the reason it has none."""
        return [self.read(source) for source in sources]

    def candidates(self, source: Source) -> list[Path]:
        stem = Path(source.path).stem
        folders = [self.folder / source.folder, self.folder] if source.folder else [self.folder]
        return [folder / f"{stem}{suffix}" for folder in folders for suffix in MASK_SUFFIXES]

    def read(self, source: Source) -> ImageSegments | str:
        candidates = self.candidates(source)
        path = next((candidate for candidate in candidates if candidate.is_file()), None)
        if path is None:
            looked = ", ".join(map(str, candidates))
            return f"no mask file for this image in --segments {self.folder} (looked for {looked})"
        try:
            array = read_mask_file(path)
            return self.fitted(array, source)
        except ValueError as error:
            return f"mask file {path}: {error}"

    def fitted(self, array: np.ndarray, source: Source) -> ImageSegments:
        """The segments of a mask file's ``array`` (a label image or masks) at the model
        input's size."""
        height, width = array.shape[-2:]
        if (height, width) == image_size(source.path):
            if self.geometry is None:
                raise ValueError(
                    f"it is {width}x{height}, the image's size, and the model's preprocessing is no resize and crop "
                    f"that masks can follow; give masks at the model input's size, {self.size[1]}x{self.size[0]}"
                )
            fit = self.geometry
        elif (height, width) == self.size:
            fit = None
        else:
            shown = "x".join(map(str, image_size(source.path)[::-1]))
            raise ValueError(
                f"it is {width}x{height}; give masks at the image's size ({shown}) or at the model input's "
                f"({self.size[1]}x{self.size[0]})"
            )
        if array.ndim == 2:  # labels as their ranks, which resizing keeps exact
            values, ranks = np.unique(array, return_inverse=True)
            labels = torch.from_numpy(ranks.reshape(array.shape).astype(np.int32))[None]
            labels = labels if fit is None else fit(labels)
            kept = [r for r, value in enumerate(values.tolist()) if value >= 0]
            masks, names = labels == torch.tensor(kept).view(-1, 1, 1), [str(values[r]) for r in kept]
        else:
            masks = torch.from_numpy(np.ascontiguousarray(array) != 0)
            masks, names = masks if fit is None else fit(masks), [str(k) for k in range(len(array))]
        present = masks.flatten(1).any(dim=1)
        if not bool(present.any()):
            raise ValueError("no segment covers a pixel of the model input; label the image's pixels 0, 1, 2, ...")
        return ImageSegments(masks[present], [name for name, p in zip(names, present.tolist(), strict=True) if p])


def image_size(path: str) -> tuple[int, int]:
    """(height, width) of the image file at ``path``, from its header; (0, 0) if unreadable."""
    try:
        with Image.open(path) as image:
            return image.height, image.width
    except Exception:
        return 0, 0


def read_mask_file(path: Path) -> np.ndarray:
    """A mask file's array, checked: a label image (H, W) of integers, or masks (K, H, W) of
    booleans (0/1 values become booleans); a ``ValueError`` says what is wrong."""
    if path.suffix.lower() == ".npy":
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read it as a numpy array: {error}") from None
    else:
        array = _png_labels(path)
    if array.ndim not in (2, 3) or min(array.shape) == 0:
        raise ValueError(f"it holds an array of shape {array.shape}; give a label image (H, W) or masks (K, H, W)")
    limit = Image.MAX_IMAGE_PIXELS
    if limit and array.shape[-1] * array.shape[-2] > limit:
        shown = f"{array.shape[-1]}x{array.shape[-2]}"
        raise ValueError(f"its {shown} masks exceed the pixel limit ({limit}; --max-pixels sets it)")
    if array.ndim == 3 and len(array) > MAX_SEGMENTS:
        raise ValueError(f"it holds {len(array)} masks, over {MAX_SEGMENTS}; merge or drop segments")
    kind = array.dtype.kind
    if array.ndim == 2 and kind == "b" and path.suffix.lower() == ".npy":
        raise ValueError(
            "it holds one (H, W) boolean mask; save masks (K, H, W) (mask[None]) or a label image of integers"
        )
    if kind not in "biu":
        raise ValueError(
            f"it holds {array.dtype} values; save a label image of integers (np.int32) or masks of booleans"
        )
    array = np.asarray(array)
    if array.ndim == 3 and kind != "b" and bool(((array != 0) & (array != 1)).any()):
        raise ValueError("its (K, H, W) masks hold values other than 0 and 1; save booleans (masks > 0)")
    if array.ndim == 2 and len(np.unique(array)) > MAX_SEGMENTS:
        raise ValueError(f"its label image has over {MAX_SEGMENTS} values; merge segments")
    return array.astype(np.int64) if array.ndim == 2 else array


def _png_labels(path: Path) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                if image.mode not in LABEL_MODES:
                    raise ValueError(
                        f"it is a {image.mode} image; a label image has one channel (a grey, palette or 16-bit PNG), "
                        "or save the labels as .npy"
                    )
                return np.asarray(image).astype(np.int64)
    except (OSError, Image.DecompressionBombWarning, Image.DecompressionBombError) as error:
        raise ValueError(f"cannot read it as an image: {error}") from None


class ModelSegments:
    """``--segments model:NAME``: the classes a segmentation model predicts on the model input."""

    def __init__(self, segmenter: LoadedModel, size: tuple[int, int]):
        self.segmenter, self.size = segmenter, size
        try:
            self.mean, self.std = normalization_of(segmenter.preprocess)
        except ValueError:  # no normalisation: images in [0, 1]
            self.mean, self.std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        names = segmenter.class_names
        unique = len(set(names)) == len(names)
        self.names = [names[i] if unique and i < len(names) else str(i) for i in range(max(len(names), 1))]

    def __call__(self, sources: list[Source], pictures: np.ndarray) -> list[ImageSegments | str]:
        model, device = self.segmenter.model, self.segmenter.device
        images = torch.from_numpy(np.ascontiguousarray(pictures)).to(device).permute(0, 3, 1, 2).float() / 255
        images = transforms.functional.normalize(images, self.mean, self.std)
        with preserved_state(model), torch.no_grad():
            logits = segmentation_logits(model(images))
        if tuple(logits.shape[-2:]) != self.size:
            logits = F.interpolate(logits.float(), size=self.size, mode="bilinear", align_corners=False)
        labels = logits.argmax(dim=1).cpu()
        found: list[ImageSegments | str] = []
        for label in labels:
            ids = torch.unique(label)
            names = [self.names[i] if i < len(self.names) else str(i) for i in ids.tolist()]
            found.append(ImageSegments(label[None] == ids.view(-1, 1, 1), names))
        return found
