"""``explain concepts tcav FOLDER --class C --concept NAME=FOLDER ... --random FOLDER ...
--layer L``: whether the class of FOLDER's images is sensitive to concepts the user names
(TCAV, :class:`explain.concepts.TCAV`), written by :func:`explain.analysis.write_tcav` to
--out (default: FOLDER-tcav beside it); the folders' activations cached under --cache
(default: OUT-cache beside --out).

``--random`` given several times: each folder one random set. Given once: the folder is a
pool from which --random-sets sets of --random-size images are drawn with --seed."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from .common import as_flags, check_out


def tcav_command(args) -> int:
    folder = _folder(args.folder, "the folder that holds the class's images")
    named = [_concept(text) for text in args.concept]
    concepts = dict(named)
    if len(concepts) < len(named):
        raise UsageError("two --concept options name the same concept: give each its own NAME")
    randoms = [_folder(text, "a folder of random images (--random FOLDER)") for text in args.random]
    if len(set(randoms)) < len(randoms):
        raise UsageError("a --random folder is given twice: give each random set its own folder")
    out = Path(args.out).resolve() if args.out else folder.with_name(f"{folder.name}-tcav")
    cache = Path(args.cache).resolve() if args.cache else out.with_name(f"{out.name}-cache")
    _check_places(out, cache, [folder, *concepts.values(), *randoms])
    from ..analysis import write_tcav
    from ..analysis.tcav_files import WRITTEN

    check_out(out, "tcav.json", WRITTEN, "TCAV's scores")
    from ..concepts import TCAV
    from ..models.loaded import load_model
    from .craft import folder_images

    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    names, inputs, _ = folder_images(folder, loaded)
    concept_images = {name: folder_images(path, loaded)[1] for name, path in concepts.items()}
    random_images = [folder_images(path, loaded)[1] for path in randoms]
    target: int | str = int(args.class_name) if args.class_name.isdecimal() else args.class_name
    layers = [name for text in args.layer for name in text.split(",") if name]
    try:
        tcav = TCAV(
            loaded.model, layers, alpha=args.alpha, alternative=args.alternative,
            min_random_sets=args.min_random_sets, batch_size=args.batch_size, cache=cache, seed=args.seed,
        )  # fmt: skip
        random = random_images[0] if len(random_images) == 1 else random_images
        sets, size = args.random_sets, args.random_size
        result = tcav({target: inputs}, concept_images, random, random_sets=sets, random_size=size)
    except ValueError as error:
        message = as_flags(str(error), FLAGS)
        for i, path in enumerate(randoms):
            message = message.replace(f"random set {i} ", f"--random {path} ")
        raise UsageError(message) from None
    sources = {
        "class_folder": str(folder),
        "images": names,
        "concepts": {n: {"folder": str(path), "images": len(concept_images[n])} for n, path in concepts.items()},
        "random": [{"folder": str(path), "images": len(x)} for path, x in zip(randoms, random_images, strict=True)],
        "cache": str(cache),
    }
    write_tcav(result, out, sources)
    _print(result, out)
    return 0


def _print(result, out: Path) -> None:
    tests = f"{result.tests} test{'s' if result.tests != 1 else ''}"
    print(f"TCAV over {len(result.random_sets)} random sets, alpha {result.alpha} corrected for {tests}:")
    for s in result:
        verdict = f"significant ({s.direction})" if s.significant else "not significant"
        print(
            f"  {s.concept} at {s.layer} for {s.class_name or s.target}: {s.mean:.2f} +- {s.std:.2f} "
            f"(random {s.null_mean:.2f}), p {s.p_value:.3g}, corrected {s.corrected_p:.3g}: {verdict}; "
            f"CAV accuracy {s.accuracy:.2f}"
        )
    print(f"wrote {out / 'tcav.json'} and tcav.csv")
    print(f"see {out / 'index.html'}: each score against the random directions, with its test")


def _folder(text: str, what: str) -> Path:
    if not Path(text).is_dir():
        raise UsageError(f"{text} is not a folder: pass {what}")
    return Path(text).resolve()


def _concept(text: str) -> tuple[str, Path]:
    name, sep, place = text.partition("=")
    if not sep or not name or not place:
        raise UsageError(f"--concept {text!r}: give NAME=FOLDER, such as --concept striped=images/striped")
    return name, _folder(place, f"the folder of the concept {name!r}'s images (--concept NAME=FOLDER)")


def _check_places(out: Path, cache: Path, folders: list[Path]) -> None:
    for folder in folders:
        for place, flag in ((out, "--out"), (cache, "--cache")):
            if place == folder or folder in place.parents or place in folder.parents:
                raise UsageError(
                    f"{flag} {place}: an images' folder ({folder}), one in it or one above it; pick a folder "
                    "of its own (by default FOLDER-tcav and FOLDER-tcav-cache beside FOLDER)"
                )
    if cache == out or out in cache.parents:
        raise UsageError(f"--cache {cache} lies in --out {out}, which is replaced whole: pick a folder outside it")


#: The library's words for its options, and the command line's flags for them.
FLAGS = {
    "(min_random_sets)": "(--min-random-sets)",
    "one pool of random images and random_sets=N to draw N sets from it": (
        "one --random folder and --random-sets N to draw N sets from it"
    ),
    "or pass a random_size in that range": "or pass a --random-size in that range",
    "alternative is one of": "--alternative is one of",
}
