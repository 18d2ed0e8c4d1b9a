"""CRAFT's concepts as files (what ``explain concepts craft`` writes), all or nothing:
``craft.json`` (the class, the layer, the settings, the NMF's error, and per concept, most
important first: its total Sobol index, its spread over the images and its best crops with
their image, box and coefficient), ``craft.csv`` (one row per concept), ``crops/cJ_R.png``
(concept J's R-th best crop, as the model saw it) and ``maps/IMAGE__cJ.png`` (concept J's map
over a few images, listed in craft.json's ``maps``) and ``index.html``, its page
(``explain/viewer/craft_page.py``: the concepts ranked by importance with their
crops, and the maps).

The folder is written beside its place and renamed into place at the end
(:func:`~explain.analysis.files.replace_folder`): an error or Ctrl-C on the way leaves the
earlier folder (or none), never half of the new one."""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..drawing import overlay
from ..explanation import ConceptExplanation
from ..report import encode_png
from ..viewer.craft_page import craft_page
from .files import json_number, replace_folder

if TYPE_CHECKING:  # (the concepts import the methods: not needed to write files)
    from ..concepts import CraftConcepts

__all__ = ["CRAFT_FIELDS", "write_craft"]

#: The columns of ``craft.csv``.
CRAFT_FIELDS = ("concept", "importance", "importance_sd", "best_image", "best_crop")
#: What an earlier ``write_craft`` left in its folder: the one kind of folder it replaces.
WRITTEN = frozenset({"craft.json", "craft.csv", "crops", "maps", "index.html"})
#: The side of a crop's PNG, in pixels (enlarged or reduced, bilinear).
CROP_SIDE = 128


def write_craft(
    found: CraftConcepts,
    out: str | os.PathLike,
    pictures: Tensor,
    names: Sequence[str],
    maps: ConceptExplanation | None = None,
) -> pathlib.Path:
    """Write ``found`` (:class:`~explain.concepts.CRAFT`'s result) to the folder ``out``,
    replacing an earlier one whole (and refusing a folder of other files, which that would
    delete: :func:`~explain.analysis.files.check_replaceable`); returns ``out``.

    ``pictures`` (N, 3, H, W) in [0, 1] are the images as the model saw them (the boxes'
    pixels), ``names`` their names; ``maps`` the concept maps of the first of them
    (:meth:`~explain.concepts.CRAFT.concept_maps`), drawn over their pictures."""
    if len(names) != len(pictures):
        raise ValueError(f"got {len(names)} names for {len(pictures)} pictures; give one name per image")

    def fill(temp: Path) -> None:
        (temp / "crops").mkdir()
        concepts = [_write_concept(temp, found, j, pictures, names) for j in range(len(found))]
        drawn = _write_maps(temp, maps, pictures, names) if maps is not None else []
        summary = {
            "class": found.class_name,
            "class_id": found.target,
            "layer": found.layer,
            "images": list(names),
            "crops": len(found.boxes),
            "error": json_number(found.error),
            "settings": found.settings,
            "concepts": concepts,
            "maps": drawn,
        }
        (temp / "craft.json").write_text(json.dumps(summary, indent=1, allow_nan=False), encoding="utf-8")
        (temp / "craft.csv").write_text(_csv(concepts), encoding="utf-8", newline="")
        (temp / "index.html").write_text(craft_page(summary), encoding="utf-8")

    return replace_folder(out, fill, "craft.json", WRITTEN, "CRAFT's concepts")


def _write_maps(folder: Path, maps: ConceptExplanation, pictures: Tensor, names: Sequence[str]) -> list[dict]:
    """Each concept's map over the first images, drawn under ``folder``/maps; craft.json's
    ``maps``: per image, its name and its files (concept j's the j-th)."""
    (folder / "maps").mkdir()
    drawn = []
    for i, stem in enumerate(_unique_stems(names[: len(maps)])):
        picture = (pictures[i].permute(1, 2, 0).clamp(0, 1) * 255).round().byte().numpy()
        files = []
        for j, heat in enumerate(maps.maps[i]):
            path = Path("maps", f"{stem}__c{j}.png")
            (folder / path).write_bytes(encode_png(overlay(picture, heat.cpu().numpy())))
            files.append(path.as_posix())
        drawn.append({"image": names[i], "files": files})
    return drawn


def _unique_stems(names: Sequence[str]) -> list[str]:
    """Each image's file stem, those that two names share (``a.png``, ``a.jpg``) told apart
    by the image's number.

    >>> _unique_stems(["x/a.png", "x/a.jpg", "b.png"])
    ['x__a', 'x__a~1', 'b']
    """
    stems: list[str] = []
    for i, name in enumerate(names):
        stem = _stem(name)
        stems.append(f"{stem}~{i}" if stem in stems else stem)
    return stems


def _stem(name: str) -> str:
    stem = Path(name).with_suffix("").as_posix().replace("/", "__")
    return "".join(c if c.isalnum() or c in "._+-" else "_" for c in stem)[:64] or "image"


def _write_concept(folder: Path, found: CraftConcepts, j: int, pictures: Tensor, names: Sequence[str]) -> dict:
    """Concept ``j``'s entry of craft.json; its best crops written under ``folder``."""
    crops = []
    for rank, (index, piece) in enumerate(zip(found.best[j].tolist(), found.best_crops(pictures, j), strict=True)):
        image, top, left, height, width = found.boxes[index].tolist()
        path = Path("crops", f"c{j}_{rank}.png")
        (folder / path).write_bytes(encode_png(_picture(piece)))
        crops.append(
            {
                "image": names[image],
                "box": [top, left, height, width],
                "coefficient": json_number(float(found.coefficients[index, j])),
                "file": path.as_posix(),
            }
        )
    spread = found.image_importances[:, j]
    return {
        "concept": j,
        "importance": json_number(float(found.importances[j])),
        "importance_sd": json_number(float(spread.std())) if len(spread) > 1 else None,
        "best_crops": crops,
    }


def _picture(piece: Tensor) -> np.ndarray:
    """(CROP_SIDE, CROP_SIDE, 3) uint8 of a crop (3, h, w) in [0, 1]."""
    resized = torch.nn.functional.interpolate(
        piece[None].float(), size=(CROP_SIDE, CROP_SIDE), mode="bilinear", align_corners=False
    )[0]
    return (resized.clamp(0, 1).permute(1, 2, 0) * 255).round().byte().numpy()


def _csv(concepts: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CRAFT_FIELDS, lineterminator="\n")
    writer.writeheader()
    for entry in concepts:
        best = entry["best_crops"][0] if entry["best_crops"] else {}
        writer.writerow(
            {
                "concept": entry["concept"],
                "importance": entry["importance"],
                "importance_sd": entry["importance_sd"],
                "best_image": best.get("image"),
                "best_crop": best.get("file"),
            }
        )
    return buffer.getvalue()
