"""Benchmark of `explain run`: speed against the bare model, and memory over a long run.

    python benchmarks/bench_cli.py [--images 1000] [--speed-images 240] [--repeats 3] [--memory-runs 3]

1. Makes ``--images`` test photos from data/images (random crops, resizes and flips, saved
   as JPEG and PNG in ten folders) in a temporary folder.
2. Speed: runs ``explain run`` (bundled model, Grad-CAM) on the first ``--speed-images`` of
   them and takes the images/s of its summary line, which counts from the first batch to
   the last file written (start-up excluded). The bare model forward (``model(x)`` under
   ``torch.inference_mode``) is timed on the same images, decoded and preprocessed the same
   way and batched the same way (decoding not timed), in a fresh process like the CLI's,
   after a warm-up batch, as the faster of two passes. Like the CLI, that process keeps
   freed memory in glibc's heap (``explain.heap.ReusedHeap``, never trimmed, so that the
   reference errs high); one more bare pass with glibc's default settings shows what that
   alone is worth.
   The two alternate ``--repeats`` times and the ratio of each pair is reported, with the
   median: run-to-run noise on shared machines is large, and pairing cancels most of it.
3. Memory: ``--memory-runs`` times, runs ``explain run`` on all ``--images`` and samples the
   peak RSS (VmHWM) of the CLI process as outputs appear, at image 100 and at the end, and
   the summed RSS of the process and its decode workers. When the high-water mark is
   reached varies from run to run by tens of MiB, hence the several runs and their median.

Prints a markdown table. Other processes on the same cores distort the numbers.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import explain
from explain.images import load_rgb

REPO = Path(__file__).resolve().parents[1]


def make_images(folder: Path, count: int, seed: int = 0) -> list[Path]:
    sources = [load_rgb(path) for path in sorted((REPO / "data" / "images").iterdir())]
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        image = sources[i % len(sources)]
        width, height = image.size
        scale = rng.uniform(0.4, 1.0)
        w, h = int(width * scale), int(height * scale)
        left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
        crop = image.crop((left, top, left + w, top + h))
        short = int(rng.integers(200, 640))
        factor = short / min(crop.size)
        crop = crop.resize((max(1, round(crop.width * factor)), max(1, round(crop.height * factor))), Image.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        path = folder / f"set{i % 10}" / (f"img{i:04d}.jpg" if i % 10 < 7 else f"img{i:04d}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        crop.save(path, quality=90) if path.suffix == ".jpg" else crop.save(path)
        paths.append(path)
    return paths


def bare_forward(folder: Path, batch_size: int, default_malloc: bool = False) -> float:
    """Images per second of ``model(x)`` alone, on the images ``explain run folder`` would
    process, decoded, preprocessed and batched as it does; decoding is not timed."""
    from explain.batch.inputs import collect_inputs
    from explain.heap import ReusedHeap

    if not default_malloc:
        ReusedHeap()  # keeps freed memory as in the CLI; never trimmed here
    model, preprocess, _ = explain.models.load()
    paths = [source.path for source in collect_inputs([str(folder)], folder / "unused")]
    tensors = [preprocess(load_rgb(path, draft_size=448)) for path in paths]
    batches = [torch.stack(tensors[i : i + batch_size]) for i in range(0, len(tensors), batch_size)]
    best = float("inf")
    with torch.inference_mode():
        model(batches[0])  # warm-up
        for _ in range(2):  # the faster of two passes, so that the reference errs high
            start = time.perf_counter()
            for batch in batches:
                model(batch)
            best = min(best, time.perf_counter() - start)
    return len(tensors) / best


def explain_command() -> list[str]:
    script = Path(sys.executable).with_name("explain")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "explain.cli"]


def cli_rate(stdout: str) -> float:
    match = re.search(r"\(([\d.]+) images/s\)", stdout)
    if not match:
        raise RuntimeError(f"no summary line in: {stdout!r}")
    return float(match.group(1))


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def count_files(folder: Path, suffix: str = ".png") -> int:
    return sum(name.endswith(suffix) for _, _, names in os.walk(folder) for name in names)


def children(pid: int) -> list[int]:
    pids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(child) for child in (task / "children").read_text().split()]
    return pids


def memory_run(command: list[str], out: Path, total: int, mark: int) -> dict:
    """Peak RSS of the CLI process (VmHWM), and the peak of the summed RSS of it and its
    decode workers (sampled), at the ``mark``-th output and at the end."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    at_mark = tree_at_mark = None
    peak = tree_peak = 0
    samples = 0
    try:
        while process.poll() is None:
            try:
                peak = status_kib(process.pid, "VmHWM")
                tree = status_kib(process.pid, "VmRSS")
                for child in children(process.pid):
                    try:
                        tree += status_kib(child, "VmRSS")
                    except (FileNotFoundError, ProcessLookupError, KeyError):
                        pass
            except (FileNotFoundError, ProcessLookupError, KeyError):
                break
            tree_peak = max(tree_peak, tree)
            if at_mark is None and count_files(out) >= mark:
                at_mark, tree_at_mark = peak, tree_peak
            samples += 1
            time.sleep(0.05)
        stdout, stderr = process.communicate()
    finally:
        process.kill()
    if process.returncode != 0:
        raise RuntimeError(f"explain run failed ({process.returncode}): {stderr[-2000:]}")
    return {"at_mark": at_mark, "end": peak, "tree_at_mark": tree_at_mark, "tree_end": tree_peak,
            "outputs": count_files(out), "rate": cli_rate(stdout), "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--speed-images", type=int, default=240)
    parser.add_argument("--repeats", type=int, default=3, help="speed pairs (0: none)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=None, help="explain run --workers (default: its own)")
    parser.add_argument("--memory-runs", type=int, default=3, help="long runs measuring memory (0: none)")
    parser.add_argument("--bare-forward", type=Path, help=argparse.SUPPRESS)  # the child process's job
    parser.add_argument("--default-malloc", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_forward:
        print(f"{bare_forward(args.bare_forward, args.batch_size, args.default_malloc):.4f}")
        return
    extra = ["--batch-size", str(args.batch_size)] + ([] if args.workers is None else ["--workers", str(args.workers)])

    with tempfile.TemporaryDirectory(prefix="bench_cli_") as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        paths = make_images(tmp / "images", max(args.images, args.speed_images))
        speed_dir = tmp / "speed"
        for path in paths[: args.speed_images]:
            link = speed_dir / path.relative_to(tmp / "images")
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(path, link)
        print(f"made {len(paths)} images in {time.perf_counter() - start:.0f} s", file=sys.stderr)

        def bare(default_malloc: bool = False) -> float:
            result = subprocess.run([sys.executable, __file__, "--bare-forward", str(speed_dir), "--batch-size",
                                     str(args.batch_size)] + ["--default-malloc"] * default_malloc,
                                    capture_output=True, text=True, check=True)
            return float(result.stdout.split()[-1])

        def cli(repeat: int) -> tuple[float, float]:
            started = time.perf_counter()
            result = subprocess.run(explain_command() + ["run", str(speed_dir), "--out", str(tmp / f"out-{repeat}"),
                                    "--method", "gradcam", "--quiet", *extra], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(result.stderr[-2000:])
            return cli_rate(result.stdout), time.perf_counter() - started

        rows = ["| measure | value |", "|---|---|"]
        if args.repeats:
            pairs = []
            for repeat in range(args.repeats):
                if repeat % 2 == 0:
                    forward = bare()
                    rate, wall = cli(repeat)
                else:
                    rate, wall = cli(repeat)
                    forward = bare()
                pairs.append((forward, rate, wall))
                print(f"pair {repeat + 1}: bare {forward:.2f}, explain run {rate:.2f} images/s", file=sys.stderr)
            default_forward = bare(default_malloc=True)
            rows += [
                f"| images, batch size, torch threads, cores | {args.speed_images}, {args.batch_size}, "
                f"{torch.get_num_threads()}, {os.cpu_count()} |",
                "| bare forward, images/s (each pair) | " + " / ".join(f"{f:.1f}" for f, _, _ in pairs) + " |",
                "| `explain run --method gradcam`, images/s (each pair) | " + " / ".join(f"{r:.1f}" for _, r, _ in pairs) + " |",
                f"| bare forward with glibc's default malloc settings, images/s (once) | {default_forward:.1f} |",
                "| ratio explain run / bare forward (each pair) | " + " / ".join(f"{r / f:.2f}" for f, r, _ in pairs) + " |",
                f"| **median ratio** (goal ≥ 0.7) | **{statistics.median(r / f for f, r, _ in pairs):.2f}** |",
                "| `explain run` wall time incl. ~5 s start-up | " + " / ".join(f"{w:.1f} s" for _, _, w in pairs) + " |",
            ]
        runs = []
        for repeat in range(args.memory_runs):
            out = tmp / f"out-memory-{repeat}"
            runs.append(memory_run(explain_command() + ["run", str(tmp / "images"), "--out", str(out), "--method",
                                   "gradcam", "--quiet", *extra], out, args.images, 100))
            print(f"memory run {repeat + 1}: {runs[-1]}", file=sys.stderr)
        if runs:
            growths = [(m["end"] - m["at_mark"]) / m["at_mark"] for m in runs]
            tree = [(m["tree_end"] - m["tree_at_mark"]) / m["tree_at_mark"] for m in runs]
            rows += [
                "| memory runs: images, images/s (each) | " + " / ".join(f"{m['outputs']}, {m['rate']:.1f}" for m in runs) + " |",
                "| peak RSS at image 100 → at the end (each) | "
                + " / ".join(f"{m['at_mark'] / 1024:.0f} → {m['end'] / 1024:.0f} MiB" for m in runs) + " |",
                "| peak RSS growth (each) | " + " / ".join(f"{g:+.1%}" for g in growths) + " |",
                f"| **median peak RSS growth** (goal ≤ 5 %) | **{statistics.median(growths):+.1%}** |",
                "| with the decode workers: summed RSS growth (each) | " + " / ".join(f"{g:+.1%}" for g in tree) + " |",
            ]
        print("\n".join(rows))


if __name__ == "__main__":
    main()
