"""Cost of explaining volume, video and signal models relative to a plain no-grad forward
pass, in one run.

    .venv/bin/python benchmarks/bench_volumes.py [--repeats 5] [--batch 2] [--device cpu]

torchvision's r3d_18 (random weights, nothing downloaded) on clips of 16 frames at 112x112,
batch ``--batch``; and a 1-D CNN for signals (four convolution blocks of 64 channels,
12-lead signals of 5,000 steps, ECG-like), batch ``8 * --batch``. Timings per model, run
round-robin, median of ``--repeats`` rounds after a warm-up:

- forward: ``model(x)`` under ``torch.no_grad()``, the baseline;
- Grad-CAM: ``explain.GradCAM(model)(x)`` at the automatic layer (r3d_18's ``layer4``), the
  maps scaled to the input's size (trilinear, linear) included; goal at most 1.15;
- full backward: the usual recipe (forward with autograd everywhere, backward to every
  parameter), for comparison with what peers do;
- Saliency (the input gradient, a backward pass through the whole model), for scale.
"""

from __future__ import annotations

import argparse
import platform

import torch
import torchvision
from bench_gradcam import timings
from torch import nn

import explain


def signal_cnn(leads: int = 12, width: int = 64, classes: int = 5) -> nn.Sequential:
    """Four strided convolution blocks, global average pooling and a linear head."""
    blocks: list[nn.Module] = []
    channels = leads
    for _ in range(4):
        blocks += [nn.Conv1d(channels, width, 7, stride=2, padding=3), nn.BatchNorm1d(width), nn.ReLU()]
        channels = width
    return nn.Sequential(*blocks, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(width, classes))


def bench(name, model, x, repeats):
    saliency = explain.Saliency(model.eval())
    return name, timings(model, x, repeats, {"Saliency": lambda: saliency(x)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    clips = torch.randn(args.batch, 3, 16, 112, 112, device=args.device)
    signals = torch.randn(8 * args.batch, 12, 5000, device=args.device)
    rows = [
        bench("r3d_18 (random weights), 16 x 112 x 112", torchvision.models.video.r3d_18(), clips, args.repeats),
        bench(f"1-D CNN, 12 x 5000, batch {8 * args.batch}", signal_cnn(), signals, args.repeats),
    ]
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"Volume and signal explanation cost, {args.device} ({device}), torch {torch.__version__}, "
          f"median of {args.repeats}\n")
    print("| model | method | time | / no-grad forward |")
    print("|---|---|---|---|")
    for name, medians in rows:
        base = medians["forward"]
        for method, seconds in medians.items():
            ratio = f"**{seconds / base:.2f}**" if method == "Grad-CAM" else f"{seconds / base:.2f}"
            print(f"| {name} | {method} | {seconds * 1e3:.0f} ms | {ratio} |")


if __name__ == "__main__":
    main()
