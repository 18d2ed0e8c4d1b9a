"""explain's CAMs against pytorch-grad-cam's and torchcam's, on the same models and inputs, in one run.

    .venv/bin/python benchmarks/bench_peers.py [--repeats 5] [--slow-repeats 1] [--quick] [--only NAME] [--extra]

Every method that explain and a peer both have, on the same seeded model, images and
class ids (each image's top class):
- resnet50 (torchvision, random weights, seed 0), batch 4 at 224x224, layer4: the gradient
  and activation CAMs, against pytorch-grad-cam and, where it has them, torchcam;
- CAM on resnet18 against torchcam;
- Ablation-CAM on resnet18 and resnet50, batch 1; Score-CAM on the bundled
  efficientnet_lite0 with data/images/chelsea.png (layer bn2) and on resnet18, batch 1.
  ``--extra`` adds torchcam's SS-CAM and IS-CAM on the bundled model (2 samples each).

Time: for the cheap methods, explain's call and the peer's call run round-robin in this
process, one warm-up each, then the median of ``--repeats`` rounds. The perturbation CAMs
(a pass per channel, a minute or more for a peer) run ``--slow-repeats`` times, each call
in a fresh process, cold (no warm-up), and the median is taken. The peer's object is made
inside its timed call (milliseconds; otherwise its hooks would run during explain's calls).

Memory: each side of a case is called once more in a fresh 'spawn' process (the slow
cases reuse their timed calls). On CUDA the peak is torch.cuda.max_memory_allocated()
minus the memory allocated before the call; on CPU it is the peak resident size during
the call (VmHWM of /proc/self/status, reset through /proc/self/clear_refs just before)
minus the resident size just before. (getrusage's ru_maxrss would not do: in a spawned
child it keeps the parent's size from before the exec.) Model, inputs and imports are
not counted; a cold call's one-time costs (e.g. explain tracing the layers after a
target) are.

Agreement: both maps brought to the input size (bilinear, align_corners=False; torchcam
returns maps at layer resolution) and min-max scaled to [0, 1]; Pearson correlation of the
worst image of the batch and the largest absolute difference. For Score-CAM and IS-CAM,
explain's maps are those of weighting="channel-softmax", the peers' reading. Methods with
random noise are compared on time only.

Prints a markdown table and the goals of the issue, met or not. Other processes on the
same cores distort the numbers.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # pytorch-grad-cam's perturbation CAMs draw progress bars

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402
from PIL import Image  # noqa: E402

import explain  # noqa: E402

PHOTO = Path(__file__).resolve().parents[1] / "data" / "images" / "chelsea.png"
PGC, TORCHCAM = "pytorch-grad-cam", "torchcam"
CHANNEL_SOFTMAX = (("weighting", "channel-softmax"),)


@dataclass(frozen=True)
class Case:
    model: str  # "resnet50" / "resnet18" (random weights) or "efficientnet_lite0" (bundled, the photo)
    batch: int
    method: str  # explain's registered name
    peer: str  # PGC or TORCHCAM
    peer_class: str  # the peer's class of that method
    layer: str | None = "layer4"
    options: tuple = ()  # explain's keyword arguments, as (name, value) pairs
    agree_options: tuple | None = None  # a second explain variant, timed too, whose maps are compared
    peer_options: tuple = ()
    slow: bool = False  # a pass per channel: timed in fresh processes
    random: bool = False  # maps depend on random noise: compared on time only
    note: str = ""  # why the maps differ on purpose, where they do


def cases(quick: bool, extra: bool) -> list[Case]:
    r50 = dict(model="resnet50", batch=4)
    gradient = [
        Case(**r50, method="gradcam", peer=PGC, peer_class="GradCAM"),
        Case(**r50, method="gradcam++", peer=PGC, peer_class="GradCAMPlusPlus"),
        Case(**r50, method="xgradcam", peer=PGC, peer_class="XGradCAM"),
        Case(**r50, method="hirescam", peer=PGC, peer_class="HiResCAM"),
        Case(**r50, method="layercam", peer=PGC, peer_class="LayerCAM"),
        Case(**r50, method="gradcam-elementwise", peer=PGC, peer_class="GradCAMElementWise"),
        Case(**r50, method="eigengradcam", peer=PGC, peer_class="EigenGradCAM",
             note="principal component's sign: explain's agrees with the channel sum, the peer's is the SVD's"),
        Case(**r50, method="eigencam", peer=PGC, peer_class="EigenCAM",
             note="principal component's sign: explain's agrees with the channel sum, the peer's is the SVD's"),
        Case(**r50, method="kpcacam", peer=PGC, peer_class="KPCA_CAM",
             note="kernel component's sign: explain's agrees with the channel sum, scikit-learn's is svd_flip's"),
        Case(**r50, method="fem", peer=PGC, peer_class="FEM"),
        Case(**r50, method="shapleycam", peer=PGC, peer_class="ShapleyCAM"),
        Case(**r50, method="finercam", peer=PGC, peer_class="FinerCAM"),
        Case(**r50, method="fullgrad", peer=PGC, peer_class="FullGrad", layer=None, slow=True,
             note="the peer min-max scales each bias channel on its own and resizes with cv2; explain (as "
                  "the authors) scales over all channels of a layer, align_corners=True"),
        Case(**r50, method="gradcam", peer=TORCHCAM, peer_class="GradCAM"),
        Case(**r50, method="gradcam++", peer=TORCHCAM, peer_class="GradCAMpp",
             note="torchcam's alpha[mask].div_() divides a copy, so its alpha stays G^2 (no denominator)"),
        Case(**r50, method="xgradcam", peer=TORCHCAM, peer_class="XGradCAM"),
        Case(**r50, method="layercam", peer=TORCHCAM, peer_class="LayerCAM"),
        Case(**r50, method="smoothgradcam++", peer=TORCHCAM, peer_class="SmoothGradCAMpp", random=True),
        Case(**r50, method="cam", peer=TORCHCAM, peer_class="CAM", peer_options=(("fc_layer", "fc"),)),
        Case(model="resnet18", batch=1, method="cam", peer=TORCHCAM, peer_class="CAM",
             peer_options=(("fc_layer", "fc"),)),
    ]
    score = "Score-CAM: explain upsamples masks with align_corners=False, pytorch-grad-cam with True"
    perturbation = [
        Case(model="resnet18", batch=1, method="ablationcam", peer=PGC, peer_class="AblationCAM",
             peer_options=(("batch_size", 64),), slow=True),
        Case(model="resnet50", batch=1, method="ablationcam", peer=PGC, peer_class="AblationCAM",
             peer_options=(("batch_size", 64),), slow=True),
        Case(model="efficientnet_lite0", batch=1, method="scorecam", peer=PGC, peer_class="ScoreCAM", layer="bn2",
             agree_options=CHANNEL_SOFTMAX, peer_options=(("batch_size", 32),), slow=True, note=score),
        Case(model="resnet18", batch=1, method="scorecam", peer=PGC, peer_class="ScoreCAM",
             options=CHANNEL_SOFTMAX, peer_options=(("batch_size", 32),), slow=True, note=score),
        Case(model="efficientnet_lite0", batch=1, method="scorecam", peer=TORCHCAM, peer_class="ScoreCAM",
             layer="bn2", options=CHANNEL_SOFTMAX, peer_options=(("batch_size", 32),), slow=True,
             note="torchcam min-max scales masks at layer size, explain after upsampling"),
    ]
    if extra:
        perturbation += [
            Case(model="efficientnet_lite0", batch=1, method="sscam", peer=TORCHCAM, peer_class="SSCAM", layer="bn2",
                 options=CHANNEL_SOFTMAX + (("n_samples", 2), ("noise", 2.0)),
                 peer_options=(("num_samples", 2), ("std", 2.0)), slow=True, random=True),
            Case(model="efficientnet_lite0", batch=1, method="iscam", peer=TORCHCAM, peer_class="ISCAM", layer="bn2",
                 options=CHANNEL_SOFTMAX + (("n_samples", 2),), peer_options=(("num_samples", 2),), slow=True,
                 note="torchcam min-max scales masks at layer size, explain after upsampling"),
        ]
    if quick:
        keep = {("gradcam", PGC), ("gradcam", TORCHCAM), ("cam", TORCHCAM)}
        gradient = [c for c in gradient if (c.method, c.peer) in keep and c.model == "resnet50"]
        perturbation = [c for c in perturbation if c.model == "resnet18"]
    return gradient + perturbation


def build(model_name: str, batch: int, device: str):
    """The seeded model, its input batch and each image's top class."""
    torch.manual_seed(0)
    if model_name == "efficientnet_lite0":
        model, preprocess, _ = explain.models.load(model_name)
        x = preprocess(Image.open(PHOTO).convert("RGB")).unsqueeze(0).repeat(batch, 1, 1, 1)
    else:
        model = getattr(torchvision.models, model_name)().eval()
        x = torch.randn(batch, 3, 224, 224)
    model, x = model.to(device), x.to(device)
    with torch.no_grad():
        ids = model(x).argmax(1).tolist()
    return model, x, ids


def explain_call(case: Case, options: tuple, model, x, ids):
    kwargs = dict(options)
    if case.layer is not None:
        kwargs["target_layer"] = case.layer
    cam = explain.explainer(case.method, model, **kwargs)
    return lambda: cam(x, targets=ids).maps


def peer_call(case: Case, model, x, ids):
    options = dict(case.peer_options)
    if case.peer == PGC:
        import pytorch_grad_cam
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputReST, ClassifierOutputTarget

        cls = getattr(pytorch_grad_cam, case.peer_class)
        layers = [] if case.layer is None else [model.get_submodule(case.layer)]
        target = ClassifierOutputReST if case.method == "shapleycam" else ClassifierOutputTarget
        # FinerCAM's default (no targets): each image's top class against its 3 nearest classes.
        targets = None if case.method == "finercam" else [target(c) for c in ids]
        batch_size = options.pop("batch_size") if case.peer_class == "ScoreCAM" else None

        def call():
            with cls(model, layers, **options) as cam:
                if batch_size:
                    cam.batch_size = batch_size  # ScoreCAM reads it as an attribute
                return cam(input_tensor=x, targets=targets)
    else:
        import torchcam.methods

        cls = getattr(torchcam.methods, case.peer_class)
        uses_scores = case.peer_class in {"GradCAM", "GradCAMpp", "XGradCAM", "LayerCAM"}

        def call():
            with cls(model, case.layer, **options) as extractor:
                with torch.set_grad_enabled(uses_scores):
                    scores = model(x)
                return extractor(class_idx=ids, scores=scores if uses_scores else None)[0]
    return call


def side_calls(case: Case, model, x, ids) -> dict:
    """The zero-argument calls to time: explain's (one or two variants) and the peer's."""
    calls = {"explain": explain_call(case, case.options, model, x, ids)}
    if case.agree_options is not None:
        calls["explain-agree"] = explain_call(case, case.agree_options, model, x, ids)
    calls["peer"] = peer_call(case, model, x, ids)
    return calls


def unit_maps(maps, size) -> torch.Tensor:
    """(N, H, W) float maps at ``size``, each min-max scaled to [0, 1] (constant maps: 0)."""
    maps = torch.as_tensor(np.asarray(maps.detach().cpu() if isinstance(maps, torch.Tensor) else maps)).float()
    if tuple(maps.shape[-2:]) != tuple(size):
        maps = F.interpolate(maps[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]
    low = maps.amin(dim=(1, 2), keepdim=True)
    span = maps.amax(dim=(1, 2), keepdim=True) - low
    return torch.where(span > 0, (maps - low) / span.clamp_min(1e-30), 0.0)


def agreement(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[float, float]:
    """Pearson correlation of the worst image, and the largest absolute difference."""
    a, b = ours.flatten(1).double(), theirs.flatten(1).double()
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    correlation = (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))
    return float(correlation.min()), float((ours - theirs).abs().max())


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def resident_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def one_call(case: Case, side: str, device: str):
    """Run in a fresh process: one call of ``side``; its seconds, peak memory growth (MiB) and maps."""
    model, x, ids = build(case.model, case.batch, device)
    call = side_calls(case, model, x, ids)[side]
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the high-water mark VmHWM to the current resident size
        before = resident_kib("VmRSS")
    start = time.perf_counter()
    maps = call()
    synchronize()
    seconds = time.perf_counter() - start
    if device.startswith("cuda"):
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        peak = (resident_kib("VmHWM") - before) / 1024
    return seconds, peak, unit_maps(maps, tuple(x.shape[-2:])).numpy()


def in_fresh_process(case: Case, side: str, device: str):
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(one_call, case, side, device).result()


def interleaved(calls: dict, repeats: int):
    """Median seconds of each call, run round-robin after a warm-up, and each call's last maps."""
    outputs = {name: call() for name, call in calls.items()}  # warm-up
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            outputs[name] = call()
            synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}, outputs


def run_case(case: Case, args, built: dict) -> dict:
    """Times, peak memory and maps of each side of ``case``."""
    if case.slow:
        sides = ["explain"] + (["explain-agree"] if case.agree_options is not None else []) + ["peer"]
        runs = {side: [] for side in sides}
        for _ in range(args.slow_repeats):
            for side in sides:
                runs[side].append(in_fresh_process(case, side, args.device))
        return {side: (statistics.median(r[0] for r in results), statistics.median(r[1] for r in results),
                       torch.from_numpy(results[-1][2])) for side, results in runs.items()}
    key = (case.model, case.batch)
    if key not in built:
        built.clear()  # one model at a time
        built[key] = build(case.model, case.batch, args.device)
    model, x, ids = built[key]
    medians, outputs = interleaved(side_calls(case, model, x, ids), args.repeats)
    size = tuple(x.shape[-2:])
    return {side: (medians[side], in_fresh_process(case, side, args.device)[1], unit_maps(outputs[side], size))
            for side in medians}


def seconds(t: float) -> str:
    return f"{t * 1e3:.0f} ms" if t < 1 else f"{t:.1f} s"


def rows_of(case: Case, result: dict) -> list[dict]:
    peer_time, peer_memory, peer_maps = result["peer"]
    rows = []
    for side in [s for s in result if s != "peer"]:
        options = case.options if side == "explain" else case.agree_options
        label = case.method + "".join(f", {k}={v}" for k, v in options)
        compared = "explain-agree" if "explain-agree" in result else "explain"
        row = dict(case=case, label=label, ours=result[side][0], theirs=peer_time, ratio=result[side][0] / peer_time,
                   our_memory=result[side][1], their_memory=peer_memory, correlation=None, difference=None)
        if side == compared and not case.random:
            row["correlation"], row["difference"] = agreement(result[side][2], peer_maps)
        rows.append(row)
    return rows


def machine(device: str) -> str:
    if device.startswith("cuda"):
        where = torch.cuda.get_device_name()
    else:
        where = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                where = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        where += f", {torch.get_num_threads()} threads"
    return (f"{device} ({where}), torch {torch.__version__}, explain {explain.__version__}, "
            f"pytorch-grad-cam {version('grad-cam')}, torchcam {version('torchcam')}")


def print_table(rows: list[dict], args) -> None:
    print("| model | method | peer | explain | peer | ratio | explain peak | peer peak | correlation | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["case"]
        if "error" in r:
            print(f"| {c.model} b{c.batch} | {c.method} | {c.peer} | error: {r['error']} |||||||")
            continue
        agree = ("random: time only", "") if c.random else ("", "") if r["correlation"] is None else (
            f"{r['correlation']:.4f}", f"{r['difference']:.3f}")
        timed = f" ({args.slow_repeats}x cold)" if c.slow else ""
        print(f"| {c.model} b{c.batch} | {r['label']} | {c.peer} | {seconds(r['ours'])}{timed} | "
              f"{seconds(r['theirs'])}{timed} | {r['ratio']:.2f} | {r['our_memory']:.0f} MiB | "
              f"{r['their_memory']:.0f} MiB | {agree[0]} | {agree[1]} |")


def summary(rows: list[dict]) -> None:
    def find(model, method, peer, label=None):
        return next((r for r in rows if "error" not in r and r["case"].model == model and r["case"].method == method
                     and r["case"].peer == peer and (label is None or r["label"] == label)), None)

    goals = [("Grad-CAM, resnet50 batch 4", find("resnet50", "gradcam", PGC), 0.5),
             ("Ablation-CAM, resnet18 batch 1", find("resnet18", "ablationcam", PGC), 0.2),
             ("Ablation-CAM, resnet50 batch 1", find("resnet50", "ablationcam", PGC), 0.2),
             ("Score-CAM, bundled model + photo", find("efficientnet_lite0", "scorecam", PGC, "scorecam"), 0.5),
             ("Score-CAM, resnet18 random weights", find("resnet18", "scorecam", PGC), None)]
    print("\nGoals (explain time / pytorch-grad-cam time):")
    for name, row, goal in goals:
        if row is None:
            continue
        verdict = "reported" if goal is None else ("met" if row["ratio"] <= goal else "MISSED")
        print(f"- {name}: {row['ratio']:.2f}" + ("" if goal is None else f" (goal <= {goal})") + f": {verdict}")
    low = [r for r in rows if r.get("correlation") is not None and r["correlation"] < 0.99]
    if low:
        print("\nAgreement below 0.99:")
        for r in low:
            c = r["case"]
            print(f"- {c.model} {r['label']} vs {c.peer}: {r['correlation']:.4f}: {c.note or 'no known reason'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds for the cheap methods")
    parser.add_argument("--slow-repeats", type=int, default=1, help="cold calls for the perturbation methods")
    parser.add_argument("--quick", action="store_true", help="a few cases, one round: a smoke run")
    parser.add_argument("--extra", action="store_true", help="add torchcam's SS-CAM and IS-CAM (minutes more)")
    parser.add_argument("--only", default="", help="only the cases whose method, model or peer contains this")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    todo = [c for c in cases(args.quick, args.extra) if args.only in f"{c.method} {c.model} {c.peer}"]
    start = time.perf_counter()
    rows, built = [], {}
    for case in todo:
        try:
            rows += rows_of(case, run_case(case, args, built))
            print(f"done {case.model} {case.method} vs {case.peer}, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
        except Exception as error:  # one failing peer should not lose the rest of the run
            rows.append(dict(case=case, error=f"{type(error).__name__}: {error}"[:120]))
            print(f"FAILED {case}: {error!r}", file=sys.stderr, flush=True)
    print(f"CAMs against peers, {machine(args.device)}; median of {args.repeats} rounds after a warm-up "
          f"(perturbation CAMs: {args.slow_repeats} cold call(s), each in a fresh process)\n")
    print_table(rows, args)
    summary(rows)
    print(f"\nTotal run time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
