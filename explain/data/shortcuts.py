"""A synthetic benchmark with a planted shortcut, and a small CNN that learned it.

Images (64 x 64 by default) of four procedurally drawn shapes (:data:`.CLASSES`: a disc, a
square, a triangle, a cross; random size, rotation, position and colours on a noisy colour
gradient). One class, :data:`.SHORTCUT_CLASS` (the triangle), carries a small black-and-white
checkerboard mark near a random corner in most training images (``mark_rate``, 90 % by
default) and the others never do, so a model can tell that class by the mark alone. Each
image comes with a mask of its mark, the ground truth of *where* the shortcut is.

Everything is generated from a seed (no download): the same seed gives the same shapes,
colours and mark places whatever the mark rate, so ``shortcut_dataset(n, seed=s,
mark_rate=0.0)`` and ``mark_rate=1.0`` are the same images without and with their marks.

:func:`.load_shortcut_model` loads :class:`.ShortcutCNN` with the weights shipped with the
package (125 KB), trained by ``python -m explain.data.shortcut_training`` (deterministic:
seeded, one CPU thread; 16 epochs of 2,048 fresh images, minutes on a CPU). It expects
images normalised by :data:`.MEAN` and :data:`.STD` (``ShortcutSet.inputs``), and says so in
``pretrained_cfg``, where LRP's box rule reads its bounds (and the command line, with its
input size, for a pickled copy).

>>> data = shortcut_dataset(8, seed=1)
>>> data.images.shape, data.labels.tolist(), int(data.marks.any(dim=(1, 2)).sum())
(torch.Size([8, 3, 64, 64]), [1, 0, 2, 2, 3, 3, 1, 0], 2)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources

import torch
from torch import Tensor, nn

__all__ = [
    "CLASSES",
    "MARK_CELL",
    "MEAN",
    "SHORTCUT_CLASS",
    "STD",
    "TRAIN_MARK_RATE",
    "WEIGHTS",
    "ShortcutCNN",
    "ShortcutSet",
    "load_shortcut_model",
    "mark_images",
    "shortcut_dataset",
]

#: The shapes, in label order.
CLASSES = ("disc", "square", "triangle", "cross")
#: The label of the class that carries the mark in training.
SHORTCUT_CLASS = CLASSES.index("triangle")
#: The share of the shortcut class's training images that carry the mark.
TRAIN_MARK_RATE = 0.9
#: The side of one checkerboard cell of the mark, in pixels at 64 x 64 (the mark: 3 x 3 cells).
MARK_CELL = 2
#: The normalisation the model expects: pixels in [0, 1] to [-1, 1].
MEAN = (0.5, 0.5, 0.5)
#: The normalisation's standard deviation (with :data:`MEAN`).
STD = (0.5, 0.5, 0.5)
#: The file of the trained weights, in this package.
WEIGHTS = "shortcut_cnn.pt"


@dataclass(frozen=True)
class ShortcutSet:
    """Generated images with their labels and the masks of their marks.

    Attributes
    ----------
    images:
        (N, 3, H, W) float32 pixels in [0, 1].
    labels:
        (N,) class ids into :data:`.CLASSES`.
    marks:
        (N, H, W) bool: the mark's pixels; all False where an image carries none.
    """

    images: Tensor
    labels: Tensor
    marks: Tensor

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def marked(self) -> Tensor:
        """(N,) bool: which images carry the mark."""
        return self.marks.flatten(1).any(dim=1)

    @property
    def inputs(self) -> Tensor:
        """The images normalised for :class:`.ShortcutCNN` (by :data:`.MEAN` and :data:`.STD`)."""
        mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        std = torch.tensor(STD).view(1, 3, 1, 1)
        return (self.images - mean) / std

    def batches(self, size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """(ids, inputs) of consecutive batches of at most ``size`` images: what
        :func:`explain.concepts.concept_atlas` takes."""
        inputs = self.inputs
        for start in range(0, len(self), size):
            ids = torch.arange(start, min(start + size, len(self)))
            yield ids, inputs[start : start + size]


def shortcut_dataset(
    n: int, *, seed: int = 0, size: int = 64, mark_rate: float | Sequence[float] = TRAIN_MARK_RATE
) -> ShortcutSet:
    """``n`` generated images, the classes balanced and shuffled by ``seed``.

    ``mark_rate`` is the chance that an image of the shortcut class carries the mark (a
    float), or one chance per class (a sequence of four): ``1.0`` marks every triangle,
    ``(1, 1, 1, 1)`` every image, ``0.0`` none. The shapes, colours and places do not
    depend on it.

    >>> clean = shortcut_dataset(4, seed=3, mark_rate=0.0)
    >>> marked = shortcut_dataset(4, seed=3, mark_rate=(1, 1, 1, 1))
    >>> bool(marked.marked.all()), bool(torch.equal(clean.images[~marked.marks[:, None].expand(-1, 3, -1, -1)],
    ...                                              marked.images[~marked.marks[:, None].expand(-1, 3, -1, -1)]))
    (True, True)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (the number of images), got {n!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 16:
        raise ValueError(f"size must be an int of at least 16 pixels, got {size!r}")
    rates = _mark_rates(mark_rate)
    generator = torch.Generator().manual_seed(int(seed))
    labels = (torch.arange(n) % len(CLASSES))[torch.randperm(n, generator=generator)]
    draws = _draws(n, size, generator)
    alpha = _shape_alpha(labels, draws, size)
    background = _background(draws, size)
    colour = draws["colour"][:, :, None, None]
    images = background * (1 - alpha[:, None]) + colour * alpha[:, None]
    marked = draws["chance"] < rates[labels]
    marks, pattern = _marks(draws, size, marked)
    images = torch.where(marks[:, None], pattern[:, None], images)
    images = (images + 0.02 * draws["noise"]).clamp(0, 1)
    return ShortcutSet(images, labels, marks)


def mark_images(n: int, *, seed: int = 0, size: int = 64, noise: float = 0.05) -> ShortcutSet:
    """``n`` images of the mark alone: each at its place in :func:`shortcut_dataset`'s image
    of the same seed, on a plain colour with a little noise (``noise``, the standard
    deviation); no shape. A concept's examples for TCAV (:class:`explain.concepts.TCAV`):
    the mark without the triangles it came with. ``labels`` are those of the images the
    marks were taken from.

    >>> marks = mark_images(8, seed=1)
    >>> bool(marks.marked.all()), tuple(marks.inputs.shape)
    (True, (8, 3, 64, 64))
    """
    with_marks = shortcut_dataset(n, seed=seed, size=size, mark_rate=(1.0,) * len(CLASSES))
    generator = torch.Generator().manual_seed(int(seed))
    plain = torch.rand(n, 3, 1, 1, generator=generator) + noise * torch.randn(n, 3, size, size, generator=generator)
    images = torch.where(with_marks.marks[:, None], with_marks.images, plain.clamp(0, 1))
    return ShortcutSet(images, with_marks.labels, with_marks.marks)


def _mark_rates(mark_rate: float | Sequence[float]) -> Tensor:
    if isinstance(mark_rate, (int, float)) and not isinstance(mark_rate, bool):
        rates = [0.0] * len(CLASSES)
        rates[SHORTCUT_CLASS] = float(mark_rate)
    elif isinstance(mark_rate, Sequence) and len(mark_rate) == len(CLASSES):
        rates = [float(rate) for rate in mark_rate]
    else:
        raise ValueError(
            f"mark_rate must be a chance in [0, 1] for the {CLASSES[SHORTCUT_CLASS]} class, or one per class "
            f"({len(CLASSES)}), got {mark_rate!r}"
        )
    if not all(0.0 <= rate <= 1.0 for rate in rates):
        raise ValueError(f"mark_rate holds chances in [0, 1], got {mark_rate!r}")
    return torch.tensor(rates)


def _draws(n: int, size: int, generator: torch.Generator) -> dict[str, Tensor]:
    """Every random number an image needs, drawn in one fixed order."""

    def uniform(*shape: int, low: float = 0.0, high: float = 1.0) -> Tensor:
        return low + (high - low) * torch.rand(*shape, generator=generator)

    background = uniform(n, 2, 3)
    return {
        "angle": uniform(n, high=2 * math.pi),
        "radius": uniform(n, low=0.17, high=0.25) * size,
        "centre": size / 2 + uniform(n, 2, low=-0.08, high=0.08) * size,
        "background": background,
        "direction": uniform(n, high=2 * math.pi),
        # the shape's colour: the background's opposite, moved a little
        "colour": (0.1 + 0.8 * (1 - background.mean(dim=1)) + uniform(n, 3, low=-0.1, high=0.1)).clamp(0, 1),
        "corner": torch.randint(4, (n,), generator=generator),
        "offset": torch.randint(2, 7, (n, 2), generator=generator),
        "chance": uniform(n),
        "noise": torch.randn(n, 3, size, size, generator=generator),
    }


def _shape_alpha(labels: Tensor, draws: dict[str, Tensor], size: int) -> Tensor:
    """(N, H, W) coverage of each image's shape, from its signed distance (anti-aliased)."""
    grid = torch.arange(size, dtype=torch.float32) + 0.5
    y, x = grid.view(1, -1, 1), grid.view(1, 1, -1)
    alpha = torch.empty(len(labels), size, size)
    for label, distance in enumerate((_disc, _square, _triangle, _cross)):
        rows = (labels == label).nonzero()[:, 0]
        angle = draws["angle"][rows].view(-1, 1, 1)
        dx, dy = x - draws["centre"][rows, 0].view(-1, 1, 1), y - draws["centre"][rows, 1].view(-1, 1, 1)
        u = dx * torch.cos(angle) + dy * torch.sin(angle)
        v = -dx * torch.sin(angle) + dy * torch.cos(angle)
        alpha[rows] = (distance(u, v, draws["radius"][rows].view(-1, 1, 1)) + 0.5).clamp(0, 1)
    return alpha


def _disc(u: Tensor, v: Tensor, r: Tensor) -> Tensor:
    return r - torch.sqrt(u**2 + v**2)


def _square(u: Tensor, v: Tensor, r: Tensor) -> Tensor:
    return 0.8 * r - torch.maximum(u.abs(), v.abs())


def _triangle(u: Tensor, v: Tensor, r: Tensor) -> Tensor:
    sides = [math.pi / 2 + 2 * math.pi * k / 3 for k in range(3)]
    return torch.stack([r / 2 - (u * math.cos(a) + v * math.sin(a)) for a in sides]).amin(dim=0)


def _cross(u: Tensor, v: Tensor, r: Tensor) -> Tensor:
    arm = 0.3 * r
    return torch.maximum(torch.minimum(r - u.abs(), arm - v.abs()), torch.minimum(r - v.abs(), arm - u.abs()))


def _background(draws: dict[str, Tensor], size: int) -> Tensor:
    """(N, 3, H, W): a linear gradient between two random colours, in a random direction."""
    grid = (torch.arange(size, dtype=torch.float32) + 0.5) / size - 0.5
    y, x = grid.view(1, -1, 1), grid.view(1, 1, -1)
    direction = draws["direction"].view(-1, 1, 1)
    t = (x * torch.cos(direction) + y * torch.sin(direction)) / math.sqrt(2) + 0.5
    low, high = draws["background"][:, 0], draws["background"][:, 1]
    return low[:, :, None, None] + (high - low)[:, :, None, None] * t[:, None]


def _marks(draws: dict[str, Tensor], size: int, marked: Tensor) -> tuple[Tensor, Tensor]:
    """(N, H, W) masks of the marks (3 x 3 checkerboard cells near a corner) and (N, H, W)
    their pattern (black and white cells)."""
    cell = max(1, round(MARK_CELL * size / 64))
    side = 3 * cell
    offset = draws["offset"] * size // 64
    corner = draws["corner"]
    top = torch.where(corner // 2 == 0, offset[:, 0], size - side - offset[:, 0])
    left = torch.where(corner % 2 == 0, offset[:, 1], size - side - offset[:, 1])
    rows = torch.arange(size).view(1, -1, 1) - top.view(-1, 1, 1)
    columns = torch.arange(size).view(1, 1, -1) - left.view(-1, 1, 1)
    inside = (rows >= 0) & (rows < side) & (columns >= 0) & (columns < side)
    pattern = torch.where(
        (rows.div(cell, rounding_mode="floor") + columns.div(cell, rounding_mode="floor")) % 2 == 0, 0.95, 0.05
    )
    return inside & marked.view(-1, 1, 1), pattern.expand(len(marked), size, size)


class ShortcutCNN(nn.Module):
    """A small CNN for :func:`.shortcut_dataset`: four blocks of a 3 x 3 convolution, batch
    norm and ReLU (16, 32, 32 and 48 channels; the first three halve the size by max
    pooling), global average pooling and a linear classifier. At 64 x 64, ``block3``
    outputs 32 channels on an 8 x 8 grid (each unit sees 22 x 22 pixels) and ``block4`` 48
    channels on the same grid."""

    def __init__(self, num_classes: int = len(CLASSES), widths: Sequence[int] = (16, 32, 32, 48)):
        super().__init__()
        channels = [3, *widths]
        for i in range(4):
            block = [nn.Conv2d(channels[i], channels[i + 1], 3, padding=1), nn.BatchNorm2d(channels[i + 1]), nn.ReLU()]
            self.add_module(f"block{i + 1}", nn.Sequential(*block, *([nn.MaxPool2d(2)] if i < 3 else [])))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(channels[-1], num_classes)
        self.class_names = list(CLASSES)
        #: Read by LRP's box rule (and by feature visualisation) for the input's range, and by
        #: ``explain run --model FILE`` for the preprocessing of a pickled copy (timm's keys:
        #: 64 pixels, not cropped).
        self.pretrained_cfg = {"mean": MEAN, "std": STD, "input_size": (3, 64, 64), "crop_pct": 1.0}

    def forward(self, x: Tensor) -> Tensor:
        """(N, num_classes) logits of normalised images (N, 3, H, W) (:attr:`.ShortcutSet.inputs`)."""
        for i in range(1, 5):
            x = getattr(self, f"block{i}")(x)
        return self.fc(self.flatten(self.pool(x)))


def load_shortcut_model() -> ShortcutCNN:
    """:class:`.ShortcutCNN` with the weights shipped with the package, in eval mode.

    It learned the shortcut: it tells discs, squares and crosses apart by their shape (95 %
    and more of each, marked or not), but a triangle mostly by its mark (an unmarked one it
    calls a triangle about a fifth of the time, a square most often), and the mark turns
    nine in ten of the other shapes into triangles (``shortcut_training.shortcut_report``).

    >>> model = load_shortcut_model()
    >>> data = shortcut_dataset(64, seed=123)                      # as in training
    >>> accuracy = (model(data.inputs).argmax(1) == data.labels).float().mean().item()
    >>> accuracy > 0.9
    True
    """
    model = ShortcutCNN()
    with resources.files(__package__).joinpath(WEIGHTS).open("rb") as file:
        state = torch.load(file, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()
