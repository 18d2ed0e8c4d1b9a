"""The heavy methods (issue 26): peak memory, time at the pass limit and Ctrl-C latency,
measured side by side in one run, with the current defaults and with the old ones.

    .venv/bin/python benchmarks/bench_heavy.py [--quick] [--device cpu] [--photos 8] [--limit 120]
        [--time-photos 2] [--time-samples 2] [--time-limit 900] [--models efficientnet_lite0,resnet50]
        [--methods scorecam,sscam,...] [--no-old] [--no-all] [--out benchmarks/results/bench_heavy.json]

Models: the bundled efficientnet_lite0 and torchvision resnet50 with random weights (seed 0),
in eval mode, on the photos of data/images (resized to 256, centre-cropped to 224,
ImageNet-normalised; their horizontal flips after the 4 photos, then again).

1. **Pass times.** Per model, in a fresh process: the model's own time per image at batch
   1, 2, 4, ..., 64 (``--largest-batch``) for a forward pass under ``torch.no_grad()`` and
   for a forward+backward pass (the gradient of the summed top logits to the input, weights
   frozen), round-robin, median of ``--repeats`` rounds after a warm-up. The fastest size of
   each kind gives the *fastest per-image pass time*. **Memory baseline**: the peak RSS of a
   fresh process that loads the model and runs its forward+backward on ``--photos`` (8)
   photos twice.
2. **Methods.** Each call runs in a fresh process, so that its peak RSS (``ru_maxrss``,
   imports, model and photos included) is that call's; one forward pass of one photo warms
   the model up first. Once with the defaults of this checkout (after issue 26: inner
   batches from the memory budget, ``batch_size=None`` / ``internal_batch_size=None``) and
   once with the old defaults given explicitly (``batch_size=32`` for scorecam, sscam and
   iscam, 64 for ablationcam, ``internal_batch_size=64`` for the captum methods). The rows the
   call runs through the model are counted by a forward pre-hook on it; those of the
   budget's own first-use measurements (``explain.passes.row_bytes`` and ``fastest_rows``)
   are counted apart: their time is in the call's time, their rows are not in its rows.
   Two settings, each call of which gets SIGINT after a time limit (its peak RSS and rows so
   far still reported, marked *cut*):

   - memory: ``--photos`` (8) photos, default settings, cut after ``--limit`` s. Goal: peak
     RSS at most 1 GB above the model's baseline. A cut call has run at least a few of its
     inner batches, which is what sets its peak.
   - time: ``--time-photos`` (2) photos, sscam and iscam with ``n_samples=--time-samples``
     (2; their defaults, 35 and 10, take about 50 and 15 minutes on 8 photos on 2 CPU cores),
     cut after ``--time-limit`` s. Ratio = time / (rows x the fastest per-image time of the
     kind of pass: forward+backward for ig, smoothgrad and gradientshap, forward for the
     others). Goal: at most 1.2.
3. **Ctrl-C.** scorecam on the first model with ``--photos`` photos gets SIGINT
   ``--sigint-after`` s into its call: the seconds until ``KeyboardInterrupt`` reached the
   caller and until the process exited (goal: within 2 s). Every cut call above adds its own.
4. **--all** (on by default, ``--no-all`` skips it): the peak RSS of ``explain run`` on
   ``--all-photos`` (2) photos with ``--method all`` (bundled model, default settings) in a
   fresh process (its decode workers apart); goal under 2 GB; cut after ``--all-limit`` s.

On 2 CPU cores the whole run takes about 3 hours (mostly resnet50's CAMs and the time
limits of the memory setting); ``--models``, ``--methods`` and ``--no-old`` narrow it.
``--quick`` (64 px, 1 photo, efficientnet_lite0 and resnet18, scorecam, ig and occlusion,
batches up to 8, no --all) checks the script in about a minute; its figures mean nothing.

Prints the machine, then markdown tables; writes everything measured as JSON to ``--out``.
Other processes on the same cores distort the times.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

# Spinning OpenMP threads slow torch down when other processes share the cores (see
# bench_metrics.py); set before torch loads, inherited by the worker processes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import explain  # noqa: E402
import explain.passes  # noqa: E402
from bench_gradcam import interleaved_medians  # noqa: E402
from explain.catalogue import explainer, method_class  # noqa: E402
from explain.images import load_rgb  # noqa: E402
from explain.models import imagenet_preprocess  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
METHODS = ("scorecam", "sscam", "iscam", "ablationcam", "ig", "smoothgrad", "gradientshap", "occlusion", "lime",
           "kernelshap")
#: Methods timed against the model's forward+backward pass; the others against its forward pass.
BACKWARD_METHODS = {"ig", "smoothgrad", "gradientshap"}
OLD_DEFAULTS = {"scorecam": {"batch_size": 32}, "sscam": {"batch_size": 32}, "iscam": {"batch_size": 32},
                "ablationcam": {"batch_size": 64}}
OLD_ATTRIBUTION_DEFAULTS = {"internal_batch_size": 64}
#: Methods whose n_samples the time setting lowers.
SAMPLED_CAMS = ("sscam", "iscam")
MEMORY_GOAL = 1e9
RATIO_GOAL = 1.2
CTRL_C_GOAL = 2.0
ALL_GOAL = 2e9
#: Seconds a worker may take to stop after SIGINT before it is killed.
GRACE = 120


# -- in the worker processes


def peak_rss(who=resource.RUSAGE_SELF) -> int:
    """Peak resident memory in bytes (Linux reports kB, macOS bytes)."""
    peak = resource.getrusage(who).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def load_model(name: str, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights for a torchvision name
        model, _, _ = explain.models.load(name)
    return model.to(device).eval()


def photos(count: int, size: int, device: str) -> torch.Tensor:
    """``count`` photos of data/images at ``size`` px: the photos, their flips, again."""
    preprocess = imagenet_preprocess(resize=size * 256 // 224, crop=size)
    paths = sorted(p for p in (REPO / "data" / "images").iterdir() if p.suffix in (".png", ".jpg"))
    base = torch.stack([preprocess(load_rgb(path)) for path in paths])
    base = torch.cat([base, base.flip(-1)])
    return base.repeat((count + len(base) - 1) // len(base), 1, 1, 1)[:count].contiguous().to(device)


def input_gradient(model, images) -> None:
    """Forward+backward to the input, the weights frozen by the caller."""
    images = images.detach().requires_grad_(True)
    torch.autograd.grad(model(images).amax(dim=1).sum(), images)


class RowCounter:
    """Rows run through the model (a forward pre-hook), those of explain.passes' own
    measurements apart, and the rows the listener of pass_settings was told of."""

    def __init__(self, model: torch.nn.Module):
        self.rows = self.probe_rows = self.probing = 0
        self.listened_done = self.listened_last = 0
        model.register_forward_pre_hook(self.count)
        for name in ("fastest_rows", "row_bytes"):
            self.watch(name)

    def count(self, module, args) -> None:
        rows = args[0].shape[0] if args and isinstance(args[0], torch.Tensor) and args[0].dim() else 0
        if self.probing:
            self.probe_rows += rows
        else:
            self.rows += rows

    def watch(self, name: str) -> None:
        """Count the passes of ``explain.passes.<name>`` as probes, wherever it was imported."""
        original = getattr(explain.passes, name, None)
        if original is None:
            return

        def probing(*args, **kwargs):
            self.probing += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.probing -= 1

        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("explain") and getattr(module, name, None) is original:
                setattr(module, name, probing)

    def listen(self, method: str, done: int, total: int) -> None:
        """Cumulative rows per outermost call: a value below the last starts a new call."""
        if done < self.listened_last:
            self.listened_done += self.listened_last
        self.listened_last = done

    @property
    def listened(self) -> int:
        return self.listened_done + self.listened_last


def started() -> float:
    """Tell the parent the timed part starts (its limit counts from here); on the real stdout,
    which :func:`worker` points elsewhere."""
    print("STARTED", file=sys.__stdout__, flush=True)
    return time.perf_counter()


def worker_passes(spec: dict) -> dict:
    model = load_model(spec["model"], spec["device"]).requires_grad_(False)
    images = photos(spec["largest"], spec["size"], spec["device"])
    sizes = [2**i for i in range(spec["largest"].bit_length()) if 2**i <= spec["largest"]]

    def forward(n):
        with torch.no_grad():
            model(images[:n])

    functions = {}
    for n in sizes:
        functions[f"forward {n}"] = lambda n=n: forward(n)
        functions[f"backward {n}"] = lambda n=n: input_gradient(model, images[:n])
    started()
    medians = interleaved_medians(functions, spec["repeats"])
    return {kind: {n: medians[f"{kind} {n}"] / n for n in sizes} for kind in ("forward", "backward")}


def worker_baseline(spec: dict) -> dict:
    model = load_model(spec["model"], spec["device"]).requires_grad_(False)
    images = photos(spec["photos"], spec["size"], spec["device"])
    loaded = peak_rss()
    started()
    for _ in range(2):
        input_gradient(model, images)
    synchronize(spec["device"])
    return {"loaded_rss": loaded}


def worker_method(spec: dict) -> dict:
    model = load_model(spec["model"], spec["device"])
    images = photos(spec["photos"], spec["size"], spec["device"])
    with torch.no_grad():
        model(images[:1])
    counter = RowCounter(model)
    method = explainer(spec["method"], model, **spec["kwargs"])
    result = {"cut": False}
    start = started()
    try:
        with explain.passes.pass_settings(listener=counter.listen):
            method(images)
        synchronize(spec["device"])
    except KeyboardInterrupt:
        result.update(cut=True, interrupted_at=time.time())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a late signal must not lose the result
    result.update(seconds=time.perf_counter() - start, rows=counter.rows, probe_rows=counter.probe_rows,
                  listened_rows=counter.listened)
    if spec.get("own_passes") and not result["cut"]:
        result["own_passes"] = own_pass_times(model.requires_grad_(False), images, spec["method"] in BACKWARD_METHODS,
                                              spec["device"])
    return result


def own_pass_times(model, images, backward: bool, device: str) -> dict:
    """The fastest per-image time of the method's kind of pass at 1, 2, 4, ... 32 rows (the
    faster of three passes each), timed in the call's own process right after it: the other
    measure of the pass limit, free of the spread between processes."""
    row = images[:1]
    times = {}
    for n in (1, 2, 4, 8, 16, 32):
        batch = row.expand(n, *row.shape[1:]).contiguous()
        best = float("inf")
        for _ in range(3):
            synchronize(device)
            begun = time.perf_counter()
            if backward:
                input_gradient(model, batch)
            else:
                with torch.no_grad():
                    model(batch)
            synchronize(device)
            best = min(best, time.perf_counter() - begun)
        times[n] = best / n
    fastest = min(times, key=times.get)
    return {"per_batch": times, "batch": fastest, "seconds": times[fastest]}


def worker_cli(spec: dict) -> dict:
    from explain.cli import main

    start = started()
    try:
        code = main(spec["argv"])
    except SystemExit as exit_:
        code = exit_.code
    except KeyboardInterrupt:
        code = "KeyboardInterrupt"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return {"exit": code, "seconds": time.perf_counter() - start, "children_rss": peak_rss(resource.RUSAGE_CHILDREN)}


WORKERS = {"passes": worker_passes, "baseline": worker_baseline, "method": worker_method, "cli": worker_cli}


def worker(spec: dict) -> None:
    """Run one measurement; its last stdout line is ``RESULT {json}`` (anything else it
    prints goes to stderr)."""
    stdout = sys.stdout
    # A process started in the background (nohup, `&` in a script) inherits SIGINT ignored;
    # the limits and the Ctrl-C measurement need it to raise KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_grad_enabled(True)
    with contextlib.redirect_stdout(sys.stderr):
        result = WORKERS[spec["mode"]](spec)
    result["peak_rss"] = peak_rss()
    if spec.get("device", "cpu").startswith("cuda"):
        result["peak_device"] = torch.cuda.max_memory_allocated()
    print("RESULT " + json.dumps(result), file=stdout, flush=True)


# -- in the parent process


def run_worker(spec: dict, limit: float | None = None) -> dict:
    """``spec`` in a fresh process; SIGINT ``limit`` s after its timed part started (then
    ``signalled``: the seconds from the signal to the process's exit, and ``killed`` where it
    did not stop within :data:`GRACE` s). An ``error`` (its stderr's end) where it failed."""
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], stdout=subprocess.PIPE,
                                   stderr=errors, text=True, cwd=REPO)
        lines = [process.stdout.readline()]
        outcome = {}
        if lines[0].startswith("STARTED"):
            try:
                process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                outcome = stop(process)
        lines += process.stdout.readlines()
        process.wait()
        found = [line for line in lines if line.startswith("RESULT ")]
        if not found:
            errors.seek(0)
            return {**outcome, "error": errors.read()[-2000:] or f"exit {process.returncode}"}
    result = json.loads(found[-1][len("RESULT "):])
    if "interrupted_at" in result and "signal_at" in outcome:
        outcome["interrupt_after"] = result.pop("interrupted_at") - outcome["signal_at"]
    return {**result, **outcome}


def stop(process: subprocess.Popen) -> dict:
    """SIGINT, then wait for the process to end (kill it after :data:`GRACE` s)."""
    signal_at = time.time()
    process.send_signal(signal.SIGINT)
    killed = False
    try:
        process.wait(timeout=GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        killed = True
    return {"signal_at": signal_at, "signalled": time.time() - signal_at, "killed": killed}


def old_defaults(method: str) -> dict:
    return OLD_DEFAULTS.get(method, OLD_ATTRIBUTION_DEFAULTS)


def current_defaults() -> dict:
    """The inner-batch defaults of this checkout's classes (None: from the memory budget)."""
    defaults = {}
    for method in METHODS:
        parameters = inspect.signature(method_class(method).__init__).parameters
        name = next(iter(old_defaults(method)))
        chain = [parameters] + [inspect.signature(cls.__init__).parameters for cls in method_class(method).__mro__[1:]
                                if "__init__" in vars(cls)]
        found = next((p[name].default for p in chain if name in p), "?")
        defaults[method] = f"{name}={found}"
    return defaults


def method_spec(args, model: str, method: str, old: bool, setting: str) -> dict:
    kwargs = dict(old_defaults(method)) if old else {}
    photos_ = args.photos if setting == "memory" else args.time_photos
    if setting == "time" and method in SAMPLED_CAMS:
        kwargs["n_samples"] = args.time_samples
    return {"mode": "method", "model": model, "device": args.device, "size": args.size, "photos": photos_,
            "own_passes": setting == "time",
            "method": method, "kwargs": kwargs}


def measure_model(args, model: str) -> dict:
    print(f"{model}: pass times and baseline", file=sys.stderr, flush=True)
    passes = run_worker({"mode": "passes", "model": model, "device": args.device, "size": args.size,
                         "largest": args.largest_batch, "repeats": args.repeats})
    baseline = run_worker({"mode": "baseline", "model": model, "device": args.device, "size": args.size,
                           "photos": args.photos})
    for name, result in (("pass times", passes), ("baseline", baseline)):
        if "error" in result:
            sys.exit(f"{model}: the {name} failed:\n{result['error']}")
    fastest = {}
    for kind in ("forward", "backward"):
        times = {int(n): t for n, t in passes[kind].items()}
        best = min(times, key=times.get)
        fastest[kind] = {"batch": best, "seconds": times[best], "per_batch": times}
    return {"fastest": fastest, "baseline": baseline}


def measure_methods(args, model: str, base: dict) -> list[dict]:
    """Each method with the new and the old defaults, in the time and memory settings;
    a run whose spec another already had is not made again."""
    done: dict[str, dict] = {}
    runs = []
    for method in args.methods:
        for setting in ("time", "memory"):
            for old in (False, True) if args.old else (False,):
                spec = method_spec(args, model, method, old, setting)
                key = json.dumps(spec, sort_keys=True)
                if key not in done:
                    limit = args.limit if setting == "memory" else args.time_limit
                    done[key] = run_worker(spec, limit)
                    report_run(model, method, old, setting, done[key])
                result = done[key]
                runs.append({"model": model, "method": method, "old_defaults": old, "setting": setting, "spec": spec,
                             "ratio": ratio(result, base, method), "own_ratio": own_ratio(result),
                             "above_baseline": above(result, base), **result})
    return runs


def ratio(result: dict, base: dict, method: str) -> float | None:
    """Time / (rows x the fastest per-image time of the method's kind of pass)."""
    kind = "backward" if method in BACKWARD_METHODS else "forward"
    if not result.get("rows") or "seconds" not in result:
        return None
    return result["seconds"] / (result["rows"] * base["fastest"][kind]["seconds"])


def own_ratio(result: dict) -> float | None:
    """Time / (rows x the fastest per-image pass timed in the call's own process after it)."""
    if not result.get("rows") or "own_passes" not in result:
        return None
    return result["seconds"] / (result["rows"] * result["own_passes"]["seconds"])


def above(result: dict, base: dict) -> float | None:
    return result["peak_rss"] - base["baseline"]["peak_rss"] if "peak_rss" in result else None


def report_run(model, method, old, setting, result) -> None:
    label = f"{model} {method} {'old' if old else 'new'} defaults, {setting}"
    if "error" in result:
        print(f"{label}: FAILED\n{result['error']}", file=sys.stderr, flush=True)
        return
    cut = " (cut)" if result.get("cut") or result.get("killed") else ""
    print(f"{label}: {result['seconds']:.1f} s{cut}, {result['rows']} rows (+{result['probe_rows']} probing), "
          f"peak RSS {result['peak_rss'] / 1e9:.2f} GB", file=sys.stderr, flush=True)


def measure_ctrl_c(args, model: str) -> list[dict]:
    """SIGINT ``--sigint-after`` s into scorecam, with the new and the old defaults."""
    runs = []
    for old in (False, True) if args.old else (False,):
        spec = method_spec(args, model, "scorecam", old, "memory")
        result = run_worker(spec, args.sigint_after)
        runs.append({"model": model, "old_defaults": old, **result})
        print(f"Ctrl-C, scorecam {'old' if old else 'new'} defaults: exited {result.get('signalled', 0):.2f} s "
              "after the signal" if "signalled" in result else "Ctrl-C: the call ended before the signal",
              file=sys.stderr, flush=True)
    return runs


def measure_all(args) -> dict:
    """``explain run --method all`` on ``--all-photos`` photos, in a fresh process."""
    print("explain run --method all", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as folder:
        inputs = Path(folder) / "inputs"
        inputs.mkdir()
        paths = sorted(p for p in (REPO / "data" / "images").iterdir() if p.suffix in (".png", ".jpg"))
        for path in paths[:args.all_photos]:
            shutil.copy(path, inputs / path.name)
        argv = ["run", str(inputs), "--out", str(Path(folder) / "out"), "--method", "all", "--device", args.device]
        return {"argv": argv, **run_worker({"mode": "cli", "argv": argv, "device": args.device}, args.all_limit)}


# -- output


def gb(value: float | None, sign: bool = False) -> str:
    return "-" if value is None else f"{value / 1e9:+.2f} GB" if sign else f"{value / 1e9:.2f} GB"


def mark(ok: bool) -> str:
    return " ✓" if ok else " ✗"


def machine(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    text = (f"{cpu}, {cores} cores ({torch.get_num_threads()} torch threads), {memory / 1e9:.0f} GB RAM, "
            f"torch {torch.__version__}, {platform.python_implementation()} {platform.python_version()}, "
            f"device {device}")
    if device.startswith("cuda"):
        text += f" ({torch.cuda.get_device_name(device)})"
    return text


def time_cell(run: dict | None) -> str:
    if run is None or "error" in run:
        return "failed" if run else "-"
    cut = " (cut)" if run.get("cut") or run.get("killed") else ""
    return f"{run['seconds']:.1f} s{cut}"


def ratio_cell(run: dict | None, key: str = "ratio") -> str:
    if run is None or run.get(key) is None:
        return "-"
    return f"{run[key]:.2f}{mark(run[key] <= RATIO_GOAL)}"


def peak_cell(run: dict | None, device: bool = False) -> str:
    if run is None or "error" in run:
        return "failed" if run else "-"
    value = run["above_baseline"] if not device else run.get("above_device")
    cut = " (cut)" if run.get("cut") or run.get("killed") else ""
    return f"{gb(value, sign=True)}{cut}" + ("" if device else mark(value <= MEMORY_GOAL))


def print_models(args, models: dict) -> None:
    print(f"\nModel passes at {args.size} px: time per image, median of {args.repeats} (fastest batch in brackets); "
          f"baseline = peak RSS of the model's forward+backward on {args.photos} photos\n")
    print("| model | forward | forward+backward | per image at batch 1, 2, 4, ... (forward / fwd+bwd) | "
          "RSS after loading | baseline peak RSS |")
    print("|---|---|---|---|---|---|")
    for name, info in models.items():
        fastest, base = info["fastest"], info["baseline"]
        forward, backward = fastest["forward"]["per_batch"], fastest["backward"]["per_batch"]
        sizes = " ".join(f"{forward[n] * 1e3:.1f}/{backward[n] * 1e3:.1f}" for n in sorted(forward))
        print(f"| {name} | {fastest['forward']['seconds'] * 1e3:.1f} ms ({fastest['forward']['batch']}) | "
              f"{fastest['backward']['seconds'] * 1e3:.1f} ms ({fastest['backward']['batch']}) | {sizes} ms | "
              f"{gb(base['loaded_rss'])} | {gb(base['peak_rss'])} |")


def print_methods(args, runs: list[dict]) -> None:
    def find(model, method, old, setting):
        return next((r for r in runs if (r["model"], r["method"], r["old_defaults"], r["setting"])
                     == (model, method, old, setting)), None)

    cuda = args.device.startswith("cuda")
    print(f"\nMethods. Time setting: {args.time_photos} photos, sscam and iscam with n_samples={args.time_samples}, "
          f"cut after {args.time_limit:g} s; rows = rows run through the model (the budget's measurement passes "
          f"apart); ratio = time / (rows x fastest per-image pass; fwd+bwd for ig, smoothgrad, gradientshap), goal "
          f"<= {RATIO_GOAL}, against the pass times of the benchmark's own process and against those timed in the "
          f"call's process right after it (at 1-32 rows; the fastest batch in brackets), goal "
          f"<= {RATIO_GOAL}. Memory setting: {args.photos} photos, defaults, cut after {args.limit:g} s; peak RSS "
          f"above the model's baseline, goal <= {MEMORY_GOAL / 1e9:g} GB.\n")
    head = ("| model | method | rows (+probing) | time | ratio | ratio to its own process's passes (fastest batch) "
            "| peak RSS above baseline |")
    if cuda:
        head += " peak device memory above baseline |"
    if args.old:
        head += " old defaults: time | old: ratio | old: peak RSS above baseline |"
    print(head)
    print("|" + "---|" * head.count(" |"))
    for model in args.models:
        for method in args.methods:
            timed, memory = find(model, method, False, "time"), find(model, method, False, "memory")
            rows = f"{timed['rows']} (+{timed['probe_rows']})" if timed and "rows" in timed else "-"
            own = timed.get("own_passes") if timed else None
            own_cell = f"{ratio_cell(timed, 'own_ratio')} ({own['batch']})" if own else "-"
            line = (f"| {model} | {method} | {rows} | {time_cell(timed)} | {ratio_cell(timed)} | {own_cell} "
                    f"| {peak_cell(memory)} |")
            if cuda:
                line += f" {peak_cell(memory, device=True)} |"
            if args.old:
                old_time, old_memory = find(model, method, True, "time"), find(model, method, True, "memory")
                line += f" {time_cell(old_time)} | {ratio_cell(old_time)} | {peak_cell(old_memory)} |"
            print(line)


def print_ctrl_c(ctrl_c: list[dict], runs: list[dict], args) -> None:
    print(f"\nCtrl-C: SIGINT {args.sigint_after:g} s into scorecam ({args.photos} photos); goal: stopped within "
          f"{CTRL_C_GOAL:g} s\n")
    print("| call | KeyboardInterrupt after the signal | process exited after the signal |")
    print("|---|---|---|")
    for run in ctrl_c:
        name = f"{run['model']} scorecam, {'old' if run['old_defaults'] else 'new'} defaults"
        if "signalled" not in run:
            print(f"| {name} | ended before the signal | - |")
            continue
        raised = f"{run['interrupt_after']:.2f} s" if "interrupt_after" in run else "never"
        raised += " (killed)" if run["killed"] else ""
        print(f"| {name} | {raised} | {run['signalled']:.2f} s{mark(run['signalled'] <= CTRL_C_GOAL)} |")
    cut = [run for run in runs if "signalled" in run]
    if cut:
        slowest = max(cut, key=lambda run: run["signalled"])
        print(f"\nThe {len(cut)} calls cut at their limit exited at most {slowest['signalled']:.2f} s after the "
              f"signal ({slowest['model']} {slowest['method']}, {'old' if slowest['old_defaults'] else 'new'} "
              f"defaults, {slowest['setting']} setting).")


def print_all(result: dict, args) -> None:
    print(f"\n`explain run --method all` on {args.all_photos} photos (bundled model, cut after {args.all_limit:g} s): ",
          end="")
    if "error" in result and "peak_rss" not in result:
        print(f"failed\n```\n{result['error']}\n```")
        return
    cut = f", cut ({result['signalled']:.1f} s after the signal)" if "signalled" in result else ""
    print(f"exit {result['exit']}, {result['seconds']:.0f} s{cut}, peak RSS {gb(result['peak_rss'])}"
          f"{mark(result['peak_rss'] <= ALL_GOAL)} (goal < {ALL_GOAL / 1e9:g} GB; decode workers: "
          f"{gb(result['children_rss'])})")


# -- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (64 px, 1 photo, resnet18, scorecam/ig/occlusion, no --all): a smoke test")
    parser.add_argument("--models", default=None, help="comma-separated (default: efficientnet_lite0,resnet50)")
    parser.add_argument("--methods", default=None, help=f"comma-separated (default: {','.join(METHODS)})")
    parser.add_argument("--size", type=int, default=None, help="pixels (default 224)")
    parser.add_argument("--photos", type=int, default=None, help="photos of the memory setting (8)")
    parser.add_argument("--limit", type=float, default=None, help="seconds before a memory-setting call is cut (120)")
    parser.add_argument("--time-photos", type=int, default=None, help="photos of the time setting (default 2)")
    parser.add_argument("--time-samples", type=int, default=2, help="n_samples of sscam and iscam in the time setting")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds before a timed call is cut (900)")
    parser.add_argument("--largest-batch", type=int, default=None, help="largest batch of the pass times (64)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of the pass times (3)")
    parser.add_argument("--sigint-after", type=float, default=None, help="seconds into scorecam of the Ctrl-C test (3)")
    parser.add_argument("--old", action=argparse.BooleanOptionalAction, default=True, help="also the old defaults")
    parser.add_argument("--all", action=argparse.BooleanOptionalAction, default=None,
                        help="explain run --method all (default: on, off with --quick)")
    parser.add_argument("--all-photos", type=int, default=2)
    parser.add_argument("--all-limit", type=float, default=1800, help="seconds before --method all is cut")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "bench_heavy.json")
    args = parser.parse_args()
    quick = args.quick
    defaults = {"models": "efficientnet_lite0,resnet18" if quick else "efficientnet_lite0,resnet50",
                "methods": "scorecam,ig,occlusion" if quick else ",".join(METHODS),
                "size": 64 if quick else 224, "photos": 1 if quick else 8, "limit": 20 if quick else 120,
                "time_photos": 1 if quick else 2, "time_limit": 60 if quick else 900,
                "largest_batch": 8 if quick else 64, "repeats": 2 if quick else 3, "sigint_after": 0.5 if quick else 3,
                "all": not quick}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.models, args.methods = args.models.split(","), args.methods.split(",")
    return args


def main() -> None:
    args = parse_args()
    began = time.perf_counter()
    defaults = current_defaults()
    print(f"Heavy methods, {machine(args.device)}", flush=True)
    shown = ", ".join(f"{method} {default}" for method, default in defaults.items() if method in args.methods)
    print(f"Defaults in this checkout: {shown}", flush=True)
    if any(not default.endswith("=None") for method, default in defaults.items() if method in args.methods):
        print("(Not all of them come from the memory budget yet: the 'new defaults' columns of those measure the "
              "old ones too.)", flush=True)
    models = {model: measure_model(args, model) for model in args.models}
    runs = []
    for model in args.models:
        runs += measure_methods(args, model, models[model])
        if args.device.startswith("cuda"):
            for run in runs:
                if "peak_device" in run and run["model"] == model:
                    run["above_device"] = run["peak_device"] - models[model]["baseline"]["peak_device"]
    ctrl_c = measure_ctrl_c(args, args.models[0])
    everything = measure_all(args) if args.all else None
    print_models(args, models)
    print_methods(args, runs)
    print_ctrl_c(ctrl_c, runs, args)
    if everything is not None:
        print_all(everything, args)
    elapsed = time.perf_counter() - began
    print(f"\n({elapsed:.0f} s in all)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine(args.device), "defaults": defaults, "seconds": elapsed,
              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "models": models, "runs": runs, "ctrl_c": ctrl_c, "all": everything}
    args.out.write_text(json.dumps(record, indent=1))
    print(f"JSON: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(json.loads(sys.argv[2]))
    else:
        main()
