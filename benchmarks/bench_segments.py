"""Segment attribution: explain's ``segments=`` against captum 0.9's ``ImageMaskInput`` on the
same model, image and masks, in one run.

    .venv/bin/python benchmarks/bench_segments.py [--repeats 3] [--masks 16] [--size 224] [--threads 1]

The model is torchvision's resnet18 (random weights, seed 0), the image the bundled
``data/images/chelsea.png`` resized to ``--size``, the masks ``--masks`` overlapping
rectangles (seeded), the target the image's top class, the baseline black (captum's
``ImageMaskInput(baseline=(0, 0, 0))``, explain's ``baseline="zeros"`` on unnormalised
inputs). captum's side is what ``ImageMaskInput`` offers a classifier: its method on
``to_tensor()``, each perturbed image made by ``to_model_input`` (a PIL image) and run
through the model one at a time (``to_model_input`` reads one coalition), scores by
``format_attr``, the pixel map by ``format_pixel_attr``. explain's side is
``explainer(x, target, segments=[masks])``: the coalitions made as tensors and run in inner
batches from the memory budget.

Agreement: the largest absolute difference of the segment scores and of the pixel maps, and
the Pearson correlation of the scores. Time: the two calls alternate, one warm-up each, the
median of ``--repeats`` rounds; the sampling methods run with the same seed on both sides.
Other processes on the same cores distort the numbers; the ratio is within this run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torchvision
from captum._utils.models.linear_model import SkLearnLasso
from captum.attr import FeatureAblation, ImageMaskInput, KernelShap, Lime, ShapleyValueSampling
from PIL import Image
from torchvision.transforms.functional import to_tensor

import explain

REPO = Path(__file__).resolve().parents[1]
#: method -> (captum's class, its options, explain's options)
CASES = {
    "ablation": (FeatureAblation, {}, {}),
    "shapley-sampling": (ShapleyValueSampling, {"n_samples": 2}, {"n_samples": 2}),
    "kernelshap": (KernelShap, {"n_samples": 64}, {"n_samples": 64}),
    "lime": (Lime, {"n_samples": 64}, {"n_samples": 64, "lasso_alpha": 1e-4}),
}


def rectangles(count: int, size: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    masks = torch.zeros(count, size, size, dtype=torch.bool)
    for mask in masks:
        top, left = rng.integers(0, size // 2, 2)
        height, width = rng.integers(size // 6, size // 2, 2)
        mask[top : top + height, left : left + width] = True
    return masks


def captum_call(name: str, model, picture: Image.Image, masks: torch.Tensor, target: int):
    method, options, _ = CASES[name]
    given = ImageMaskInput(picture, mask_list=list(masks), baseline=(0, 0, 0))

    def forward(present):
        return torch.cat([model(to_tensor(given.to_model_input(row[None]))[None])[:, target] for row in present])

    extra = {"interpretable_model": SkLearnLasso(alpha=1e-4)} if name == "lime" else {}
    torch.manual_seed(0)
    with torch.no_grad():
        scores = method(forward, **extra).attribute(given.to_tensor(), perturbations_per_eval=1, **options)
    return given.format_attr(scores)[0], given.format_pixel_attr(scores)[0]


def explain_call(name: str, model, x: torch.Tensor, masks: torch.Tensor, target: int):
    result = explain.explainer(name, model, seed=0, reduction="sum", **CASES[name][2])(
        x, target, segments=[masks], progress=False
    )
    return result.segment_scores[0], result.raw[0, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--masks", type=int, default=16)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    with Image.open(REPO / "data" / "images" / "chelsea.png") as image:
        picture = image.convert("RGB").resize((args.size, args.size))
    x = to_tensor(picture)[None]
    masks = rectangles(args.masks, args.size)
    with torch.no_grad():
        target = int(model(x).argmax())
    print(f"resnet18 (random weights), one {args.size} px image, {args.masks} overlapping masks, "
          f"torch threads {args.threads}, median of {args.repeats}")
    print("| method | explain s | captum ImageMaskInput s | speed-up | max abs diff (scores) | corr | max abs diff (map) |")
    print("|---|---|---|---|---|---|---|")
    for name in CASES:
        calls = {"explain": lambda n=name: explain_call(n, model, x, masks, target),
                 "captum": lambda n=name: captum_call(n, model, picture, masks, target)}
        results = {side: call() for side, call in calls.items()}  # warm-up, and the values compared
        times: dict[str, list[float]] = {side: [] for side in calls}
        for _ in range(args.repeats):
            for side, call in calls.items():
                started = time.perf_counter()
                call()
                times[side].append(time.perf_counter() - started)
        ours, theirs = results["explain"], results["captum"]
        score_diff = float((ours[0].double() - theirs[0].double()).abs().max())
        corr = float(np.corrcoef(ours[0].double().numpy(), theirs[0].double().numpy())[0, 1])
        map_diff = float((ours[1].double() - theirs[1].double()).abs().max())
        ours_s, theirs_s = statistics.median(times["explain"]), statistics.median(times["captum"])
        print(f"| {name} | {ours_s:.3f} | {theirs_s:.3f} | {theirs_s / ours_s:.1f} x | {score_diff:.1e} | "
              f"{corr:.6f} | {map_diff:.1e} |")


if __name__ == "__main__":
    main()
