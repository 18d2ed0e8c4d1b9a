"""explain's CAMs against pytorch-grad-cam's and torchcam's, on the same models and inputs, in one run.

    .venv/bin/python benchmarks/bench_peers.py [--repeats 5] [--slow-repeats 1] [--quick] [--only TEXT] [--extra]

Every method that explain and a peer both have, on the same seeded model, images and
class ids (each image's top class):
- resnet50 (torchvision, random weights, seed 0), batch 4 at 224x224, layer4: the gradient
  and activation CAMs and FullGrad against pytorch-grad-cam, and against torchcam where it
  has them; CAM on resnet18 against torchcam;
- the CAMs of pytorch-grad-cam 1.5.7 and torchcam 0.5.0 on resnet50 batch 4: RefineCAM
  (layer2, layer3, layer4; against both), Seg-Eigen-CAM (layer3), Sobel-CAM (no layer:
  pytorch-grad-cam's is the filter alone, on uint8 images made from the input tensor;
  explain's call also runs the model once, for the result's logits and targets, so it is
  timed three ways: the call, the filter alone (``sobel_edges``), and the call against the
  peer's filter plus the no-grad forward pass its user runs for the same scores);
  SESS on resnet18 batch 1 (layer3, 3 scales); Deep Feature Factorization (layer4, 16
  concepts, every concept's map compared), with the scikit-learn NMF alone timed beside it
  (the same NMF is both sides' work);
- Ablation-CAM on resnet18 and resnet50, batch 1, layer4, and on resnet18 at layer3 and
  layer4 together; Score-CAM on the bundled
  efficientnet_lite0 with data/images/chelsea.png (layer bn2; explain timed with both
  weightings) and on resnet18 (channel-softmax), batch 1. ``--extra`` adds torchcam's
  Score-CAM, SS-CAM and IS-CAM (2 samples each) on the bundled model: about 10 minutes more.

Time: for the cheap methods, explain's call and the peer's call run round-robin in this
process, one warm-up each, then the median of ``--repeats`` rounds. The perturbation CAMs
and FullGrad (tens of seconds to minutes a call) run ``--slow-repeats`` times, each call in
a fresh process, cold (no warm-up), and the median is taken. The peer's object is made
inside its timed call (milliseconds; otherwise its hooks would run during explain's calls).

Memory: each side of a cheap case is called once more in a fresh 'spawn' process (the two
sides side by side); the slow cases reuse their timed calls. On CUDA the peak is
torch.cuda.max_memory_allocated() minus the memory allocated before the call; on CPU it
is the peak resident size during the call (VmHWM of /proc/self/status, reset through
/proc/self/clear_refs just before) minus the resident size just before. (getrusage's
ru_maxrss would not do: in a spawned child it keeps the parent's size from before the
exec.) Model, inputs and imports are not counted; a cold call's one-time costs (explain
tracing the layers after a target, say) are.

Agreement: both maps at the input size (bilinear, align_corners=False: torchcam's are at
layer size) and min-max scaled to [0, 1]; Pearson correlation of the batch's worst image
and the largest absolute difference. For Score-CAM and IS-CAM, explain's maps are those of
weighting="channel-softmax", the peers' reading. Random methods: time only.

Prints a markdown table and the issue's goals, met or not. Other processes on the same
cores distort the numbers.
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
SOFTMAX = (("weighting", "channel-softmax"),)
SIGN = "sign of the principal component: explain's agrees with the channel sum, the peer's is arbitrary"
MASKS = "masks upsampled with align_corners=True by pytorch-grad-cam, False by explain"
REFINED = ("layer2", "layer3", "layer4")
TC_MASKS = "torchcam min-max scales the masks at layer size, explain after upsampling"


@dataclass(frozen=True)
class Case:
    method: str  # explain's registered name
    peer: str  # PGC or TORCHCAM
    peer_class: str  # the peer's class for that method
    model: str = "resnet50"  # resnet50 / resnet18 (random weights) or efficientnet_lite0 (bundled, the photo)
    batch: int = 4
    layer: str | tuple | None = "layer4"  # a tuple: several layers (RefineCAM, Ablation-CAM)
    options: tuple = ()  # explain's keyword arguments, as (name, value) pairs
    agree_options: tuple | None = None  # a second explain variant, timed too; its maps are the ones compared
    peer_options: tuple = ()
    slow: bool = False  # timed in fresh processes, cold
    random: bool = False  # maps depend on random noise: compared on time only
    note: str = ""  # why the maps differ on purpose, where they do


def cases(quick: bool, extra: bool) -> list[Case]:
    fc = (("fc_layer", "fc"),)
    todo = [
        Case("gradcam", PGC, "GradCAM"),
        Case("gradcam++", PGC, "GradCAMPlusPlus", note="pytorch-grad-cam adds 1e-6 to alpha's denominator"),
        Case("xgradcam", PGC, "XGradCAM"),
        Case("hirescam", PGC, "HiResCAM"),
        Case("layercam", PGC, "LayerCAM"),
        Case("gradcam-elementwise", PGC, "GradCAMElementWise"),
        Case("eigengradcam", PGC, "EigenGradCAM", note=SIGN),
        Case("eigencam", PGC, "EigenCAM", note=SIGN),
        Case("kpcacam", PGC, "KPCA_CAM", note=SIGN),
        Case("fem", PGC, "FEM"),
        Case("shapleycam", PGC, "ShapleyCAM"),
        Case("finercam", PGC, "FinerCAM"),
        Case("fullgrad", PGC, "FullGrad", layer=None, slow=True,
             note="pytorch-grad-cam min-max scales each bias channel alone; explain each layer's channels "
                  "together, as the authors"),
        Case("gradcam", TORCHCAM, "GradCAM"),
        Case("gradcam++", TORCHCAM, "GradCAMpp", note="torchcam's alpha[mask].div_() divides a copy: alpha = G^2"),
        Case("xgradcam", TORCHCAM, "XGradCAM"),
        Case("layercam", TORCHCAM, "LayerCAM"),
        Case("smoothgradcam++", TORCHCAM, "SmoothGradCAMpp", random=True),
        Case("cam", TORCHCAM, "CAM", peer_options=fc),
        Case("cam", TORCHCAM, "CAM", model="resnet18", batch=1, peer_options=fc),
        Case("ablationcam", PGC, "AblationCAM", model="resnet18", batch=1, peer_options=(("batch_size", 64),),
             slow=True),
        Case("ablationcam", PGC, "AblationCAM", batch=1, peer_options=(("batch_size", 64),), slow=True),
        Case("ablationcam", PGC, "AblationCAM", model="resnet18", batch=1, layer=("layer3", "layer4"),
             peer_options=(("batch_size", 64),), slow=True),
        Case("refinecam", PGC, "RefineCAM", layer=REFINED),
        Case("refinecam", TORCHCAM, "RefineCAM", layer=REFINED, note="torchcam scales the maps at layer2's size"),
        Case("segeigencam", PGC, "SegEigenCAM", layer="layer3"),
        Case("sess", PGC, "SESS", model="resnet18", batch=1, layer="layer3", options=(("num_scales", 3),),
             peer_options=(("num_scales", 3),), note="3 scales of the 12 (9 patches), to keep the run short"),
        Case("sobelcam", PGC, "sobel_cam", layer=None,
             note="explain's call includes the model's forward pass (the logits and targets of the result)"),
        Case("dff", PGC, "DeepFeatureFactorization", options=(("n_components", 16),)),
        Case("scorecam", PGC, "ScoreCAM", model="efficientnet_lite0", batch=1, layer="bn2", agree_options=SOFTMAX,
             peer_options=(("batch_size", 32),), slow=True, note=MASKS),
        Case("scorecam", PGC, "ScoreCAM", model="resnet18", batch=1, options=SOFTMAX,
             peer_options=(("batch_size", 32),), slow=True, note=MASKS),
    ]
    bundled = dict(model="efficientnet_lite0", batch=1, layer="bn2", slow=True)
    if extra:
        todo += [
            Case("scorecam", TORCHCAM, "ScoreCAM", **bundled, options=SOFTMAX, peer_options=(("batch_size", 32),),
                 note=TC_MASKS),
            Case("sscam", TORCHCAM, "SSCAM", **bundled, options=SOFTMAX + (("n_samples", 2), ("noise", 2.0)),
                 peer_options=(("num_samples", 2), ("std", 2.0)), random=True),
            Case("iscam", TORCHCAM, "ISCAM", **bundled, options=SOFTMAX + (("n_samples", 2),),
                 peer_options=(("num_samples", 2),), note=TC_MASKS),
        ]
    if quick:  # one case of each kind, the cheapest
        todo = [c for c in todo if (c.model == "resnet18" and c.method != "scorecam") or c == todo[0]]
    return todo


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
    named = list(case.layer) if isinstance(case.layer, tuple) else case.layer
    layer = {} if case.layer is None else {"target_layer": named}
    cam = explain.explainer(case.method, model, **layer, **dict(options))
    if case.method == "dff":  # no targets: (N, k) maps, one per concept, as (N * k, H, W)
        return lambda: cam(x).maps.flatten(0, 1)
    return lambda: cam(x, targets=ids).maps


def nmf_alone(case: Case, model, x):
    """The scikit-learn NMF of DFF on the layer's activations (captured once, outside the timing)."""
    from sklearn.decomposition import NMF

    captured = explain.DeepFeatureFactorization(model, case.layer).capture(x)
    activations = next(iter(captured.activations.values()))
    matrix = activations.transpose(0, 1).flatten(1).cpu().numpy()
    matrix = matrix - matrix.min(axis=1, keepdims=True)
    components = dict(case.options)["n_components"]

    def call():
        nmf = NMF(n_components=components, init="random", random_state=0)
        nmf.fit_transform(matrix)
        return torch.from_numpy(nmf.components_).reshape(-1, *activations.shape[2:])  # (k * N, h, w)
    return call


def peer_with_forward(peer, model, x):
    """The peer's call and the no-grad forward pass that gives its user the scores and targets."""
    def call():
        with torch.no_grad():
            model(x)
        return peer()
    return call


def peer_call(case: Case, model, x, ids):
    options = dict(case.peer_options)
    if case.peer == PGC:
        import pytorch_grad_cam
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputReST, ClassifierOutputTarget

        if case.peer_class == "sobel_cam":  # a function of a uint8 RGB image
            from pytorch_grad_cam.sobel_cam import sobel_cam

            def edges():
                rgb = (x - x.amin()) / (x.amax() - x.amin()) * 255
                return np.stack([sobel_cam(image.permute(1, 2, 0).round().byte().cpu().numpy()) for image in rgb])
            return edges
        if case.peer_class == "DeepFeatureFactorization":
            def concepts():
                dff = pytorch_grad_cam.DeepFeatureFactorization(model, model.get_submodule(case.layer),
                                                                computation_on_concepts=model.fc)
                try:
                    maps = dff(x, n_components=dict(case.options)["n_components"])[1]
                finally:
                    dff.activations_and_grads.release()
                return np.stack(maps).reshape(-1, *x.shape[2:])
            return concepts
        cls = getattr(pytorch_grad_cam, case.peer_class)
        names = case.layer if isinstance(case.layer, tuple) else () if case.layer is None else (case.layer,)
        layers = [model.get_submodule(name) for name in names]
        target = ClassifierOutputReST if case.method == "shapleycam" else ClassifierOutputTarget
        # FinerCAM without targets: each image's top class (= ids) against its 3 nearest classes.
        targets = None if case.method == "finercam" else [target(c) for c in ids]
        batch_size = options.pop("batch_size") if case.peer_class == "ScoreCAM" else None

        def call():
            cam = cls(model, layers, **options)
            if not hasattr(cam, "__enter__"):  # RefineCAM
                return cam(input_tensor=x, targets=targets)
            with cam:
                if batch_size:
                    cam.batch_size = batch_size  # ScoreCAM reads it as an attribute
                return cam(input_tensor=x, targets=targets)
    else:
        import torchcam.methods

        cls = getattr(torchcam.methods, case.peer_class)
        uses_scores = case.peer_class in {"GradCAM", "GradCAMpp", "XGradCAM", "LayerCAM", "RefineCAM"}
        layer = list(case.layer) if isinstance(case.layer, tuple) else case.layer

        def call():
            with cls(model, layer, **options) as extractor:
                with torch.set_grad_enabled(uses_scores):
                    scores = model(x)
                return extractor(class_idx=ids, scores=scores if uses_scores else None)[0]
    return call


def side_calls(case: Case, model, x, ids) -> dict:
    """The calls to time: explain's (one or two variants) and the peer's."""
    calls = {"explain": explain_call(case, case.options, model, x, ids)}
    if case.agree_options is not None:
        calls["explain-agree"] = explain_call(case, case.agree_options, model, x, ids)
    calls["peer"] = peer_call(case, model, x, ids)
    if case.method == "sobelcam":  # explain's filter alone; the peer's filter with the forward pass
        from explain.methods.gradient_free_cams import sobel_edges

        calls["explain:filter alone"] = lambda: sobel_edges(x)
        calls["peer:with a no-grad forward"] = peer_with_forward(calls["peer"], model, x)
    if case.method == "dff":
        calls["explain:scikit-learn NMF alone"] = nmf_alone(case, model, x)
    return calls


def unit_maps(maps, size) -> torch.Tensor:
    """(N, H, W) float maps at ``size``, each min-max scaled to [0, 1] (a constant map: zeros)."""
    maps = (maps.detach().cpu() if isinstance(maps, torch.Tensor) else torch.from_numpy(np.asarray(maps))).float()
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


def status_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (the peak since the last reset) of this process, in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def one_call(case: Case, side: str, device: str):
    """In a fresh process: one call of ``side``; its seconds, peak memory growth (MiB) and maps."""
    model, x, ids = build(case.model, case.batch, device)
    call = side_calls(case, model, x, ids)[side]
    gc.collect()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = status_kib("VmRSS") / 1024
    start = time.perf_counter()
    maps = call()
    synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else status_kib("VmHWM") / 1024
    return seconds, peak - before, unit_maps(maps, tuple(x.shape[-2:])).numpy()


def in_fresh_processes(case: Case, sides: list[str], device: str) -> dict:
    """``one_call`` of each side, each in a new process, all at the same time."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(sides), mp_context=context, max_tasks_per_child=1) as pool:
        futures = {side: pool.submit(one_call, case, side, device) for side in sides}
        return {side: future.result() for side, future in futures.items()}


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
    """``{side: (median seconds, peak MiB, unit maps)}`` for each side of ``case``."""
    if case.slow:
        sides = ["explain"] + (["explain-agree"] if case.agree_options is not None else []) + ["peer"]
        runs = {side: [] for side in sides}
        for _ in range(args.slow_repeats):
            for side in sides:  # one at a time: these are the timings
                runs[side].append(in_fresh_processes(case, [side], args.device)[side])
        return {side: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs),
                       torch.from_numpy(rs[-1][2])) for side, rs in runs.items()}
    if (case.model, case.batch) not in built:
        built.clear()  # one model in memory at a time
        built[case.model, case.batch] = build(case.model, case.batch, args.device)
    model, x, ids = built[case.model, case.batch]
    medians, outputs = interleaved(side_calls(case, model, x, ids), args.repeats)
    memory = in_fresh_processes(case, list(medians), args.device)
    return {side: (medians[side], memory[side][1], unit_maps(outputs[side], tuple(x.shape[-2:]))) for side in medians}


def rows_of(case: Case, result: dict) -> list[dict]:
    """A row per explain side against the peer; a row of explain's call against each peer variant."""
    peer_time, peer_memory, peer_maps = result.pop("peer")
    variants = {side: result.pop(side) for side in list(result) if side.startswith("peer:")}
    rows = []
    for side, (ours, memory, maps) in result.items():
        options = case.agree_options if side == "explain-agree" else case.options
        label = case.method + "".join(f", {k}={v}" for k, v in options)
        label += f" ({side.split(':', 1)[1]})" if side.startswith("explain:") else ""
        row = dict(case=case, label=label, ours=ours,
                   theirs=peer_time, our_memory=memory, their_memory=peer_memory, correlation=None)
        compared = "explain-agree" if case.agree_options is not None else "explain"
        if side == compared and not case.random:
            row["correlation"], row["difference"] = agreement(maps, peer_maps)
        rows.append(row)
    ours, memory, _ = result["explain"]
    for side, (theirs, their_memory, _) in variants.items():
        rows.append(dict(case=case, label=f"{case.method} (peer {side.split(':', 1)[1]})", ours=ours, theirs=theirs,
                         our_memory=memory, their_memory=their_memory, correlation=None))
    return rows


def machine(device: str) -> str:
    if device.startswith("cuda"):
        where = torch.cuda.get_device_name()
    else:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
        names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
        where = f"{names[0] if names else platform.processor()}, {torch.get_num_threads()} threads"
    return (f"{device} ({where}), torch {torch.__version__}, explain {explain.__version__}, "
            f"pytorch-grad-cam {version('grad-cam')}, torchcam {version('torchcam')}")


def print_table(rows: list[dict], args) -> None:
    print("| model | method | peer | explain | peer | ratio | explain peak | peer peak | correlation | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    seconds = lambda t: f"{t * 1e3:.0f} ms" if t < 1 else f"{t:.1f} s"  # noqa: E731
    for r in rows:
        c = r["case"]
        start = f"| {c.model} b{c.batch} | {r.get('label', c.method)} | {c.peer} |"
        if "error" in r:
            print(f"{start} error: {r['error']} | | | | | | |")
            continue
        cold = f" ({args.slow_repeats}x cold)" if c.slow else ""
        agree = "random: time only | " if c.random else " | " if r["correlation"] is None else (
            f"{r['correlation']:.4f} | {r['difference']:.3f}")
        print(f"{start} {seconds(r['ours'])}{cold} | {seconds(r['theirs'])}{cold} | {r['ours'] / r['theirs']:.2f} | "
              f"{r['our_memory']:.0f} MiB | {r['their_memory']:.0f} MiB | {agree} |")


def summary(rows: list[dict]) -> None:
    def ratio(model, method, label):
        row = next((r for r in rows if "error" not in r and r["case"].peer == PGC and r["case"].model == model
                    and r["case"].method == method and r["label"] == label), None)
        return None if row is None else row["ours"] / row["theirs"]

    goals = [("Grad-CAM, resnet50 batch 4", ratio("resnet50", "gradcam", "gradcam"), 0.5),
             ("Ablation-CAM, resnet18 batch 1", ratio("resnet18", "ablationcam", "ablationcam"), 0.2),
             ("Ablation-CAM, resnet50 batch 1", ratio("resnet50", "ablationcam", "ablationcam"), 0.2),
             ("Score-CAM, bundled model and photo", ratio("efficientnet_lite0", "scorecam", "scorecam"), 0.5),
             ("Score-CAM, resnet18 random weights (channel-softmax)",
              ratio("resnet18", "scorecam", "scorecam, weighting=channel-softmax"), None)]
    print("\nGoals, explain's time / pytorch-grad-cam's:")
    for name, value, goal in goals:
        if value is not None:
            verdict = "no goal" if goal is None else f"goal <= {goal}: " + ("met" if value <= goal else "MISSED")
            print(f"- {name}: {value:.2f} ({verdict})")
    low = [r for r in rows if r.get("correlation") is not None and r["correlation"] < 0.99]
    if low:
        print("\nAgreement below 0.99:")
        for r in low:
            c = r["case"]
            print(f"- {c.model} {r['label']} vs {c.peer}: {r['correlation']:.4f}: {c.note or 'no known reason'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds for the cheap methods")
    parser.add_argument("--slow-repeats", type=int, default=1, help="cold calls for the perturbation CAMs and FullGrad")
    parser.add_argument("--quick", action="store_true", help="Grad-CAM, CAM and Ablation-CAM only, one round")
    parser.add_argument("--extra", action="store_true", help="add torchcam's Score-CAM, SS-CAM and IS-CAM")
    parser.add_argument("--only", default="", help="only the cases whose 'method model peer' contains this")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    start = time.perf_counter()
    rows, built = [], {}
    for case in [c for c in cases(args.quick, args.extra) if args.only in f"{c.method} {c.model} {c.peer}"]:
        try:
            rows += rows_of(case, run_case(case, args, built))
        except Exception as error:  # one failing case should not lose a 20-minute run
            rows.append(dict(case=case, error=f"{type(error).__name__}: {error}"[:150]))
        print(f"{time.perf_counter() - start:5.0f} s  {case.method} on {case.model} vs {case.peer}",
              file=sys.stderr, flush=True)
    print(f"CAMs against peers, {machine(args.device)}; cheap methods: median of {args.repeats} round(s) after "
          f"a warm-up; perturbation CAMs and FullGrad: {args.slow_repeats} cold call(s) in fresh processes\n")
    print_table(rows, args)
    summary(rows)
    print(f"\nTotal run time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
