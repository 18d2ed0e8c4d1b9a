"""RISE, XRAI and extremal perturbations against their bare passes and against their
anchors (PAIR's ``saliency`` for XRAI, TorchRay for RISE and extremal perturbations), in one run.

    .venv/bin/python benchmarks/bench_anchors.py [--repeats 3] [--batch 2] [--only TEXT] [--device cpu]
        [--masks 4000] [--steps 800] [--xrai-steps 100]

On the bundled efficientnet_lite0 and the first ``--batch`` photos of data/images (224 x 224):

- **bare passes**: the model passes the method runs, and nothing else, in batches of the
  size the method chose: RISE's ``n_masks`` masked copies forward under no_grad, XRAI's
  2 x ``steps`` path points forward and backward, extremal perturbation's ``steps`` passes of
  ``len(areas)`` rows forward and backward. The goal: each method at most 1.2 x its passes.
- **anchor**: the same settings in TorchRay's ``rise`` / ``extremal_perturbation`` (one image
  a call, as they take) and PAIR's ``XRAI.GetMask`` (numpy, one image a call, batch of 32),
  where the package is installed (the ``anchors`` extra). TorchRay's RISE draws other masks
  and weights by the sigmoid; its cost is what is compared.

PAIR's calls take NHWC numpy arrays; permuted back to NCHW they are channels-last tensors,
whose convolutions run about 28 % faster on this CPU for the bundled model (forward +
backward, batch 32), for any method. The gradient function makes them contiguous, as every
other call's inputs are, so that the methods are compared and not the memory layouts
(``--channels-last`` leaves them as they come).

Calls run round-robin after a warm-up, the median of ``--repeats`` rounds (bench_gradcam's
``interleaved_medians``). The anchors are slow on a CPU: lower ``--masks``/``--steps`` there.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import explain

sys.path.insert(0, str(Path(__file__).parent))
from bench_gradcam import interleaved_medians  # noqa: E402


def bare_rise(model, x, n_masks, rows):
    def run():
        with torch.no_grad():
            for image in x:
                for start in range(0, n_masks, rows):
                    model(image[None].expand(min(rows, n_masks - start), -1, -1, -1) * 0.5)

    return run


def bare_gradients(model, x, count, rows, path=False):
    """``count`` rows per image forward and backward, ``rows`` at a time: copies of the image,
    or (``path``) XRAI's points, ``count / 2`` on each straight line from the image's
    minimum and maximum to it."""

    def run():
        for image in x:
            if path:
                alphas = torch.linspace(0, 1, count // 2, device=image.device).view(-1, 1, 1, 1)
                rows_of = torch.cat([end + alphas * (image - end) for end in (image.min(), image.max())])
            for start in range(0, count, rows):
                size = min(rows, count - start)
                batch = rows_of[start : start + size] if path else image[None].repeat(size, 1, 1, 1)
                batch = batch.clone().requires_grad_(True)
                torch.autograd.grad(model(batch)[:, 0].sum(), batch)

    return run


def anchor_calls(model, x, ids, args) -> dict:
    calls = {}
    try:
        from torchray.attribution.extremal_perturbation import extremal_perturbation
        from torchray.attribution.rise import rise

        def torchray_rise():
            with torch.no_grad():
                for i in range(len(x)):
                    rise(model, x[i : i + 1], num_masks=args.masks, batch_size=args.rows)

        def torchray_extremal():
            for i in range(len(x)):
                extremal_perturbation(model, x[i : i + 1], int(ids[i]), areas=[0.05, 0.1, 0.2], max_iter=args.steps)
            for p in model.parameters():  # TorchRay leaves them frozen
                p.requires_grad_(True)

        calls["rise"], calls["extremal"] = torchray_rise, torchray_extremal
    except ImportError:
        print("TorchRay is not installed: no anchor for rise and extremal", file=sys.stderr)
    try:
        import saliency.core as sc

        def gradients(batch, call_model_args=None, expected_keys=None):
            t = torch.tensor(np.asarray(batch), dtype=torch.float32, device=x.device).permute(0, 3, 1, 2)
            if not args.channels_last:
                t = t.contiguous()
            t.requires_grad_(True)
            (g,) = torch.autograd.grad(model(t)[:, call_model_args].sum(), t)
            return {sc.INPUT_OUTPUT_GRADIENTS: g.permute(0, 2, 3, 1).cpu().numpy()}

        def pair_xrai():
            for i in range(len(x)):
                sc.XRAI().GetMask(x[i].permute(1, 2, 0).cpu().double().numpy(), gradients, call_model_args=int(ids[i]),
                                  batch_size=32, extra_parameters=sc.XRAIParameters(steps=args.xrai_steps))

        calls["xrai"] = pair_xrai
    except ImportError:
        print("PAIR's saliency is not installed: no anchor for xrai", file=sys.stderr)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--only", default="")
    parser.add_argument("--masks", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--xrai-steps", type=int, default=100)
    parser.add_argument("--rows", type=int, default=32, help="inner batch of every call")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-anchors", action="store_true")
    parser.add_argument("--channels-last", action="store_true",
                        help="hand PAIR's NHWC arrays to the model as they come (a channels-last view)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, preprocess, _ = explain.models.load("efficientnet_lite0")
    model = model.to(args.device).eval()
    photos = sorted(p for p in (Path(__file__).parents[1] / "data" / "images").iterdir() if p.suffix in (".png", ".jpg"))
    x = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in photos[: args.batch]]).to(args.device)
    with torch.no_grad():
        ids = model(x).argmax(dim=1)
    rows = args.rows
    methods = {
        "rise": (explain.RISE(model, n_masks=args.masks, internal_batch_size=rows), bare_rise(model, x, args.masks, rows)),
        "xrai": (explain.XRAI(model, steps=args.xrai_steps, internal_batch_size=rows),
                 bare_gradients(model, x, 2 * args.xrai_steps, rows, path=True)),
        "extremal": (explain.ExtremalPerturbation(model, steps=args.steps, internal_batch_size=3),
                     bare_gradients(model, x, 3 * args.steps, 3)),
    }  # fmt: skip
    anchors = {} if args.no_anchors else anchor_calls(model, x, ids, args)
    table = []
    for name, (method, bare) in methods.items():
        if args.only not in name:
            continue
        calls = {"explain": lambda method=method: method(x, ids.tolist()), "passes": bare}
        if name in anchors:
            calls["anchor"] = anchors[name]
        medians = interleaved_medians(calls, args.repeats)
        table.append((name, medians))
        print(name, {k: round(v, 3) for k, v in medians.items()}, file=sys.stderr)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"Anchored methods, batch {args.batch} at 224x224, {args.device} ({device}), torch {torch.__version__}\n")
    print("| method | bare passes | explain | explain / passes | anchor | explain / anchor |")
    print("|---|---|---|---|---|---|")
    for name, m in table:
        anchor = m.get("anchor")
        anchor_cells = f"{anchor:.2f} s | {m['explain'] / anchor:.2f}" if anchor else "- | -"
        print(f"| {name} | {m['passes']:.2f} s | {m['explain']:.2f} s | {m['explain'] / m['passes']:.2f} | {anchor_cells} |")


if __name__ == "__main__":
    main()
