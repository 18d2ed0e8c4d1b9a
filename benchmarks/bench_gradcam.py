"""Cost of a Grad-CAM relative to a plain no-grad forward pass, measured in the same run.

    .venv/bin/python benchmarks/bench_gradcam.py [--repeats 7] [--batch 8] [--device cpu]

Three timings per model, run round-robin, median of ``--repeats`` rounds after a warm-up:
- forward: ``model(x)`` under ``torch.no_grad()``, the baseline;
- explain: ``explain.GradCAM(model)(x)``, maps scaled to the input size included;
- full backward: the usual hook recipe (forward with autograd on, backward to every
  parameter), for comparison with what peers do.
Prints a markdown table with each time divided by the forward time.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torchvision

import explain
from explain.tokens import infer_layout


def interleaved_medians(functions: dict, repeats: int, warm_up: bool = True) -> dict[str, float]:
    """Median seconds of each function, run round-robin so that load drift on the machine
    hits every one of them alike; after one warm-up call of each unless ``warm_up`` is off."""
    for fn in functions.values() if warm_up else ():
        fn()
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def full_backward(model, layer, x):
    """Forward with autograd everywhere and backward through the whole network; a token or
    channels-last output is read as a grid (pytorch-grad-cam's recipe with reshape_transform)."""
    store = {}
    handles = [
        layer.register_forward_hook(lambda m, a, out: store.__setitem__("activation", out)),
        layer.register_full_backward_hook(lambda m, gi, go: store.__setitem__("gradient", go[0])),
    ]
    try:
        logits = model(x)
        logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    layout = infer_layout(tuple(store["activation"].shape), tuple(x.shape[2:]), model)
    activation, gradient = layout.to_spatial(store["activation"]), layout.to_spatial(store["gradient"])
    space = tuple(range(2, gradient.dim()))  # (h, w); (d, h, w) for volumes, (l,) for signals
    return torch.relu((gradient.mean(dim=space, keepdim=True) * activation).sum(1))


def timings(model, x, repeats, extra: dict | None = None) -> dict[str, float]:
    """Median seconds of a no-grad forward, explain's Grad-CAM at the automatic layer, the
    full-backward recipe and the ``extra`` functions, round-robin."""
    model = model.to(x.device).eval()
    cam = explain.GradCAM(model)
    cam(x[:1])  # resolve the automatic layer outside the timings
    layer = next(iter(cam.target_layers(x).values()))

    def forward():
        with torch.no_grad():
            model(x)

    functions = {"forward": forward, "Grad-CAM": lambda: cam(x), "full backward": lambda: full_backward(model, layer, x)}
    return interleaved_medians({**functions, **(extra or {})}, repeats)


def bench(name, model, x, repeats):
    medians = timings(model, x, repeats)
    return name, medians["forward"], medians["Grad-CAM"], medians["full backward"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device=args.device)
    bundled, _, _ = explain.models.load("efficientnet_lite0")
    rows = [
        bench("resnet50 (random weights)", torchvision.models.resnet50(), x, args.repeats),
        bench("efficientnet_lite0 (bundled)", bundled, x, args.repeats),
    ]
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"Grad-CAM cost, batch {args.batch} at 224x224, {args.device} ({device}), torch {torch.__version__}, "
          f"median of {args.repeats}\n")
    print("| model | no-grad forward | explain Grad-CAM | ratio | full forward+backward | ratio |")
    print("|---|---|---|---|---|---|")
    for name, base, ours, peer in rows:
        print(f"| {name} | {base * 1e3:.0f} ms | {ours * 1e3:.0f} ms | {ours / base:.2f} | {peer * 1e3:.0f} ms | {peer / base:.2f} |")


if __name__ == "__main__":
    main()
