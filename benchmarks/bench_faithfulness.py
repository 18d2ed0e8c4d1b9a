"""Deletion and insertion of every method on the sample photos, in one run.

    .venv/bin/python benchmarks/bench_faithfulness.py [--step 0.02] [--only TEXT] [--markdown FILE]

The bundled efficientnet_lite0 (ImageNet weights) on the four photos of ``data/images`` at
224 x 224, each photo's top class. Every registered method that applies to an image
classifier explains the four photos once (the settings below where a method's defaults
would take minutes per photo on a CPU, as notebook 02 does), and ``explain.evaluation.evaluate``
scores its maps with deletion (lower is better) and insertion (higher is better; Petsiuk et
al. 2018) at ``--step`` of the pixels per step. Prints a Markdown table: per method its
family, the settings used, mean ± std over the photos of both areas, and the seconds the
explanation took (the metrics' passes not included).

Four photos decide little (the guide's metrics page says why): the table says how the
families compare on real photos, with RandomCAM as the floor to beat.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
from PIL import Image

import explain
from explain.evaluation import evaluate, format_summary, summary_table
from explain.passes import pass_settings

PHOTOS = Path(__file__).resolve().parents[1] / "data" / "images"

#: Settings where a method's defaults take minutes per photo on a 2-core CPU (as notebook 02).
SETTINGS: dict[str, dict] = {
    "randomcam": {"seed": 0},
    "sscam": {"n_samples": 2},
    "iscam": {"n_samples": 2},
    "lime": {"n_samples": 256},
    "kernelshap": {"n_samples": 256},
    "extremal": {"steps": 300},
    "rise": {"n_masks": 2000},
}
#: Methods that do not explain a classifier's class (detectors only).
NOT_FOR_CLASSIFIERS = {"drise"}


def photos(preprocess) -> torch.Tensor:
    files = sorted(p for p in PHOTOS.iterdir() if p.suffix in {".png", ".jpg"})
    return torch.stack([preprocess(Image.open(path).convert("RGB")) for path in files])


def run(step: float, only: str | None) -> tuple[list[dict], dict[str, float], dict[str, str]]:
    model, preprocess, _ = explain.models.load("efficientnet_lite0")
    x = photos(preprocess)
    with torch.inference_mode():
        targets = model(x).argmax(1)
    rows, seconds, skipped = [], {}, {}
    for name, info in explain.describe_methods().items():
        if name in NOT_FOR_CLASSIFIERS or (only and only not in name):
            continue
        start = time.perf_counter()
        try:  # NotApplicable at construction (LeGrad: no known head) or at the first call
            explainer = explain.explainer(name, model, **SETTINGS.get(name, {}))
            explainer(x[:1], targets[:1], progress=False)  # a method's one-time set-up
        except explain.NotApplicable as reason:
            skipped[name] = str(reason).split(";")[0]
            continue
        with pass_settings(progress=False):
            found = evaluate(
                {name: explainer},
                x,
                ["deletion", "insertion"],
                targets=targets,
                options={"deletion": {"step": step}, "insertion": {"step": step}},
            )
        seconds[name] = time.perf_counter() - start
        if found.failures:
            skipped[name] = found.failures[0]["error"]
        rows += found.rows
        print(f"{name} ({info['family']}): {seconds[name]:.1f} s", flush=True)
    return rows, seconds, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step", type=float, default=0.02, help="share of the pixels removed or restored per step")
    parser.add_argument("--only", help="only the methods whose name contains this")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows, seconds, skipped = run(args.step, args.only)
    families = {name: info["family"] for name, info in explain.describe_methods().items()}
    table = format_summary(summary_table(rows), style="markdown").splitlines()
    header = table[0].replace("| method |", "| method | family | settings |") + " explain + metrics (s) |"
    lines = [header, table[1].replace("|---|", "|---|---|---|", 1) + "---:|"]
    for line in table[2:]:
        name = line.split("|")[1].strip()
        settings = ", ".join(f"{k}={v}" for k, v in SETTINGS.get(name, {}).items()) or "defaults"
        lines.append(line.replace(f"| {name} |", f"| {name} | {families[name]} | {settings} |", 1) + f" {seconds[name]:.1f} |")
    text = "\n".join(
        [
            f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads,"
            f" deletion and insertion at {args.step:.0%} of the pixels per step",
            "",
            *lines,
            "",
            *(f"- {name}: not run ({reason})" for name, reason in skipped.items()),
        ]
    )
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
