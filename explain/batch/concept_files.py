"""The files of ``explain concepts atlas`` besides ``atlas.pt``: per channel of each layer, its
reference patches (PNG crops of the region where the channel is relevant in each of its
RelMax and ActMax images, from :func:`~explain.concepts.reference_patches`) under
``patches/LAYER/CHANNEL/``, ``concepts.json`` (per channel: the reference images, boxes,
values and classes of both kinds, the patches' files, and the channel's statistics),
``index.html`` (the atlas's page, :mod:`explain.viewer.concept_page`) and ``failures.csv``
(the images this run could not read).

Only the images the atlas names are decoded again, a few at a time: the memory is one inner
batch of them, not the dataset."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor

from ..concepts import ConceptAtlas, ReferencePatches, reference_patches
from ..models import LoadedModel
from ..report import atomic_write
from ..viewer.concept_page import CONCEPTS_FILE, PAGE_FILE, concept_page
from .decoding import ModelInputs
from .manifest import safe_name
from .options import AtlasOptions, parse_channels

#: The format entry of ``concepts.json``.
CONCEPTS_FORMAT = "explain.concepts.atlas-files/1"
#: The folder of the reference patches.
PATCHES_FOLDER = "patches"
#: The images that could not be read (image,error).
FAILURES_FILE = "failures.csv"
#: Where the page looks for the concepts' feature visualisations: ``explain concepts
#: visualize MODEL LAYER:CHANNELS --out ATLAS/visualizations`` writes them there
#: (:func:`visual_link`); a concept without one shows none.
VISUALS_FOLDER = "visualizations"
#: Kinds of reference: (the atlas's mode, its name in concepts.json and the patches' files).
KINDS = (("relevance", "relmax"), ("activation", "actmax"))
#: How many of a channel's classes concepts.json lists (those it is most often a top concept of).
TOP_CLASSES = 5


class AtlasImages:
    """The atlas's images by id, decoded again as the run decoded them (a few kept)."""

    def __init__(self, loaded: LoadedModel, images: list[str]):
        self.inputs = ModelInputs(loaded.preprocess)
        self.dataset = self.inputs.dataset(images, loaded.example)
        self.device, self.example = loaded.device, loaded.example
        self.decoded = lru_cache(maxsize=64)(self._decode)

    def _decode(self, index: int) -> Tensor | None:
        _, image, _ = self.dataset[index]
        return image  # None: the file went or changed since the atlas saw it

    def pixels(self, index: int) -> Tensor | None:
        """The image of id ``index`` as the workers decode it (uint8 where the preprocessing ends
        in ToTensor and Normalize), or None where it cannot be read any more."""
        return self.decoded(index)

    def picture(self, index: int) -> Tensor | None:
        """The image of id ``index`` as uint8 pixels of the model input's frame (a preprocessing
        that normalises in the workers undone where its mean and std are known)."""
        image = self.pixels(index)
        if image is None or image.dtype == torch.uint8:
            return image
        if self.inputs.mean is not None and self.inputs.std is not None:
            image = image * torch.tensor(self.inputs.std).view(-1, 1, 1) + torch.tensor(self.inputs.mean).view(-1, 1, 1)
        return image.float().clamp(0, 1).mul(255).round().to(torch.uint8)

    def model_inputs(self, ids: Tensor) -> Tensor:
        """What the model takes, for ``ids`` (zeros for an image that cannot be read any more)."""
        shape = (3, *self.example.shape[-2:])
        images = []
        for index in ids.tolist():
            image = self.pixels(index)
            images.append(image if image is not None else torch.zeros(shape, dtype=torch.uint8))
        return self.inputs.model_input(torch.stack(images).to(self.device))


def png_bytes(image: Tensor) -> bytes:
    """A (3, H, W) uint8 image as PNG."""
    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).cpu().numpy()).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class AtlasFiles:
    """What the files are written from: the options, the model, the atlas, its layers and its
    images (their paths, by id)."""

    options: AtlasOptions
    loaded: LoadedModel
    atlas: ConceptAtlas
    layers: list[str]
    images: list[str]


def concepts_current(out_dir: Path, options: AtlasOptions, atlas: ConceptAtlas) -> bool:
    """Whether ``concepts.json`` (and the patches) under ``out_dir`` are of this atlas's images
    and ``--channels``, which a run that adds no image keeps (a run stopped after its last
    save of the atlas left them behind it)."""
    try:
        document = json.loads((out_dir / CONCEPTS_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(document, dict)
        and document.get("patch_channels", "") == options.channels
        and document.get("images") == atlas.images
        and (out_dir / PAGE_FILE).is_file()
    )


def write_concepts(out_dir: Path, files: AtlasFiles) -> None:
    """Write each layer's reference patches (those of an earlier atlas removed) and ``concepts.json``."""
    options, atlas = files.options, files.atlas
    # concepts.json goes first: stopped among the patches, no file names patches that are gone
    (out_dir / CONCEPTS_FILE).unlink(missing_ok=True)
    shutil.rmtree(out_dir / PATCHES_FOLDER, ignore_errors=True)
    source = AtlasImages(files.loaded, files.images)
    layers = {layer: _layer_concepts(out_dir, files, source, layer) for layer in files.layers}
    document = {
        "format": CONCEPTS_FORMAT,
        "model": options.model,
        "weights": options.weights,
        "patch_channels": options.channels,
        "images": atlas.images,
        "top_n": atlas.top_n,
        "settings": atlas.settings,
        "layers": layers,
    }
    atomic_write(out_dir / CONCEPTS_FILE, (json.dumps(document, indent=1) + "\n").encode())
    write_concept_page(out_dir, document)


def visual_link(layer: str, channel: int) -> str:
    """The feature visualisation of ``layer:channel`` that the atlas's page shows, relative to
    the atlas folder: where ``explain concepts visualize ... --out ATLAS/visualizations``
    writes it (``visualizations/LAYER/CCCC.png``, the layer's name as the patches' folder).

    >>> visual_link("features.6", 42)
    'visualizations/features.6/0042.png'
    """
    return f"{VISUALS_FOLDER}/{visual_file(layer, channel)}"


def visual_file(layer: str, channel: int) -> str:
    """Where ``explain concepts visualize`` writes a channel's image under its --out (what
    :func:`visual_link` reads under ``ATLAS/visualizations``).

    >>> visual_file("features.6", 42)
    'features.6/0042.png'
    """
    return f"{safe_name(layer)}/{channel:04d}.png"


def write_concept_page(out_dir: Path, document: dict | None = None) -> None:
    """Write the atlas's page, ``index.html``, from its ``concepts.json`` (``document``, read
    from ``out_dir`` where not given)."""
    if document is None:
        document = json.loads((out_dir / CONCEPTS_FILE).read_text(encoding="utf-8"))
    atomic_write(out_dir / PAGE_FILE, concept_page(document, visual_link).encode("utf-8"))


def _channels(options, layer: str, count: int) -> list[int]:
    """The channels of ``layer`` (``count`` of them) whose patches are written (``--channels``)."""
    channels = list(range(count)) if options.channels is None else parse_channels(options.channels)
    if channels[-1] >= count:
        print(
            f"explain: warning: --channels {options.channels}: {layer} has channels 0-{count - 1}; "
            "the others are left out",
            file=sys.stderr,
        )
    return [c for c in channels if c < count]


def _layer_concepts(out_dir: Path, files: AtlasFiles, source: AtlasImages, layer: str) -> dict:
    """One layer's patches written; its entry of concepts.json."""
    options, atlas, names, images = files.options, files.atlas, files.loaded.class_names, files.images
    layer_atlas = atlas.layers[layer]
    channels = _channels(options, layer, layer_atlas.channels)
    found, classes = {}, {}
    for mode, kind in KINDS:
        patches = reference_patches(
            files.loaded.model,
            atlas,
            source.model_inputs,
            layer,
            mode=mode,
            channels=channels,
            batch_size=options.batch_size,
            max_memory=options.max_memory,
            progress=not options.quiet,
        )
        found[kind] = _write_patches(out_dir, patches, source, images, kind)
        classes[kind] = atlas.references(layer, mode).classes
    statistics = atlas.statistics(layer)
    concepts = []
    for channel in channels:
        entry: dict = {"channel": channel}
        for _, kind in KINDS:
            entry[kind] = [
                dict(ref, **_class(int(classes[kind][rank, channel]), names))
                for rank, ref in enumerate(found[kind][channel])
            ]
        entry["statistics"] = _statistics(statistics, channel, names)
        concepts.append(entry)
    return {
        "channels": layer_atlas.channels,
        "grid": list(layer_atlas.grid),
        "input_size": list(layer_atlas.input_size),
        "concepts": concepts,
    }


def _write_patches(
    out_dir: Path, patches: ReferencePatches, source: AtlasImages, images: list[str], kind: str
) -> dict[int, list[dict]]:
    """Save the crops of ``patches`` as PNG files; per channel, its references for concepts.json."""
    folder = Path(PATCHES_FOLDER) / safe_name(patches.layer)
    found: dict[int, list[dict]] = {}
    for row, channel in enumerate(patches.channels.tolist()):
        refs = found.setdefault(channel, [])
        for rank, (index, value, box) in enumerate(
            zip(patches.ids[row].tolist(), patches.values[row].tolist(), patches.boxes[row].tolist(), strict=True)
        ):
            if index < 0:
                break
            x0, y0, x1, y1 = box
            pixels = source.picture(index)
            name = None
            if pixels is not None:
                name = (folder / f"{channel:04d}" / f"{kind}_{rank}.png").as_posix()
                (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
                atomic_write(out_dir / name, png_bytes(pixels[:, y0:y1, x0:x1]))
            refs.append({"image": images[index], "box": box, "value": value, "patch": name})
    return found


def _class(class_id: int, names: list[str]) -> dict:
    return {"class": class_id, "class_name": names[class_id] if 0 <= class_id < len(names) else None}


def _statistics(statistics, channel: int, names: list[str]) -> dict:
    """A channel's statistics for concepts.json: its means, how often it is among an image's
    top concepts, and the classes it is so most often for."""
    by_class = statistics.top_by_class[:, channel]
    order = by_class.argsort(descending=True, stable=True)[:TOP_CLASSES].tolist()
    return {
        "mean_activation": float(statistics.mean_activation[channel]),
        "mean_relevance": float(statistics.mean_relevance[channel]),
        "top_count": int(statistics.top_count[channel]),
        "top_classes": [dict(_class(c, names), count=int(by_class[c])) for c in order if by_class[c] > 0],
    }


def write_failures(out_dir: Path, failures: list[dict]) -> None:
    """``failures.csv``: the images this run could not read, with the reason (a rerun tries them again)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["image", "error"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(failures)
    atomic_write(out_dir / FAILURES_FILE, buffer.getvalue().encode())
