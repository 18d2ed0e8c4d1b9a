"""Explain one photo with every Grad-CAM-family method and save a comparison figure.

    .venv/bin/python examples/explain_one_image.py [IMAGE] [--out out/figure.png]
"""

import argparse
from pathlib import Path

import torch
from PIL import Image

import explain

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("image", nargs="?", default=Path(__file__).parent.parent / "data/images/chelsea.png")
parser.add_argument("--out", default="out/figure.png")
args = parser.parse_args()

model, preprocess, class_names = explain.models.load("efficientnet_lite0")
x = preprocess(Image.open(args.image).convert("RGB")).unsqueeze(0)

# Every method is a function of the same activations and gradients: one pass serves them all.
results = explain.explain_together([explain.explainer(name, model) for name in explain.methods()], x)
for res in results:
    print(f"{res.method:>20}: {res.target_names[0]} ({res.probabilities[0]:.0%}) at layer {res.layers[0]}")

# The maps cover the centre crop the model saw: show them on that crop.
seen = explain.denormalize(x[0], *explain.normalization_of(preprocess))
figure = explain.plot_explanations(seen, results)
Path(args.out).parent.mkdir(parents=True, exist_ok=True)
figure.savefig(args.out, dpi=120)
print(f"saved {args.out}")
