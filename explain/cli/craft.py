"""``explain concepts craft FOLDER --class C``: the concepts a class uses, discovered (CRAFT,
:class:`explain.concepts.CRAFT`) in a folder of the class's images, written by
:func:`explain.analysis.write_craft` to --out (default: FOLDER-craft beside it)."""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import UsageError
from .common import as_flags, check_out


def craft_command(args) -> int:
    if not Path(args.folder).is_dir():
        raise UsageError(f"{args.folder} is not a folder: pass the folder that holds the class's images")
    folder = Path(args.folder).resolve()  # `.` and `..` have a name: the default --out goes beside them
    crops = _crops(args.crops)
    crop_size = _crop_size(args.crop_size)
    out = Path(args.out).resolve() if args.out else folder.with_name(f"{folder.name}-craft")
    if out == folder or folder in out.parents or out in folder.parents:
        raise UsageError(
            f"--out {args.out}: the images' folder, one in it or one above it; pick a folder of its "
            f"own (by default {folder.name}-craft beside it)"
        )
    from ..analysis import write_craft
    from ..analysis.concept_files import WRITTEN

    check_out(out, "craft.json", WRITTEN, "CRAFT's concepts")
    from ..concepts import CRAFT
    from ..models.loaded import load_model

    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    names, inputs, pictures = folder_images(folder, loaded)
    target: int | str = int(args.class_name) if args.class_name.isdecimal() else args.class_name
    try:
        craft = CRAFT(
            loaded.model, args.layer, concepts=args.concepts, crop_size=crop_size, crops=crops,
            positions=args.positions, relu=args.relu, designs=args.designs, best=args.best,
            batch_size=args.batch_size, seed=args.seed,
        )  # fmt: skip
        found = craft(inputs, target)
        maps = craft.concept_maps(found, inputs[: args.maps]) if args.maps else None
    except ValueError as error:
        raise UsageError(as_flags(str(error), FLAGS)) from None
    write_craft(found, out, pictures.cpu(), names, maps)
    print(
        f"{found.class_name or found.target} at {found.layer}: {len(found)} concepts from {len(found.boxes)} crops "
        f"of {len(names)} images (NMF error {found.error:.3f})"
    )
    for j, importance in enumerate(found.importances.tolist()):
        image = names[int(found.boxes[found.best[j, 0], 0])]
        print(f"  concept {j}: importance {importance:.3f}, best crop from {image}")
    print(f"wrote {out / 'craft.json'}, craft.csv, crops/" + (" and maps/" if maps is not None else ""))
    print(f"see {out / 'index.html'}: the concepts ranked by importance, with their crops and maps")
    return 0


def folder_images(folder: Path, loaded):
    """The images' names, their inputs (N, C, H, W) on the model's device, and their pictures
    in [0, 1] as the model sees them."""
    import torch

    from ..drawing import denormalize, normalization_of
    from ..images import IMAGE_EXTENSIONS, ImageError, load_rgb

    paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not paths:
        raise UsageError(f"{folder} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}): pass the class's folder")
    tensors = []
    for path in paths:
        try:
            tensors.append(loaded.preprocess(load_rgb(path)))
        except (ImageError, OSError) as error:
            raise UsageError(f"{path}: {error}; remove or replace it") from None
    sizes = sorted({tuple(t.shape) for t in tensors})
    if len(sizes) > 1:
        raise UsageError(
            f"the images are of different sizes after the model's preprocessing ({sizes[0]} and {sizes[-1]}): "
            "resize them to one size, or use a model whose preprocessing does"
        )
    inputs = torch.stack(tensors).to(loaded.device)
    try:
        pictures = denormalize(inputs, *normalization_of(loaded.preprocess))
    except ValueError:  # a preprocessing that does not normalise
        pictures = inputs.clamp(0, 1)
    return [p.relative_to(folder).as_posix() for p in paths], inputs, pictures


#: The smallest crop side in pixels (an integer below it is more likely a share meant as 1.0).
MIN_CROP_PIXELS = 8

#: The library's words for its options, and the command line's flags for them.
FLAGS = {
    "relu=True": "--relu",
    "concepts=": "--concepts ",
    "crops=N random ones per image": "--crops N, random crops per image",
    "a smaller crop_size": "a smaller --crop-size",
    "positions is one of": "--positions is one of",
}


def _crops(text: str) -> int | str:
    if text == "grid":
        return "grid"
    if text.isdecimal() and int(text) > 0:
        return int(text)
    raise UsageError(f"--crops: 'grid' or a number of random crops per image, got {text!r}")


def _crop_size(text: str) -> int | float:
    try:
        value: int | float = int(text) if text.isdecimal() else float(text)
    except ValueError:
        value = 0
    if not math.isfinite(value) or value <= 0 or (isinstance(value, float) and value > 1):
        raise UsageError(f"--crop-size: pixels (such as 96) or a share of the image's side (such as 0.5), got {text!r}")
    if isinstance(value, int) and value < MIN_CROP_PIXELS:
        raise UsageError(
            f"--crop-size {text} means crops of {value} x {value} pixels, under the {MIN_CROP_PIXELS} it takes: "
            "write a share of the image's side with a point (--crop-size 1.0 is the whole image, 0.5 half its side)"
        )
    return value
