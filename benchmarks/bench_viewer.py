"""Benchmark of the explorer (index.html) on a large run, in headless Chromium.

    python benchmarks/bench_viewer.py [--images 25000] [--methods 4] [--repeats 5]

1. Writes a run of ``--images`` images x ``--methods`` methods (100,000 manifest rows by
   default: a top-1 target each, two metric columns, labels, 1 % failures) with the project's
   own writer (:func:`explain.batch.page.write_page`, as ``explain run`` calls it) into a
   temporary folder; the overlays and originals are a handful of tiny PNGs, each referenced
   many times. Reports the time to write the page and the size of its data files.
2. Opens index.html from file:// in headless Chromium (Debian's, through its chromedriver
   with Selenium) ``--repeats`` times and takes the first screen: ``performance.now()``
   (counted from the navigation's start) when the page has drawn its first rows, and after
   the next frame is painted. Median.
3. Filter, sort and search latency: each control is set as a user would (its value, then its
   event), and the time until the grid is redrawn and laid out is measured in the page,
   ``--repeats`` times each (a reset between). Median.

Goals (issue 27): first screen under 2 s, a filter or sort under 200 ms. Prints a markdown
table and the machine. Other processes on the same cores distort the numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from explain.batch.page import colour_scales, page_run, write_page  # noqa: E402
from explain.batch.storage import OutputFolder  # noqa: E402
from explain.report import write_manifest  # noqa: E402
from explain.viewer import DATA_FOLDER  # noqa: E402

METHODS = ["gradcam", "gradcam++", "layercam", "saliency", "ig", "scorecam"]
CLASSES = [f"class {i}" for i in range(1000)]


def make_run(folder: Path, images: int, methods: int) -> list[dict]:
    """Manifest rows of a run, and the few tiny PNGs they name."""
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"tiny{i}.png")
    rows = []
    names = METHODS[:methods]
    for i in range(images):
        predicted, label = int(rng.integers(0, 1000)), int(rng.integers(0, 1000))
        probability = float(rng.random())
        for method in names:
            failed = rng.random() < 0.01
            rows.append({
                "input": f"photos/part{i % 100:02d}/img{i:06d}.jpg", "method": method, "layer": "layer4",
                "target": "top1", "target_id": predicted, "target_name": CLASSES[predicted],
                "target_probability": round(probability, 6), "predicted_id": predicted,
                "predicted_name": CLASSES[predicted], "predicted_probability": round(probability, 6),
                "output": None if failed else f"tiny{(i + len(method)) % 4}.png", "maps": None,
                "status": "failed" if failed else "ok", "error": "RuntimeError: out of memory" if failed else None,
                "settings": "model=resnet50 weights=DEFAULT cmap=jet alpha=0.5", "seconds": 0.01,
                "label_id": label, "label_name": CLASSES[label], "correct": predicted == label,
                "metrics": None if failed else {"deletion": round(float(rng.random()), 4),
                                                "insertion": round(float(rng.random()), 4)},
            })
    return rows


def write(folder: Path, rows: list[dict]) -> float:
    started = time.perf_counter()
    write_manifest(folder / "manifest.jsonl", rows)
    settings = {row["method"]: row["settings"] for row in rows}
    stats = {"ok": sum(r["status"] == "ok" for r in rows), "skipped": 0,
             "failed": sum(r["status"] == "failed" for r in rows)}
    run = page_run("explain run", "benchmark", stats, 1.0, len(rows), scales=colour_scales(settings, "jet", "RdBu_r"))
    write_page(OutputFolder(folder), rows, run, original=lambda source: f"tiny{len(source) % 4}.png")
    return time.perf_counter() - started


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        sys.exit("no Chromium: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options), chromium


NEXT_FRAME = "return new Promise(r => requestAnimationFrame(() => setTimeout(() => r(performance.now()), 0)))"


def first_screen(driver, index: Path, repeats: int) -> dict[str, float]:
    drawn, painted, loaded, times = [], [], [], []
    for _ in range(repeats):
        driver.get("about:blank")
        started = time.perf_counter()
        driver.get(index.as_uri())  # returns after the load event
        loaded.append(1000 * (time.perf_counter() - started))
        drawn.append(driver.execute_script("return window.explorerFirstScreen"))
        painted.append(driver.execute_script(NEXT_FRAME))
        times.append(driver.execute_script("return explorerSetup.times"))
    return {"drawn": statistics.median(drawn), "painted": statistics.median(painted),
            "data read": statistics.median(t["dataRead"] for t in times),
            "joined": statistics.median(t["joined"] for t in times),
            "load event (driver)": statistics.median(loaded)}


#: (what, the controls to set: [(id, value)], the controls that reset it)
OPERATIONS = [
    ("search a name (1 image)", [("search", "img012345")], [("search", "")]),
    ("search a folder (1 % of images)", [("search", "part42/")], [("search", "")]),
    ("filter: failed", [("status", "2")], [("status", "")]),
    ("filter: mistakes (labels)", [("correct", "0")], [("correct", "")]),
    ("filter: predicted class", [("predicted-class", "@first")], [("predicted-class", "")]),
    ("filter: probability 0.9..1", [("prob-min", "0.9")], [("prob-min", "")]),
    ("filter: a metric 0..0.1", [("metric", "0"), ("metric-max", "0.1")], [("metric-max", ""), ("metric", "")]),
    ("sort: probability", [("sort", "prob-desc")], [("sort", "name")]),
    ("sort: a metric", [("sort", "metric-asc-0")], [("sort", "name")]),
    ("sort: name (back)", [("sort", "name")], [("sort", "prob-asc")]),
]

SET = """
const started = performance.now();
for (const [id, value] of arguments[0]) {
  const e = document.getElementById(id);
  e.value = value === '@first' ? e.options[1].value : value;  // a class that some image has
  e.dispatchEvent(new Event(e.tagName === 'SELECT' ? 'change' : 'input', {bubbles: true}));
}
document.getElementById('canvas').getBoundingClientRect();  // layout done
return [performance.now() - started, document.getElementById('shown').textContent];
"""


def latencies(driver, repeats: int) -> list[tuple[str, float, str]]:
    results = []
    for name, controls, reset in OPERATIONS:
        times, shown = [], ""
        for _ in range(repeats):
            elapsed, shown = driver.execute_script(SET, controls)
            driver.execute_script(NEXT_FRAME)
            times.append(elapsed)
            driver.execute_script(SET, reset)
            driver.execute_script(NEXT_FRAME)
        results.append((name, statistics.median(times), shown))
    return results


def machine(chromium: str) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    version = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, {version}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=25_000)
    parser.add_argument("--methods", type=int, default=4, choices=range(1, len(METHODS) + 1))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-viewer-") as temp:
        folder = Path(temp)
        rows = make_run(folder, args.images, args.methods)
        seconds = write(folder, rows)
        size = sum(p.stat().st_size for p in (folder / DATA_FOLDER).iterdir())
        driver, chromium = browser()
        try:
            screen = first_screen(driver, folder / "index.html", args.repeats)
            operations = latencies(driver, args.repeats)
        finally:
            driver.quit()
    print(f"explorer of {args.images:,} images x {args.methods} methods = {len(rows):,} manifest rows; "
          f"page written in {seconds:.2f} s, data files {size / 1e6:.1f} MB\n")
    print("| what | ms (median) | goal |")
    print("|---|---:|---|")
    print(f"| first screen: rows drawn | {screen['drawn']:.0f} | < 2000 |")
    print(f"| first screen: painted | {screen['painted']:.0f} | < 2000 |")
    print(f"| (of which: data files loaded and parsed, by) | {screen['data read']:.0f} | |")
    print(f"| (of which: columns joined, by) | {screen['joined']:.0f} | |")
    for name, elapsed, shown in operations:
        print(f"| {name} ({shown}) | {elapsed:.0f} | < 200 |")
    print(f"\nmachine: {machine(chromium)}")


if __name__ == "__main__":
    main()
