"""Benchmark of `explain run --engine ray` against the local engine, and of its driver's memory.

    python benchmarks/bench_ray.py [--images 200] [--repeats 3] [--paths 1000000]

1. Speed: makes ``--images`` photos from data/images (``bench_cli.make_images``), then runs
   ``explain run`` on them (bundled model, Grad-CAM, ``--overwrite``) with the local engine
   and with ``--engine ray`` (a local Ray on this machine's cores), alternately ``--repeats``
   times. Each run reports the images/s of its summary line (from the first image planned to
   the last row written: Ray's start and the model's check excluded) and its wall time
   (everything, Python's start included). The ratio ray / local is taken per pair and the
   median reported: pairing cancels most of a shared machine's noise.
2. Memory: writes an @list of ``--paths`` paths, none of which exist, and runs
   ``explain run --engine ray @list`` in a process that reports its own peak RSS
   (``ru_maxrss`` of the driver alone, not of Ray's processes); the local engine runs the
   same list for comparison. Every path becomes a failed row ("file not found"), so this
   measures planning, listing and the manifest, streamed, not explaining.

Prints a markdown table. Other processes on the same cores distort the numbers.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

RATE = re.compile(r"images in ([\d.]+) s \(([\d.]+) images/s\)")

DRIVER = """
import resource, sys, time
from explain.cli import main
start = time.perf_counter()
code = main(sys.argv[1:])
print(f"peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} "
      f"seconds={time.perf_counter() - start:.1f} code={code}")
"""


def run(folder: Path, out: Path, engine: str) -> tuple[float, float]:
    """(images/s of the summary line, wall seconds) of one run."""
    command = [sys.executable, "-m", "explain.cli", "run", str(folder), "--out", str(out), "--overwrite", "-q",
               "--engine", engine]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    rate = RATE.search(done.stdout)
    if rate is None:
        raise RuntimeError(f"no summary line in {done.stdout!r} {done.stderr[-2000:]!r}")
    return float(rate.group(2)), wall


def driver_memory(list_file: Path, out: Path, engine: str) -> dict:
    done = subprocess.run([sys.executable, "-c", DRIVER, "run", f"@{list_file}", "--out", str(out), "-q",
                           "--engine", engine], capture_output=True, text=True)
    found = re.search(r"peak_rss_mib=(\d+) seconds=([\d.]+) code=(\d+)", done.stdout)
    if found is None:
        raise RuntimeError(f"{engine}: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    rows = sum(1 for _ in open(out / "manifest.jsonl"))
    return {"engine": engine, "peak_mib": int(found.group(1)), "seconds": float(found.group(2)),
            "exit": int(found.group(3)), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", type=int, default=1_000_000)
    parser.add_argument("--local-paths", type=int, default=100_000,
                        help="paths for the local engine's memory run (it holds every row)")
    parser.add_argument("--only", choices=("speed", "memory"), default=None)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        if options.only != "speed":
            memory(temp, options)
        if options.only != "memory":
            speed(temp, options)


def speed(temp: Path, options) -> None:
    # Imported here, after the memory runs: it imports torch, and the same driver started from
    # a process that has imported torch peaked ~125 MiB higher here (506 against 380 MiB; the
    # environment variables were the same). A shell does not import torch.
    from bench_cli import make_images

    make_images(temp / "photos", options.images)
    pairs = []
    for _ in range(options.repeats):
        local = run(temp / "photos", temp / "out_local", "local")
        on_ray = run(temp / "photos", temp / "out_ray", "ray")
        pairs.append((local, on_ray))
        print(f"local {local[0]:.1f} images/s ({local[1]:.1f} s), ray {on_ray[0]:.1f} images/s "
              f"({on_ray[1]:.1f} s)", file=sys.stderr)
    print(f"\n### {options.images} photos, bundled model, Grad-CAM, median of {options.repeats} pairs\n")
    print("| engine | images/s (summary line) | wall s (with start-up) |\n|---|---|---|")
    for name, index in (("local", 0), ("ray", 1)):
        print(f"| {name} | {statistics.median(p[index][0] for p in pairs):.1f} "
              f"| {statistics.median(p[index][1] for p in pairs):.1f} |")
    print(f"\nray / local, images/s: {statistics.median(r[0] / l[0] for l, r in pairs):.2f}; "
          f"wall time: {statistics.median(r[1] / l[1] for l, r in pairs):.2f}")


def memory(temp: Path, options) -> None:
    results = []
    for engine, count in (("ray", options.paths), ("local", options.local_paths)):
        list_file = temp / f"list_{count}.txt"
        with open(list_file, "w") as file:
            for i in range(count):
                file.write(f"/nonexistent/shard{i // 10_000:03d}/image_{i:07d}.jpg\n")
        results.append((count, driver_memory(list_file, temp / f"out_list_{engine}", engine)))
    print("\n### Driver peak memory, @list of paths that do not exist yet\n")
    print("| engine | paths | peak RSS of the driver (MiB) | seconds | manifest rows | exit |\n|---|---|---|---|---|---|")
    for count, result in results:
        print(f"| {result['engine']} | {count:,} | {result['peak_mib']} | {result['seconds']:.0f} "
              f"| {result['rows']:,} | {result['exit']} |")


if __name__ == "__main__":
    main()
