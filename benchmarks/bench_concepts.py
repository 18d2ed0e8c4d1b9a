"""The concept layer (explain.concepts) against its bare passes, in one run: CRP's concept
maps, the concept atlas (with its memory from 1,000 to 10,000 images), and feature
visualisation.

    .venv/bin/python benchmarks/bench_concepts.py [--repeats 3] [--only crp,atlas,rss,fv]
        [--results benchmarks/results/concepts.json]

- **crp**: ``CRP(model, layer)(image, k=8)`` on one 224 x 224 photo (data/images) with the
  bundled EfficientNet-Lite0, against one forward pass plus eight LRP backward passes at
  the best batch size: the composite registered, the image's forward pass timed alone,
  and the backward pass of r copies (r = 1, 2, 4, 8: each copy's relevance at the layer
  masked to one channel) timed as (forward + backward of r rows) - (forward of r rows),
  its fastest time per row times eight. Goal: <= 1.3.
- **atlas**: the atlas as ``explain concepts atlas`` runs it, ``AtlasProbe`` on each batch and
  ``ConceptAtlas.update`` (``concept_atlas``), over 1,000 images of the shortcut benchmark
  (64 x 64, its CNN, two layers) and over 32 photos (data/images, 224 x 224) with the bundled
  EfficientNet-Lite0 (one layer, blocks.5), against one forward and one LRP backward pass
  per image (the composite registered, the same batches). Goal: <= 1.2.
- **rss**: the atlas (shortcut CNN, two layers) of 1,000 and of 10,000 images of seeded
  noise (64 x 64, generated 250 at a time), each in a process of its own: peak RSS
  (``ru_maxrss``) of each. Goal: flat.
- **fv**: one step of ``visualize`` (Fourier, 8 views of 224 x 224; MaCo, 16 crops) on the
  bundled model and a timm ViT-Ti/16 (random weights), against one forward and backward
  pass of the same batch of views through the whole model (and through the model up to
  the layer, the passes a step runs). Goal: <= 1.2 of the whole model's.

Medians of ``--repeats`` rounds, the calls round-robin. Other processes on the same cores
distort the numbers: compare ratios within one run. The figures are also written to
``--results`` (JSON: one record per case, seconds and ratios), beside the table printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from PIL import Image

import explain
from explain.concepts import CRP, concept_atlas, visualize
from explain.concepts.propagation import Gates, Truncated, concept_context
from explain.data import load_shortcut_model, shortcut_dataset
from explain.methods.relevance import LRP

sys.path.insert(0, str(Path(__file__).parent))
from bench_gradcam import interleaved_medians

DATA = Path(__file__).resolve().parents[1] / "data" / "images"
#: The figures of this run, one record per case, written to --results at the end.
FIGURES: list[dict] = []


def photo():
    model, preprocess, _ = explain.models.load("efficientnet_lite0")
    path = sorted(p for p in DATA.iterdir() if p.suffix in (".jpg", ".png"))[0]
    return model, preprocess(Image.open(path).convert("RGB"))[None]


def bare_crp(model, layer: str, image: torch.Tensor, repeats: int) -> tuple[float, dict]:
    """One forward pass, plus eight LRP backward passes of channel-masked relevance at the
    best batch size, with LRP's composite registered: (seconds, seconds per row by r)."""
    lrp, module = LRP(model), model.get_submodule(layer)

    def rows(r: int, backward: bool):
        def run():
            batch = image.expand(r, -1, -1, -1).contiguous().requires_grad_()
            with concept_context(model), lrp.registered(lrp.composite(model, batch), model):
                with Gates({layer: module}) as gates:
                    output = model(batch)
                if backward:
                    record = gates[layer]
                    masks = torch.zeros(r, record.gated.shape[1], 1, 1)
                    masks[torch.arange(r), torch.arange(r)] = 1
                    record.mask = masks
                    start = torch.zeros_like(output)
                    start[:, output[0].argmax()] = output[:, output[0].argmax()].detach()
                    torch.autograd.grad(output, batch, grad_outputs=start)

        return run

    calls = {f"f{r}": rows(r, False) for r in (1, 2, 4, 8)} | {f"fb{r}": rows(r, True) for r in (1, 2, 4, 8)}
    times = interleaved_medians(calls, repeats)
    per_row = {r: (times[f"fb{r}"] - times[f"f{r}"]) / r for r in (1, 2, 4, 8)}
    return times["f1"] + 8 * min(per_row.values()), per_row


def bench_crp(repeats: int) -> None:
    model, image = photo()
    layer = "blocks.5"
    crp = CRP(model, layer)
    bare, per_row = bare_crp(model, layer, image, repeats)
    ours = interleaved_medians({"crp": lambda: crp(image, k=8)}, repeats)["crp"]
    rows = ", ".join(f"{r}: {t:.3f}" for r, t in per_row.items())
    print(f"| CRP k=8, {layer} | {ours:.2f} s | {bare:.2f} s | **{ours / bare:.2f}** (goal <= 1.3) |")
    FIGURES.append(
        {
            "case": f"crp k=8 {layer}",
            "seconds": ours,
            "bare_seconds": bare,
            "ratio": ours / bare,
            "goal": 1.3,
            "backward_per_row_by_batch": per_row,
        }
    )
    print(f"|   LRP backward per row by batch size (s) | {rows} | | |")


def atlas_batches(count: int, batch: int = 64):
    """(ids, inputs) of ``count`` generated images, a batch at a time (each its own seed)."""
    for start in range(0, count, batch):
        data = shortcut_dataset(min(batch, count - start), seed=10_000 + start)
        yield torch.arange(start, start + len(data)), data.inputs


def bare_lrp(model, batches):
    """One forward and one LRP backward pass (the predicted class's logit) per image of
    ``batches``, LRP's composite registered as the probe registers it."""
    lrp = LRP(model)

    def run():
        for _, inputs in batches:
            x = inputs.clone().requires_grad_()
            with concept_context(model), lrp.registered(lrp.composite(model, x), model):
                output = model(x)
                ids = output.argmax(1, keepdim=True)
                start = torch.zeros_like(output).scatter(1, ids, output.gather(1, ids)).detach()
                torch.autograd.grad(output, x, grad_outputs=start)

    return run


def photo_batches(count: int, batch: int = 16):
    """(ids, inputs) of ``count`` photos of data/images (flipped and shifted copies), 224 x 224."""
    model, preprocess, _ = explain.models.load("efficientnet_lite0")
    paths = sorted(p for p in DATA.iterdir() if p.suffix in (".jpg", ".png"))
    photos = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths])
    copies = []
    for i in range(-(-count // len(photos))):
        copy = torch.roll(photos, shifts=8 * i, dims=3)
        copies.append(copy.flip(3) if i % 2 else copy)
    images = torch.cat(copies)[:count]
    return model, [
        (torch.arange(s, s + len(images[s : s + batch])), images[s : s + batch]) for s in range(0, count, batch)
    ]


def bench_atlas(repeats: int, count: int = 1000, photos: int = 32) -> None:
    cases = [
        (
            f"atlas of {count} images (64 px, shortcut CNN, block3 + block4)",
            load_shortcut_model(),
            list(atlas_batches(count)),
            ["block3", "block4"],
            64,
        ),
        (f"atlas of {photos} photos (224 px, efficientnet_lite0, blocks.5)", *photo_batches(photos), ["blocks.5"], 16),
    ]
    for name, model, batches, layers, inner in cases:
        times = interleaved_medians(
            {
                "bare": bare_lrp(model, batches),
                "atlas": lambda model=model, batches=batches, layers=layers, inner=inner: concept_atlas(
                    model, batches, layers, inner_batch_size=inner
                ),
            },
            repeats,
        )
        ratio = times["atlas"] / times["bare"]
        print(f"| {name} | {times['atlas']:.2f} s | {times['bare']:.2f} s | **{ratio:.2f}** (goal <= 1.2) |")
        FIGURES.append(
            {"case": name, "seconds": times["atlas"], "bare_seconds": times["bare"], "ratio": ratio, "goal": 1.2}
        )


def noise_batches(count: int, batch: int = 250):
    """(ids, inputs) of ``count`` images of seeded noise (64 x 64), a batch at a time: a stream
    that costs nothing to make, so that the run's time is the atlas's."""
    for start in range(0, count, batch):
        rows = min(batch, count - start)
        generator = torch.Generator().manual_seed(start)
        yield torch.arange(start, start + rows), torch.randn(rows, 3, 64, 64, generator=generator)


def rss_run(count: int) -> None:
    """In a process of its own: the atlas of ``count`` generated images, then its peak RSS."""
    model = load_shortcut_model()
    # the inner batch given (the batch itself): on a loaded machine the timed search for the
    # fastest inner batch (explain.passes.timed_chunks) can settle on 2 rows for the process
    atlas = concept_atlas(model, noise_batches(count), ["block3", "block4"], inner_batch_size=250)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"{atlas.images} {peak}")


def bench_rss() -> None:
    peaks = {}
    for count in (1000, 10_000):
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, __file__, "--rss-run", str(count)], capture_output=True, text=True, check=True
        )
        images, peak = map(int, out.stdout.split()[-2:])
        peaks[count] = peak
        seconds = time.perf_counter() - started
        print(f"| atlas peak RSS, {images} images | {peak / 1024:.0f} MiB | {seconds:.0f} s | |")
        FIGURES.append({"case": f"atlas peak RSS {images} images", "peak_rss_mib": peak / 1024, "seconds": seconds})
    growth = peaks[10_000] / peaks[1000] - 1
    print(f"| peak RSS growth 1,000 -> 10,000 images | **{growth:+.1%}** (goal: flat) | | |")
    FIGURES.append({"case": "atlas peak RSS growth 1,000 -> 10,000 images", "growth": growth})


def bare_step(model, layer: str, views: torch.Tensor, whole: bool):
    """One forward and backward pass of ``views``: through the whole model, or to the layer."""
    module = model.get_submodule(layer)

    def run():
        x = views.clone().requires_grad_()
        with Gates({layer: module}, stop=None if whole else layer) as gates, contextlib.suppress(Truncated):
            model(x)
        torch.autograd.grad(gates[layer].activation[:, 0].mean(), x)

    return run


def bench_fv(repeats: int) -> None:
    bundled, _, _ = explain.models.load("efficientnet_lite0")
    vit = __import__("timm").create_model("vit_tiny_patch16_224", pretrained=False).eval()
    for name, model, layer in (("efficientnet_lite0", bundled, "blocks.5"), ("vit_tiny", vit, "blocks.8")):
        for method, views in (("fourier", 8), ("maco", 16)):
            steps = {
                s: lambda s=s, model=model, layer=layer, method=method, views=views: visualize(
                    model, layer, 0, method=method, steps=s, views=views
                )
                for s in (2, 4)
            }
            times = interleaved_medians(steps, repeats)
            per_step = (times[4] - times[2]) / 2
            batch = torch.rand(views, 3, 224, 224)
            with explain.hooks.preserved_state(model):
                bare = interleaved_medians(
                    {"whole": bare_step(model, layer, batch, True), "layer": bare_step(model, layer, batch, False)},
                    repeats,
                )
            print(
                f"| {method} step, {name} {layer}, {views} views | {per_step:.3f} s | {bare['whole']:.3f} s "
                f"(to the layer {bare['layer']:.3f} s) | **{per_step / bare['whole']:.2f}** "
                f"({per_step / bare['layer']:.2f} of the passes to the layer) |"
            )
            FIGURES.append(
                {
                    "case": f"{method} step {name} {layer} {views} views",
                    "seconds": per_step,
                    "bare_seconds": bare["whole"],
                    "bare_to_layer_seconds": bare["layer"],
                    "ratio": per_step / bare["whole"],
                    "ratio_to_layer": per_step / bare["layer"],
                    "goal": 1.2,
                }
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="crp,atlas,rss,fv")
    parser.add_argument("--rss-run", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--results",
        default=str(Path(__file__).parent / "results" / "concepts.json"),
        help="where the figures are written (JSON)",
    )
    args = parser.parse_args()
    if args.rss_run:
        rss_run(args.rss_run)
        return
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print("| case | explain | bare passes | ratio |\n|---|---|---|---|")
    chosen = args.only.split(",")
    if "crp" in chosen:
        bench_crp(args.repeats)
    if "atlas" in chosen:
        bench_atlas(args.repeats)
    if "rss" in chosen:
        bench_rss()
    if "fv" in chosen:
        bench_fv(args.repeats)
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    machine = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": platform.processor()}
    results.write_text(json.dumps({"machine": machine, "repeats": args.repeats, "cases": FIGURES}, indent=1) + "\n")
    print(f"figures written to {results}")


if __name__ == "__main__":
    main()
