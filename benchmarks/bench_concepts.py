"""The concept layer (explain.concepts) against its bare passes, in one run: CRP's concept
maps, the concept atlas (with its memory from 1,000 to 10,000 images), and feature
visualisation.

    .venv/bin/python benchmarks/bench_concepts.py [--repeats 3] [--only crp,atlas,rss,fv]

- **crp**: ``CRP(model, layer)(image, k=8)`` on one 224 x 224 photo (data/images) with the
  bundled EfficientNet-Lite0, against one forward pass plus eight LRP backward passes at
  the best batch size: the composite registered, the image's forward pass timed alone,
  and the backward pass of r copies (r = 1, 2, 4, 8: each copy's relevance at the layer
  masked to one channel) timed as (forward + backward of r rows) - (forward of r rows),
  its fastest time per row times eight. Goal: <= 1.3.
- **atlas**: ``concept_atlas`` over 1,000 images of the shortcut benchmark (64 x 64, its
  CNN, two layers) against one forward and one LRP backward pass per image (the composite
  registered, the same batches). Goal: <= 1.2.
- **rss**: the atlas of 1,000 and of 10,000 images (generated batch by batch, each its own
  process): peak RSS (VmHWM) of each. Goal: flat.
- **fv**: one step of ``visualize`` (Fourier, 8 views of 224 x 224; MaCo, 16 crops) on the
  bundled model and a timm ViT-Ti/16 (random weights), against one forward and backward
  pass of the same batch of views through the whole model (and through the model up to
  the layer, the passes a step runs). Goal: <= 1.2 of the whole model's.

Medians of ``--repeats`` rounds, the calls round-robin. Other processes on the same cores
distort the numbers: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
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
    print(f"|   LRP backward per row by batch size (s) | {rows} | | |")


def atlas_batches(count: int, batch: int = 64):
    """(ids, inputs) of ``count`` generated images, a batch at a time (each its own seed)."""
    for start in range(0, count, batch):
        data = shortcut_dataset(min(batch, count - start), seed=10_000 + start)
        yield torch.arange(start, start + len(data)), data.inputs


def bench_atlas(repeats: int, count: int = 1000) -> None:
    model = load_shortcut_model()
    batches = list(atlas_batches(count))
    layers = ["block3", "block4"]
    lrp = LRP(model)

    def bare():
        for _, inputs in batches:
            x = inputs.clone().requires_grad_()
            with concept_context(model), lrp.registered(lrp.composite(model, x), model):
                output = model(x)
                ids = output.argmax(1, keepdim=True)
                start = torch.zeros_like(output).scatter(1, ids, output.gather(1, ids)).detach()
                torch.autograd.grad(output, x, grad_outputs=start)

    times = interleaved_medians(
        {"bare": bare, "atlas": lambda: concept_atlas(model, batches, layers, inner_batch_size=64)}, repeats
    )
    print(
        f"| atlas of {count} images (64 px, 2 layers) | {times['atlas']:.2f} s | {times['bare']:.2f} s | "
        f"**{times['atlas'] / times['bare']:.2f}** (goal <= 1.2) |"
    )


def rss_run(count: int) -> None:
    """In a process of its own: the atlas of ``count`` generated images, then its peak RSS."""
    model = load_shortcut_model()
    atlas = concept_atlas(model, atlas_batches(count), ["block3", "block4"])
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
        print(f"| atlas peak RSS, {images} images | {peak / 1024:.0f} MiB | {time.perf_counter() - started:.0f} s | |")
    print(f"| peak RSS growth 1,000 -> 10,000 images | **{peaks[10_000] / peaks[1000] - 1:+.1%}** (goal: flat) | | |")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="crp,atlas,rss,fv")
    parser.add_argument("--rss-run", type=int, default=None, help=argparse.SUPPRESS)
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


if __name__ == "__main__":
    main()
