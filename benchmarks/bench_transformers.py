"""Cost of explaining vision transformers relative to a plain no-grad forward pass, in one run.

    .venv/bin/python benchmarks/bench_transformers.py [--repeats 5] [--batch 4] [--device cpu]

torchvision's ViT-B/16 and Swin-T with random weights (nothing is downloaded), batch 4 at
224x224. Timings per model, run round-robin, median of ``--repeats`` rounds after a warm-up:

- forward: ``model(x)`` under ``torch.no_grad()``, the baseline (fused attention kernels);
- Grad-CAM: ``explain.GradCAM(model)(x)`` at the automatic layer (the last block's first
  norm), maps scaled to the input size included; goal at most 1.15;
- full backward: the usual recipe (forward with autograd everywhere, backward to every
  parameter, a reshape of the tokens), for comparison with what peers do;
- the attention methods (ViT only): rollout (goal: about one forward), gradient-weighted
  attention relevance and LeGrad.
"""

from __future__ import annotations

import argparse
import platform

import torch
import torchvision
from bench_gradcam import timings

import explain


def bench(name, model, x, repeats, attention):
    extra = {}
    if attention:
        for method in (explain.AttentionRollout(model), explain.AttentionRelevance(model), explain.LeGrad(model)):
            extra[method.name] = lambda method=method: method(x)
    return name, timings(model, x, repeats, extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device=args.device)
    vit = torchvision.models.vit_b_16()
    torch.nn.init.normal_(vit.heads.head.weight, std=0.02)  # torchvision starts the head at zero
    rows = [
        bench("vit_b_16 (random weights)", vit, x, args.repeats, attention=True),
        bench("swin_t (random weights)", torchvision.models.swin_t(), x, args.repeats, attention=False),
    ]
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"Transformer explanation cost, batch {args.batch} at 224x224, {args.device} ({device}), "
          f"torch {torch.__version__}, median of {args.repeats}\n")
    print("| model | method | time | / no-grad forward |")
    print("|---|---|---|---|")
    for name, medians in rows:
        base = medians["forward"]
        for method, seconds in medians.items():
            ratio = f"**{seconds / base:.2f}**" if method in ("Grad-CAM", "attention-rollout") else f"{seconds / base:.2f}"
            print(f"| {name} | {method} | {seconds * 1e3:.0f} ms | {ratio} |")


if __name__ == "__main__":
    main()
