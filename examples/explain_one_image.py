"""Explain one photo with every method of the library and save a comparison figure.

    .venv/bin/python examples/explain_one_image.py [IMAGE] [--out out/figure.png] [--samples 4] [--batch-size 32] [--methods all]

Prints each method's prediction, layer ("input" for attributions) and time. The
perturbation CAMs cost one forward pass per channel of the layer (Score-CAM), times the
samples for SS-CAM and IS-CAM, so those two run with ``--samples`` samples (their defaults
are 35 and 10). The attributions that repeat the model many times (IG, SmoothGrad,
Occlusion, LIME, ...) run in internal batches of ``--batch-size`` rows; with every method,
the whole figure takes a few minutes on a laptop CPU.
"""

import argparse
import time
from pathlib import Path

from PIL import Image

import explain

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("image", nargs="?", default=Path(__file__).parent.parent / "data/images/chelsea.png")
parser.add_argument("--out", default="out/figure.png")
parser.add_argument("--samples", type=int, default=4, help="samples for SS-CAM and IS-CAM")
parser.add_argument("--batch-size", type=int, default=32, help="masked images per pass of the perturbation CAMs")
parser.add_argument("--methods", default="all", help="comma-separated methods, or all")
args = parser.parse_args()

model, preprocess, class_names = explain.models.load("efficientnet_lite0")
x = preprocess(Image.open(args.image).convert("RGB")).unsqueeze(0)

BATCHED_ATTRIBUTIONS = {"smoothgrad", "vargrad", "ig", "deeplift", "deepliftshap", "gradientshap", "occlusion",
                        "lime", "kernelshap", "ablation"}
results = []
for name in explain.method_names() if args.methods == "all" else args.methods.split(","):
    options = {"n_samples": args.samples} if name in ("sscam", "iscam") else {}
    if name in ("scorecam", "sscam", "iscam", "ablationcam"):
        options["batch_size"] = args.batch_size
    if name in BATCHED_ATTRIBUTIONS:
        options["internal_batch_size"] = args.batch_size
    cam = explain.explainer(name, model, **options)
    start = time.perf_counter()
    res = cam(x)
    seconds = time.perf_counter() - start
    results.append(res)
    print(f"{res.method:>20}: {res.target_names[0]} ({res.probabilities[0]:.0%}) at layer {res.layers[0]}, "
          f"{seconds:.2f} s")

# The maps cover the centre crop the model saw: show them on that crop.
seen = explain.denormalize(x[0], *explain.normalization_of(preprocess))
figure = explain.plot_explanations(seen, results, columns=8)
Path(args.out).parent.mkdir(parents=True, exist_ok=True)
figure.savefig(args.out, dpi=100)
print(f"saved {args.out}")
