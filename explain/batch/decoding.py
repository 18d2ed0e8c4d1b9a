"""Decoding the images beside the model: the DataLoader stages of ``explain run`` and
``explain evaluate`` (and the Ray engine's decode tasks), the model's preprocessing split
between them and the model's device, and decoded images grouped into batches by shape."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torchvision import transforms

from ..drawing import denormalize, normalization_of
from ..images import ImageError, load_rgb
from .guards import set_pixel_limit


def default_workers(device: torch.device) -> int:
    """Decode processes for a run: on a GPU the CPU cores are free for decoding; on the CPU
    the model's threads already keep every core busy, and decoders beside them only compete.
    (On this project's 2-core machine: 46.5 images/s with 0 workers, 41.5 with 2.)"""
    cores = os.cpu_count() or 1
    if device.type != "cpu":
        return min(4, cores)
    return min(4, max(0, cores - torch.get_num_threads()))


class ModelInputs:
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
        elif is_torchvision_preset(preprocess):
            self.in_workers, self.uint8 = (
                transforms.Compose(
                    [
                        transforms.Resize(
                            preprocess.resize_size, preprocess.interpolation, antialias=preprocess.antialias
                        ),
                        transforms.CenterCrop(preprocess.crop_size),
                        transforms.PILToTensor(),
                    ]
                ),
                True,
            )

    def dataset(self, paths: list[str], example: Tensor) -> DecodedImages:
        """The images at ``paths``, decoded and preprocessed as the workers do."""
        return DecodedImages(paths, self.in_workers, draft_size(example))

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


#: Steps of a preprocessing that leave an image's framing as it is.
_NOT_FRAMING = (transforms.ToTensor, transforms.PILToTensor, transforms.Normalize, transforms.ConvertImageDtype)


def crop_zoom(preprocess) -> float | None:
    """How the model's crop frames an image, for the explorer (:class:`explain.viewer.PageRun`'s
    ``zoom``): ``s / c`` where the preprocessing resizes the shorter side to ``s`` and then cuts
    the centre ``c`` x ``c``; None for any other preprocessing.

    >>> crop_zoom(transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()]))
    1.1429
    >>> crop_zoom(transforms.Compose([transforms.Resize((224, 224)), transforms.ToTensor()])) is None
    True
    """
    if is_torchvision_preset(preprocess):
        resize, crop = preprocess.resize_size, preprocess.crop_size
    elif isinstance(preprocess, transforms.Compose):
        steps = [step for step in preprocess.transforms if type(step) not in _NOT_FRAMING]
        if [type(step) for step in steps] != [transforms.Resize, transforms.CenterCrop] or steps[0].max_size:
            return None
        resize, crop = steps[0].size, steps[1].size
    else:
        return None
    resize = resize[0] if isinstance(resize, (list, tuple)) and len(resize) == 1 else resize
    if isinstance(crop, (list, tuple)):
        crop = crop[0] if len(set(crop)) == 1 else None
    if not isinstance(resize, int) or not isinstance(crop, int) or not 0 < crop <= resize:
        return None
    return round(resize / crop, 4)


def mask_geometry(preprocess, interpolation=transforms.InterpolationMode.NEAREST):
    """The resizing and cropping of ``preprocess`` with nearest-neighbour resampling, for
    masks drawn on the original images (PIL images; tensors (..., H, W) with
    ``InterpolationMode.NEAREST_EXACT``, which picks PIL's pixels); None where the
    preprocessing is not made of them.

    >>> mask_geometry(transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()]))
    Compose(
        Resize(size=256, interpolation=nearest, max_size=None, antialias=True)
        CenterCrop(size=(224, 224))
    )
    """
    if is_torchvision_preset(preprocess):
        return transforms.Compose(
            [transforms.Resize(preprocess.resize_size, interpolation), transforms.CenterCrop(preprocess.crop_size)]
        )
    if not isinstance(preprocess, transforms.Compose):
        return None
    steps = []
    for step in preprocess.transforms:
        if type(step) is transforms.Resize:
            steps.append(transforms.Resize(step.size, interpolation, max_size=step.max_size))
        elif type(step) is transforms.CenterCrop:
            steps.append(step)
        elif type(step) not in _NOT_FRAMING:
            return None
    return transforms.Compose(steps)


def draft_size(example: Tensor) -> int:
    """The size JPEGs are drafted to while decoding: twice the model input's longer side."""
    return 2 * max(example.shape[-2:])


def pickled_decoding(inputs: ModelInputs, example: Tensor) -> bytes:
    """What Ray's decode tasks run (:func:`~explain.batch.ray_stages.decode_files`): the
    workers' part of the preprocessing and the draft size, pickled."""
    import cloudpickle

    return cloudpickle.dumps((inputs.in_workers, draft_size(example)))


def is_torchvision_preset(preprocess) -> bool:
    # weights.transforms(); its class lives in a private torchvision module, so match by name.
    kind = type(preprocess)
    return kind.__name__ == "ImageClassification" and kind.__module__.startswith("torchvision.")


class DecodedImages(torch.utils.data.Dataset):
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
class DecodedBatch:
    groups: list[tuple[list[int], Tensor]]  # (dataset indices, stacked images) per image shape
    failures: list[tuple[int, str]]

    def pin_memory(self) -> DecodedBatch:  # called by the DataLoader when pin_memory=True
        return DecodedBatch([(indices, images.pin_memory()) for indices, images in self.groups], self.failures)


def collate(items) -> DecodedBatch:
    """``(index, image or None, error or None)`` items as a batch: the images stacked per shape
    and dtype, the failures with their reasons."""
    by_shape: dict[tuple, list] = {}
    failures = []
    for index, tensor, error in items:
        if tensor is None:
            failures.append((index, error))
        else:
            by_shape.setdefault((tuple(tensor.shape), tensor.dtype), []).append((index, tensor))
    groups = [([i for i, _ in group], torch.stack([t for _, t in group])) for group in by_shape.values()]
    return DecodedBatch(groups, failures)


def init_worker(max_pixels, worker_id: int) -> None:
    """A DataLoader worker's start: Ctrl-C is the main process's business; the run's pixel limit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_pixel_limit(max_pixels)
