"""Benchmark of how fast `explain run` answers Ctrl-C inside a heavy method, and what the stop's
checks cost a method that is not stopped.

    python benchmarks/bench_interrupt.py [--methods scorecam,sscam,rise,ig] [--after 1,4,8]
        [--budgets default,4GB] [--baseline OLD_CHECKOUT] [--repeats 3] [--cost-methods scorecam,ig] [--ray]

1. Answer time: for each method (default settings, bundled model, two photos of data/images,
   one batch) and memory budget (``default``: the run's own; a size: ``--max-memory``), runs
   ``explain run`` in a fresh process, waits for the method's first progress line (its passes
   under way), waits ``--after`` seconds more, sends SIGINT and times the process until it
   exits. The exit status must be 130 and the manifest whole (every line JSON). The worst
   answer over the points is the number to watch (goal: 2 s). With ``--baseline``, the same
   runs with that checkout first on the path (e.g. ``git archive main | tar -x -C /tmp/old``).
2. Cost of the checks: each of ``--cost-methods`` on one photo in this process, with a stop
   listener that never stops (``pass_settings(listener=...)`` with ``asked_at_layers``, as
   ``explain run``'s: the per-layer checks on) and without (the library's calls), alternating ``--repeats`` times;
   the ratio of the medians (goal: at most 1.02).

3. With ``--ray``: ``explain run --engine ray`` (Grad-CAM and Saliency on 48 noise images, a
   local Ray) sent Ctrl-C once rows reach its manifest, or twice 0.3 s apart: the seconds
   from the (last) signal to the exit, the exit status, and the overlays on disk without a
   manifest row (goal: none after the first Ctrl-C), ``--repeats`` runs each.

Prints markdown tables. Other processes on the same cores distort the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHOTOS = [REPO / "data" / "images" / name for name in ("chelsea.png", "coffee.png")]


def _lines(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def read():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def answer_time(checkout: Path, method: str, budget: str, after: float) -> tuple[float, int, bool]:
    """Seconds from SIGINT to the exit of ``explain run`` interrupted ``after`` seconds into
    ``method``'s passes; its exit status, and whether its manifest is whole."""
    with tempfile.TemporaryDirectory(prefix="bench-interrupt-") as folder:
        command = [sys.executable, "-m", "explain.cli", "run", *map(str, PHOTOS), "--out", folder, "--method", method,
                   "--workers", "0", "--batch-size", "2"]
        if budget != "default":
            command += ["--max-memory", budget]
        env = dict(os.environ, PYTHONPATH=str(checkout), EXPLAIN_PROGRESS_EVERY="0")
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                cwd=checkout)
        try:
            lines = _lines(proc.stderr)
            pattern = re.compile(rf"; {re.escape(method)} \d+/\d+ passes$")
            while True:
                line = lines.get(timeout=600)
                if line is None:
                    raise RuntimeError(f"{method}: the run ended before its passes showed")
                if pattern.search(line.rstrip("\n")):
                    break
            time.sleep(after)
            proc.send_signal(signal.SIGINT)
            sent = time.perf_counter()
            proc.wait(timeout=300)
            answered = time.perf_counter() - sent
        finally:
            proc.kill()
            proc.wait()
        manifest = Path(folder, "manifest.jsonl")
        whole = all(json.loads(line) is not None for line in manifest.read_text().splitlines()) \
            if manifest.is_file() else True
        return answered, proc.returncode, whole


def ray_answer(checkout: Path, signals: int, images: int = 48) -> tuple[float, int, int, int]:
    """``explain run --engine ray`` (Grad-CAM and Saliency, batches of 2) on noise images, sent
    ``signals`` SIGINTs (0.3 s apart) once rows reach its manifest: seconds from the last
    signal to its exit, its exit status, the overlays on disk and those without a row."""
    import numpy as np
    from PIL import Image

    with tempfile.TemporaryDirectory(prefix="bench-interrupt-ray-") as folder:
        root = Path(folder)
        (root / "in").mkdir()
        rng = np.random.default_rng(0)
        for i in range(images):
            Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(root / "in" / f"img{i:03d}.png")
        command = [sys.executable, "-m", "explain.cli", "run", "in", "--out", "out", "--engine", "ray", "--method",
                   "gradcam,saliency", "--batch-size", "2", "-q"]
        env = dict(os.environ, PYTHONPATH=str(checkout))
        proc = subprocess.Popen(command, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        manifest = root / "out" / "manifest.jsonl"
        try:
            deadline = time.monotonic() + 600
            while not (manifest.is_file() and manifest.read_text().count('"status": "ok"') >= 4):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the Ray run ended before it could be interrupted")
                time.sleep(0.05)
            for i in range(signals):
                if i:
                    time.sleep(0.3)
                proc.send_signal(signal.SIGINT)
            sent = time.perf_counter()
            proc.wait(timeout=300)
            answered = time.perf_counter() - sent
        finally:
            proc.kill()
            proc.wait()
        overlays = {p.relative_to(root / "out").as_posix() for p in (root / "out").rglob("*.png")
                    if p.parent.name != "index-data"}
        rows = {json.loads(line).get("output") for line in manifest.read_text().splitlines() if line.endswith("}")}
        return answered, proc.returncode, len(overlays), len(overlays - rows)


def check_cost(method: str, repeats: int) -> tuple[float, float]:
    """Median seconds of ``method`` on one photo with the per-layer stop checks on and off."""
    import torch
    from PIL import Image

    import explain
    from explain.passes import PassListener, pass_settings

    class NeverStops(PassListener):
        asked_at_layers = True

    model, preprocess, _ = explain.models.load()
    image = preprocess(Image.open(PHOTOS[0]).convert("RGB"))[None]
    explainer = explain.explainer(method, model)
    explainer(image)  # the first call's own costs (the search for the fastest inner batch)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeats):
        for checked in (False, True):
            with pass_settings(listener=NeverStops() if checked else None), torch.inference_mode(False):
                started = time.perf_counter()
                explainer(image)
                times[checked].append(time.perf_counter() - started)
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="scorecam,sscam,rise,ig")
    parser.add_argument("--after", default="1,4,8", help="seconds into the method's passes, comma-separated")
    parser.add_argument("--budgets", default="default,4GB")
    parser.add_argument("--baseline", type=Path, help="an older checkout to time the same way")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cost-methods", default="scorecam,ig", help="methods whose checks are timed ('': none)")
    parser.add_argument("--ray", action="store_true", help="also time Ctrl-C of runs on Ray (the ray extra)")
    args = parser.parse_args()
    methods = args.methods.split(",")
    points = [float(a) for a in args.after.split(",")]
    checkouts = [("this checkout", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    print("| code | method | budget | answer after SIGINT at " + ", ".join(f"{p:g} s" for p in points)
          + " (s) | worst | exit 130, manifest whole |")
    print("|---|---|---|---|---|---|")
    for name, checkout in checkouts:
        for method in methods:
            for budget in args.budgets.split(","):
                found = [answer_time(checkout, method, budget, after) for after in points]
                seconds = [f"{t:.2f}" for t, _, _ in found]
                clean = all(code == 130 and whole for _, code, whole in found)
                print(f"| {name} | {method} | {budget} | {' / '.join(seconds)} | **{max(t for t, _, _ in found):.2f}** "
                      f"| {'yes' if clean else [(code, whole) for _, code, whole in found]} |", flush=True)
    if args.ray:
        print("\n| code | Ray run, Ctrl-C | seconds from the signal to the exit (runs) | exit | overlays, "
              "without a row |")
        print("|---|---|---|---|---|")
        for name, checkout in checkouts:
            for signals in (1, 2):
                found = [ray_answer(checkout, signals) for _ in range(args.repeats)]
                print(f"| {name} | {'first' if signals == 1 else 'second'} | "
                      f"{' / '.join(f'{t:.1f}' for t, _, _, _ in found)} | "
                      f"{', '.join(sorted({str(code) for _, code, _, _ in found}))} | "
                      f"{' / '.join(f'{n}, {lost}' for _, _, n, lost in found)} |", flush=True)
    cost_methods = [m for m in args.cost_methods.split(",") if m]
    if cost_methods:
        print("\n| method | seconds without the checks | with | ratio |")
        print("|---|---|---|---|")
    for method in cost_methods:
        plain, checked = check_cost(method, args.repeats)
        print(f"| {method} | {plain:.2f} | {checked:.2f} | {checked / plain:.3f} |", flush=True)


if __name__ == "__main__":
    main()
