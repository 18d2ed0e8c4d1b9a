"""`explain evaluate` end to end on the sample photos with the bundled model, and the Python
API behind it (explain.evaluation): scores, the summary with its best marks, plots, resume."""

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image
from torch import nn

import explain
from explain.batch.outcome import EXIT_OUT_OF_MEMORY
from explain.cli import main
from explain.evaluation import (
    evaluate,
    format_summary,
    mean_curves,
    plot_curves,
    plot_randomisation,
    plot_summary,
    read_regions,
    scoring,
    summary_table,
)

REPO = Path(__file__).resolve().parents[1]
PHOTOS = REPO / "data" / "images"
STEP = ["--step", str(224 * 224 // 4)]  # 4 steps per curve instead of 224: fast on a CPU


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


@pytest.fixture
def counted(monkeypatch):
    """Every metric computed, by name."""
    calls = []
    compute = scoring.compute

    def counting(name, *args, **kwargs):
        calls.append(name)
        return compute(name, *args, **kwargs)

    monkeypatch.setattr(scoring, "compute", counting)
    return calls


def test_evaluate_writes_scores_summary_and_plots_then_resumes(tmp_path, capsys, counted):
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("coffee.png", "rocket.jpg"):
        shutil.copy(PHOTOS / name, photos / name)
    (photos / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 garbage, not a JPEG" * 20)
    out = tmp_path / "out"
    command = ["evaluate", str(photos), "--out", str(out), "--methods", "gradcam,saliency",
               "--metrics", "deletion,insertion", *STEP]

    # The broken image is named, with its reason, and does not stop the run: exit 1.
    assert main(command) == 1
    streams = capsys.readouterr()
    broken = str(photos / "broken.jpg")
    assert f"explain: failed: {broken}: " in streams.err
    failures = read_csv(out / "failures.csv")
    assert {(f["image"], f["method"], f["metric"]) for f in failures} == {
        (broken, m, k) for m in ("gradcam", "saliency") for k in ("deletion", "insertion")}
    assert all("corrupt image data" in f["error"] or "not an image" in f["error"] for f in failures)

    rows = read_csv(out / "scores.csv")
    assert list(rows[0]) == ["image", "method", "target", "target_id", "target_name", "metric", "value", "layer",
                             "settings"]
    images = [str(photos / "coffee.png"), str(photos / "rocket.jpg")]
    assert sorted((r["image"], r["method"], r["metric"]) for r in rows) == sorted(
        (i, m, k) for i in images for m in ("gradcam", "saliency") for k in ("deletion", "insertion"))
    for row in rows:
        assert 0 <= float(row["value"]) <= 1 and row["target"] == "top1"
        assert row["target_name"] == explain.models.imagenet_classes()[int(row["target_id"])]
        assert row["layer"] == ("bn2" if row["method"] == "gradcam" else "input")
    assert {r["target_name"] for r in rows if r["image"] == images[0]} == {"espresso"}
    assert sorted(counted) == ["deletion", "deletion", "insertion", "insertion"]  # one batch, once per method

    # The summary: methods by metric columns, mean ± std, the best of each column marked with *.
    table = streams.out.splitlines()
    assert table[0].split() == ["method", "deletion", "↓", "insertion", "↑"]
    assert [line.split()[0] for line in table[1:3]] == ["gradcam", "saliency"]
    assert all(line.count("±") == 2 for line in table[1:3])
    assert sum(line.count("*") for line in table[1:3]) == 2  # one best per column
    # One unreadable image is one failed image (its 4 scores, method x metric, are missing).
    assert (f"8 scored now, 0 skipped (already in scores.csv), 1 image failed (4 scores missing, see "
            f"{out / 'failures.csv'}); 3 images in ") in streams.out
    summary = read_csv(out / "summary.csv")
    assert {(s["method"], s["metric"], s["n"]) for s in summary} == {
        (m, k, "2") for m in ("gradcam", "saliency") for k in ("deletion", "insertion")}
    assert sorted(s["best"] for s in summary) == ["False", "False", "True", "True"]
    assert (out / "summary.md").read_text().count("**") == 4
    for name in ("curves_deletion.png", "curves_insertion.png", "summary.png"):
        with Image.open(out / "plots" / name) as plot:
            assert plot.format == "PNG" and plot.size[0] > 300
    curves = [json.loads(line) for line in (out / "curves.jsonl").read_text().splitlines()]
    assert len(curves) == 8 and {len(c["values"]) for c in curves} == {5} and curves[0]["steps"][-1] == 1.0

    # The same command again computes nothing (the broken image is tried again, and fails again).
    counted.clear()
    assert main(command + ["-q"]) == 1
    assert counted == []
    assert "0 scored now, 8 skipped (already in scores.csv), 1 image failed (4 scores missing" in capsys.readouterr().out
    assert read_csv(out / "scores.csv") == rows

    # A new metric: only it is computed; --overwrite redoes it without duplicating rows.
    command[command.index("--metrics") + 1] = "deletion,insertion,sparseness"
    assert main(command + ["-q"]) == 1
    assert counted == ["sparseness", "sparseness"]
    assert "sparseness ↑" in capsys.readouterr().out
    assert len(read_csv(out / "scores.csv")) == 12
    counted.clear()
    assert main(command[:-2] + ["--metrics", "sparseness", "--overwrite", "-q"]) == 1
    assert counted == ["sparseness", "sparseness"]
    capsys.readouterr()
    again = read_csv(out / "scores.csv")
    assert len(again) == 12 and again[:8] == rows


def test_localisation_metrics_with_regions(tmp_path, capsys):
    # Boxes in model-input pixels: the central half of the 224 x 224 crop for coffee.png, no
    # region for rocket.jpg (recorded as failed, exit 1).
    (tmp_path / "regions.csv").write_text("image,x0,y0,x1,y1\ncoffee.png,56,56,168,168\n")
    images = [str(PHOTOS / "coffee.png"), str(PHOTOS / "rocket.jpg")]
    out = tmp_path / "out"
    code = main(["evaluate", *images, "--out", str(out), "--metrics", "pointing-game,relevance-mass",
                 "--regions", str(tmp_path / "regions.csv"), "-q"])
    assert code == 1
    rows = read_csv(out / "scores.csv")
    assert [(Path(r["image"]).name, r["metric"]) for r in rows] == [
        ("coffee.png", "pointing-game"), ("coffee.png", "relevance-mass")]
    assert float(rows[0]["value"]) in (0.0, 1.0) and 0 < float(rows[1]["value"]) < 1
    failures = read_csv(out / "failures.csv")
    assert {(Path(f["image"]).name, f["metric"]) for f in failures} == {
        ("rocket.jpg", "pointing-game"), ("rocket.jpg", "relevance-mass")}
    assert "no region for this image" in failures[0]["error"]
    capsys.readouterr()

    # A folder of masks at the photos' own size goes through the same resize and crop: a mask
    # that covers the whole photo holds all the relevance.
    (tmp_path / "masks").mkdir()
    for name in ("coffee.png", "rocket.jpg"):
        with Image.open(PHOTOS / name) as photo:
            Image.new("L", photo.size, 255).save(tmp_path / "masks" / f"{Path(name).stem}.png")
    code = main(["evaluate", *images, "--out", str(tmp_path / "masked"), "--metrics", "relevance-mass",
                 "--regions", str(tmp_path / "masks"), "-q"])
    assert code == 0
    assert [float(r["value"]) for r in read_csv(tmp_path / "masked" / "scores.csv")] == [1.0, 1.0]


def test_information_curves_and_top_k_intersection_from_the_command_line(tmp_path):
    # sic reads the photos' 8-bit pixels: evaluate hands it the bundled model's normalisation
    # (without it the normalised inputs would fail with "pass normalization=(mean, std)").
    (tmp_path / "regions.csv").write_text("image,x0,y0,x1,y1\ncoffee.png,56,56,168,168\n")
    out = tmp_path / "out"
    code = main(["evaluate", str(PHOTOS / "coffee.png"), "--out", str(out), "--methods", "gradcam",
                 "--metrics", "sic,top-k-intersection", "--regions", str(tmp_path / "regions.csv"), "-q"])
    assert code == 0 and not read_csv(out / "failures.csv")
    values = {r["metric"]: float(r["value"]) for r in read_csv(out / "scores.csv")}
    assert list(values) == ["sic", "aic", "top-k-intersection"]
    assert all(0 <= v <= 1 for v in values.values()), values
    curves = [json.loads(line) for line in (out / "curves.jsonl").read_text().splitlines()]
    assert {c["curve"] for c in curves} == {"sic", "aic"}


@pytest.mark.parametrize(("options", "message"), [
    (["--metrics", "delction"], "unknown metric 'delction'; did you mean deletion"),
    (["--metrics", "nothing"], "known metrics: deletion, insertion, average-drop"),
    (["--metrics", "deletion,pointing-game"], "--metrics pointing-game: these metrics need the objects' regions; "
                                              "pass --regions FILE"),
    (["--metrics", "deletion", "--regions", "regions.csv"], "--regions is read only by pointing-game"),
    (["--metrics", "sparseness", "--step", "100"], "--step applies to none of the metrics sparseness"),
    (["--metrics", "relevance-mass", "--regions", "bad.csv"], "bad.csv, line 2: expected image,x0,y0,x1,y1"),
    (["--methods", "gradcamm"], "unknown method 'gradcamm'"),
    (["--max-memory", "2XB"], "--max-memory 2XB: give a size such as 2GB, 512MiB"),
    (["-M", "ig:n_steps=3"], "--method-option ig:n_steps=3: ig is not among --method gradcam; add it to --method"),
    (["--methods", "ig", "-M", "ig:n_steps=0"], "--method-option ig:n_steps=0: n_steps must be a positive int"),
    (["-M", "gradcam:target_layer=bn2"], "target_layer is set by --layer for all the methods"),
    (["--actors", "2"], "--actors applies to --engine ray; add --engine ray or leave --actors out"),
])
def test_usage_errors_exit_2(tmp_path, monkeypatch, capsys, options, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "regions.csv").write_text("image,x0,y0,x1,y1\n")
    (tmp_path / "bad.csv").write_text("image,x0,y0,x1,y1\ncoffee.png,10,10,5\n")
    assert main(["evaluate", str(PHOTOS / "coffee.png"), "--out", "out", *options]) == 2
    error = capsys.readouterr().err
    assert error.startswith("explain: error: ") and message in error
    assert not (tmp_path / "out" / "scores.csv").exists()


def test_method_options_reach_evaluate_and_a_changed_one_rescores_its_method(tmp_path, capsys, counted):
    command = ["evaluate", str(PHOTOS / "coffee.png"), "--out", str(tmp_path / "out"), "--methods", "ig,gradcam",
               "--metrics", "sparseness", "-q"]
    assert main([*command, "-M", "ig:n_steps=2"]) == 0
    rows = {r["method"]: r for r in read_csv(tmp_path / "out" / "scores.csv")}
    assert rows["ig"]["settings"] == "model=efficientnet_lite0 weights=- layer=input n_steps=2"
    assert rows["gradcam"]["settings"] == "model=efficientnet_lite0 weights=- layer=bn2"
    counted.clear()
    assert main([*command, "--method-option", "ig:n_steps=3"]) == 0  # IG alone is scored again
    assert counted == ["sparseness"] and "1 scored now, 1 skipped" in capsys.readouterr().out
    again = {r["method"]: r for r in read_csv(tmp_path / "out" / "scores.csv")}
    assert again["ig"]["settings"].endswith(" n_steps=3") and again["gradcam"] == rows["gradcam"]
    assert again["ig"]["value"] != rows["ig"]["value"]  # three steps draw another map than two


def test_evaluate_runs_under_max_memory_and_warns_before_costly_methods(tmp_path, capsys, heavy_method):
    command = ["evaluate", str(PHOTOS / "coffee.png"), "--out", str(tmp_path / "out"), "--methods",
               "gradcam,saliency,heavypasses", "--metrics", "sparseness", "--max-memory", "1.5GiB"]
    assert main(command) == 0
    assert heavy_method.budgets and set(heavy_method.budgets) == {int(1.5 * 2**30)}
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("explain: warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("explain: warning: heavypasses (")
    assert main(command + ["--overwrite", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_run_with_metrics_puts_the_table_in_the_index(tmp_path, capsys):
    out = tmp_path / "out"
    command = ["run", str(PHOTOS / "coffee.png"), "--out", str(out), "--method", "gradcam,saliency",
               "--metrics", "deletion", *STEP, "-q"]
    assert main(command) == 0
    streams = capsys.readouterr()
    assert streams.out.splitlines()[0].split() == ["method", "deletion", "↓"]
    page = (out / "index.html").read_text(encoding="utf-8")
    assert '<table class="metrics">' in page and "deletion ↓" in page
    assert page.count("<strong>") == 1  # the best of the two methods
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [sorted(r["metrics"]) for r in rows] == [["deletion"], ["deletion"]]
    assert all(0 <= r["metrics"]["deletion"] <= 1 for r in rows)
    # Complete outputs with their metric values are skipped on a rerun; without --metrics the
    # index has no table.
    assert main(command) == 0
    assert "0 done now, 2 skipped" in capsys.readouterr().out
    assert main(command[:6] + ["-q"]) == 0
    capsys.readouterr()
    assert '<table class="metrics">' not in (out / "index.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- the Python API


def test_summary_table_mean_std_and_best_per_direction():
    rows = [
        *({"method": "a", "metric": "deletion", "value": v} for v in (0.1, 0.3)),      # lower is better
        *({"method": "b", "metric": "deletion", "value": v} for v in ("0.5", "nan")),   # text, as read from CSV
        *({"method": "a", "metric": "insertion", "value": v} for v in (0.2, 0.4)),     # higher is better
        *({"method": "b", "metric": "insertion", "value": v} for v in (0.6, 0.6)),
        {"method": "a", "metric": "sparseness", "value": 0.5},                         # one method: no best
        *({"method": m, "metric": "mine", "value": 1.0} for m in "ab"),                # no direction: no best
        {"method": "b", "metric": "complexity", "value": float("nan")},                # nothing to average
    ]
    table = summary_table(rows)
    found = {(e["method"], e["metric"]): e for e in table}
    assert [(e["method"], e["metric"]) for e in table] == [
        ("a", "deletion"), ("b", "deletion"), ("a", "insertion"), ("b", "insertion"), ("a", "sparseness"),
        ("a", "mine"), ("b", "mine"), ("b", "complexity")]
    assert found["a", "deletion"]["mean"] == pytest.approx(0.2)
    assert found["a", "deletion"]["std"] == pytest.approx(math.sqrt(0.02))  # sample std, ddof 1
    assert (found["b", "deletion"]["mean"], found["b", "deletion"]["std"], found["b", "deletion"]["n"]) == (0.5, 0.0, 1)
    assert found["a", "deletion"]["higher_is_better"] is False and found["a", "insertion"]["higher_is_better"] is True
    assert {key for key, e in found.items() if e["best"]} == {("a", "deletion"), ("b", "insertion")}
    assert math.isnan(found["b", "complexity"]["mean"]) and found["b", "complexity"]["n"] == 0
    # Other columns take their direction from the caller.
    assert summary_table(rows[-3:-1], higher_is_better={"mine": True})[0]["best"] is True

    text = format_summary(table).splitlines()
    assert text[0].split() == ["method", "deletion", "↓", "insertion", "↑", "sparseness", "↑", "mine", "complexity", "↓"]
    assert text[1].split()[:8] == ["a", "0.2", "±", "0.14", "*", "0.3", "±", "0.14"]
    assert text[2].split() == ["b", "0.5", "±", "0", "0.6", "±", "0", "*", "-", "1", "±", "0", "-"]
    markdown = format_summary(table, "markdown").splitlines()
    assert markdown[0].startswith("| method | deletion ↓ |") and markdown[1].startswith("|---|")
    assert "| **0.2 ± 0.14** |" in markdown[2] and "**0.6 ± 0**" in markdown[3]
    assert format_summary(table, "html").count("<strong>") == 2


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).eval()


class _Broken(explain.Explainer):
    name = "broken"

    def _explain(self, images, targets=None, *, topk=None):
        raise RuntimeError("cannot explain")


def test_evaluate_records_failures_and_keeps_going():
    model = _tiny_model()
    images = torch.rand(3, 3, 16, 16)
    cam = explain.GradCAM(model, target_layer="2")
    found = evaluate({"gradcam": cam, "broken": _Broken(model)}, images, ["deletion", "sparseness", "road"],
                     topk=2, options={"deletion": {"step": -1}, "road": {"percentages": (25, 50)}})
    # The explainer that raises loses all its metrics; the metric that raises, only itself.
    failed, broken = found.failures
    assert broken == {"method": "broken", "metric": None, "error": "RuntimeError: cannot explain"}
    assert failed["method"] == "gradcam" and failed["metric"] == "deletion"
    assert "step must be a number of pixels" in failed["error"]
    # topk=2: two targets per image, each with its rows; road reports three columns and four curves.
    columns = [(r["image"], r["rank"], r["metric"]) for r in found.rows]
    assert len(columns) == 3 * 2 * 4 and len(set(columns)) == len(columns)
    assert {r["metric"] for r in found.rows} == {"sparseness", "road", "road-morf", "road-lerf"}
    assert {(c["curve"], len(c["values"])) for c in found.curves} == {
        ("morf", 2), ("lerf", 2), ("morf_accuracy", 2), ("lerf_accuracy", 2)}
    assert found.curves[0]["steps"].tolist() == [25.0, 50.0]
    with pytest.raises(ValueError, match="known metrics"):
        evaluate({"gradcam": cam}, images, ["delection"])


def test_plots_of_curves_summary_and_randomisation():
    model = _tiny_model()
    found = evaluate([explain.GradCAM(model, target_layer="2"), explain.Saliency(model)], torch.rand(2, 3, 16, 16),
                     ["deletion", "randomisation"], options={"deletion": {"step": 64}})
    assert found.failures == []
    figures = plot_curves(found.curves)
    assert list(figures) == ["deletion"]  # the randomisation has a figure of its own
    axes = figures["deletion"].axes[0]
    assert [line.get_label() for line in axes.lines] == ["gradcam", "saliency"]
    assert axes.get_xlabel() == "fraction of pixels deleted"
    bars = plot_summary(summary_table(found.rows))
    assert isinstance(bars, Figure) and len(bars.axes) == 3  # deletion, randomisation, randomisation-ssim
    sanity = plot_randomisation(found.curves)
    assert [a.get_ylabel() for a in sanity.axes] == ["spearman", "ssim"]
    assert [t.get_text() for t in sanity.axes[0].get_xticklabels()] == ["6", "2", "0"]  # the layers, top first
    assert plot_randomisation([c for c in found.curves if c["metric"] == "deletion"]) is None
    # Curves over different steps (IROF's) are resampled onto the longest, holding their last value.
    irregular = [{"metric": "irof", "curve": "irof", "method": "m", "steps": s, "values": v}
                 for s, v in (([0, 1, 2], [1.0, 0.5, 0.0]), ([0, 1], [1.0, 0.0]))]
    assert mean_curves(irregular)["irof"]["irof"]["m"]["mean"].tolist() == [1.0, 0.25, 0.0]


def test_read_regions_unites_boxes_and_matches_names(tmp_path):
    (tmp_path / "boxes.csv").write_text("image,x0,y0,x1,y1\na.png,0,0,2,1\nsub/a.png,3,3,4,4\nb,2,2,4,4\n"
                                        "a.png,3,0,4,1\n")
    masks = read_regions(tmp_path / "boxes.csv", ["photos/a.png", "photos/b.jpg", "photos/c.png"], (4, 4))
    assert masks[0].int().tolist() == [[1, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert masks[1].sum().item() == 4 and masks[2] is None


def test_a_line_cut_short_by_a_kill_is_dropped(tmp_path):
    from explain.evaluation import files

    path = tmp_path / "scores.csv"
    rows = [{"image": "a.png", "method": "gradcam", "metric": "deletion", "value": 0.25}]
    path.write_text(files.csv_lines(rows, files.SCORE_FIELDS, header=True) + "b.png,gradcam,top1,1,x,deletion,0.2")
    assert [(r["image"], r["value"]) for r in files.read_csv(path)] == [("a.png", "0.25")]
    (tmp_path / "curves.jsonl").write_text(files.jsonl_lines([{"values": [1.0, float("nan")]}]) + '{"values": [1')
    assert files.read_jsonl(tmp_path / "curves.jsonl") == [{"values": [1.0, None]}]


def test_evaluate_scores_in_halves_when_the_device_runs_out_of_memory(tmp_path, one_image_at_a_time):
    # `explain evaluate` scores each group in halves down to single images, each score written once.
    sizes = one_image_at_a_time
    out = tmp_path / "out"
    assert main(["evaluate", str(REPO / "data" / "images"), "--out", str(out), "--metrics", "sparseness",
                 "--batch-size", "4", "-q"]) == 0
    rows = read_csv(out / "scores.csv")
    assert sorted(Path(r["image"]).name for r in rows) == sorted(p.name for p in (REPO / "data" / "images").iterdir())
    assert all(0 <= float(r["value"]) <= 1 for r in rows)
    assert 4 in sizes and 2 in sizes and sizes.count(1) >= 4
    assert read_csv(out / "failures.csv") == []


def test_scores_that_fail_for_memory_running_out_end_with_exit_3_and_what_to_lower(tmp_path, capsys, monkeypatch):
    # A device that holds no image: each score fails with the reason, the run ends with exit 3
    # (not 1) and the note of what to free or lower, as explain run does.
    from explain.batch.evaluating import EvaluationRun
    from explain.methods import cam_base

    capture, started = cam_base.BaseCAM.capture, []

    def no_room(self, images, *args, **kwargs):
        if started:  # the methods' check on the model's example image, before the run, passes
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return capture(self, images, *args, **kwargs)

    monkeypatch.setattr(cam_base.BaseCAM, "capture", no_room)
    monkeypatch.setattr(EvaluationRun, "begin", lambda self: started.append(True), raising=False)
    out = tmp_path / "out"
    assert main(["evaluate", str(PHOTOS / "coffee.png"), "--out", str(out), "--methods", "gradcam",
                 "--metrics", "sparseness", "-q"]) == EXIT_OUT_OF_MEMORY
    failures = read_csv(out / "failures.csv")
    assert len(failures) == 1 and "out of memory" in failures[0]["error"]
    assert "out of memory" in capsys.readouterr().err.splitlines()[-1]


def test_evaluate_runs_the_robustness_and_randomisation_metrics_of_issue_30(tmp_path, capsys):
    # One photo, Grad-CAM, two of the metrics that explain again: 1 + 10 explanations for the
    # local Lipschitz estimate, 1 for Efficient MPRT (with the bundled model randomised and put back).
    out = tmp_path / "out"
    assert main(["evaluate", str(PHOTOS / "coffee.png"), "--out", str(out), "--methods", "gradcam",
                 "--metrics", "local-lipschitz-estimate,efficient-randomisation"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["method", "local-lipschitz-estimate", "↓", "efficient-randomisation", "↑"]
    rows = {r["metric"]: float(r["value"]) for r in read_csv(out / "scores.csv")}
    assert list(rows) == ["local-lipschitz-estimate", "efficient-randomisation"]
    assert rows["local-lipschitz-estimate"] > 0 and math.isfinite(rows["efficient-randomisation"])


def test_evaluate_runs_the_metrics_of_issue_44(tmp_path, capsys):
    # Two photos and their mirror images (the same class: focus has its mosaics, sufficiency
    # and consistency their neighbours), Grad-CAM, every metric of issue 44 in one run; the
    # non-sensitivity test replaces a quarter of the image at a time (--step).
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("coffee.png", "astronaut.png"):  # espresso and space shuttle, mirrored or not
        with Image.open(PHOTOS / name) as photo:
            photo.convert("RGB").save(photos / name)
            photo.convert("RGB").transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(photos / f"flipped-{name}")
    names = sorted(p.name for p in photos.iterdir())
    (tmp_path / "regions.csv").write_text("image,x0,y0,x1,y1\n" + "".join(f"{n},56,56,168,168\n" for n in names))
    new = ["arcc", "completeness", "non-sensitivity", "input-invariance", "sufficiency", "consistency", "focus",
           "auc", "attribution-localisation", "effective-complexity", "mst-c"]
    out = tmp_path / "out"
    code = main(["evaluate", str(photos), "--out", str(out), "--methods", "gradcam", "--metrics", ",".join(new),
                 "--regions", str(tmp_path / "regions.csv"), "--step", str(224 * 224 // 4), "-q"])
    assert code == 0 and read_csv(out / "failures.csv") == []
    rows = read_csv(out / "scores.csv")
    columns = [c for name in new for c in explain.metrics.METRICS[name].columns]
    assert sorted((Path(r["image"]).name, r["metric"]) for r in rows) == sorted((n, c) for n in names for c in columns)
    value = {(Path(r["image"]).name, r["metric"]): float(r["value"]) for r in rows}
    for name in names:
        assert 0 < value[name, "arcc"] < 1 and 0 < value[name, "arcc-coherency"] <= 1
        assert value[name, "input-invariance"] == 1.0  # Grad-CAM is invariant to the shift
        assert 0 <= value[name, "focus"] <= 1 and 0 <= value[name, "auc"] <= 1
        assert value[name, "effective-complexity"] > 0 and value[name, "mst-c"] > 0
        assert value[name, "non-sensitivity"] >= 0 and value[name, "completeness-met"] in (0.0, 1.0)
    # The espresso and its mirror image have the closest maps of the four: each other's neighbour.
    assert value["coffee.png", "sufficiency"] == value["flipped-coffee.png", "sufficiency"] == 1.0
    header = capsys.readouterr().out.splitlines()[0]
    assert "mst-c ↑" in header and "non-sensitivity ↓" in header
