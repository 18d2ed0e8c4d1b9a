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
from bench_gradcam import interleaved_medians

import explain
from explain.tokens import infer_layout


def full_backward(model, layer, x):
    """Forward with autograd everywhere and backward through the whole network, the layer's
    output reshaped to a grid afterwards (pytorch-grad-cam's recipe with reshape_transform)."""
    store = {}
    handles = [layer.register_forward_hook(lambda m, a, out: store.__setitem__("activation", out))]
    try:
        x = x.clone().requires_grad_()
        logits = model(x)
        store["activation"].retain_grad()
        logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    layout = infer_layout(tuple(store["activation"].shape), tuple(x.shape[-2:]), model)
    activation, gradient = layout.to_spatial(store["activation"]), layout.to_spatial(store["activation"].grad)
    return torch.relu((gradient.mean(dim=(2, 3), keepdim=True) * activation).sum(1))


def bench(name, model, x, repeats, attention):
    model = model.to(x.device).eval()
    cam = explain.GradCAM(model)
    cam(x[:1])  # resolve the automatic layer outside the timings
    layer = next(iter(cam.target_layers(x).values()))

    def forward():
        with torch.no_grad():
            model(x)

    functions = {"forward": forward, "Grad-CAM": lambda: cam(x), "full backward": lambda: full_backward(model, layer, x)}
    if attention:
        for method in (explain.AttentionRollout(model), explain.AttentionRelevance(model), explain.LeGrad(model)):
            functions[method.name] = lambda method=method: method(x)
    return name, interleaved_medians(functions, repeats)


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
