"""``explain strategies RUN_DIR`` (explain/cli/strategies.py over explain.analysis) on
finished ``explain run --save-maps`` folders of the planted-shortcut images: the CSV that
pandas reads (one row per manifest row), the per-class JSON, the prototypes; a rerun replaces
the folder whole; a crp run clustered on its concepts; bad input exits 2 with the fix and
writes nothing.

Cheap: the shortcut CNN pickled for --trust-model-file (run at its own 64 pixels, from its
pretrained_cfg; the separation of the marked images is test_strategies.py's, on more images),
16 images of 64 pixels explained with Grad-CAM (6 of them with CRP), shared by the tests."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from explain.cli import main
from explain.data import CLASSES, SHORTCUT_CLASS, load_shortcut_model, shortcut_dataset


def shortcut_folder(root: Path, count: int) -> Path:
    """``count`` images of the shortcut set (half the triangles marked) under root/in, their
    labels in root/labels.csv and the shortcut CNN pickled as root/shortcut.pt; ``root``."""
    (root / "in").mkdir(parents=True)
    data = shortcut_dataset(count, seed=2, mark_rate=0.5)
    lines = ["path,label"]
    for i, (image, label) in enumerate(zip(data.images, data.labels.tolist(), strict=True)):
        name = f"img{i:02d}.png"
        Image.fromarray((image.permute(1, 2, 0) * 255).round().byte().numpy()).save(root / "in" / name)
        lines.append(f"{name},{label}")
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    torch.save(load_shortcut_model(), root / "shortcut.pt")
    return root


def explain_run(folder: Path, out: Path, *extra: str) -> int:
    arguments = ["run", str(folder / "in"), "--out", str(out), "--model", str(folder / "shortcut.pt")]
    return main([*arguments, "--trust-model-file", "-j", "0", "-q", "--device", "cpu", *extra])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return shortcut_folder(tmp_path_factory.mktemp("strategies"), 16)


@pytest.fixture(scope="module")
def run_dir(folder, tmp_path_factory) -> Path:
    """A Grad-CAM run of every image for the shortcut class, with its maps and labels."""
    out = tmp_path_factory.mktemp("run") / "out"
    assert explain_run(folder, out, "--method", "gradcam", "--layer", "block3", "--target", str(SHORTCUT_CLASS),
                       "--save-maps", "--labels", str(folder / "labels.csv")) == 0
    return out


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text(encoding="utf-8").splitlines()]


def test_strategies_writes_the_csv_the_json_and_the_prototypes(run_dir, capsys):
    assert main(["strategies", str(run_dir), "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    out = run_dir / "strategies"
    table = pd.read_csv(out / "strategies.csv")
    rows = _rows(run_dir)
    assert list(table.columns) == ["input", "method", "target", "class", "cluster", "x", "y", "distance"]
    assert sorted(table["input"]) == sorted(row["input"] for row in rows) and len(table) == 16
    assert set(table["method"]) == {"gradcam"} and set(table["target"].astype(str)) == {str(SHORTCUT_CLASS)}
    summary = json.loads((out / "strategies.json").read_text())
    name = str(rows[0]["target_name"])
    assert list(summary) == [name] and set(table["class"].astype(str)) == {name}
    entry = summary[name]
    assert entry["features"] == "maps" and entry["embedding"] == "tsne" and entry["items"] == 16
    assert sum(cluster["size"] for cluster in entry["clusters"]) == 16 == len(table)
    assert sorted(set(table["cluster"])) == list(range(entry["n_clusters"]))
    assert f"{name}: 16 items (maps), {entry['n_clusters']} clusters" in printed
    for number, cluster in enumerate(entry["clusters"]):
        members = table[table["cluster"] == number]
        assert cluster["size"] == len(members) and set(cluster["nearest"]) <= set(members["input"])
        assert 0 <= cluster["mean_probability"] <= 1 and 0 <= cluster["mistake_share"] <= 1  # --labels given
        with Image.open(out / cluster["prototype"]) as picture:
            assert picture.size == (128, 128) and picture.mode == "RGB"
    mistakes = sum(c["mistake_share"] * c["size"] for c in entry["clusters"])
    assert mistakes == pytest.approx(sum(not row["correct"] for row in rows))
    assert np.isfinite(table[["x", "y", "distance"]].to_numpy()).all()


def test_a_rerun_replaces_the_folder_whole_and_out_elsewhere(run_dir, tmp_path):
    out = tmp_path / "elsewhere"
    assert main(["strategies", str(run_dir), "--out", str(out), "--clusters", "2", "--embedding", "spectral"]) == 0
    (out / "stale.txt").write_text("from before")
    first = (out / "strategies.csv").read_text()
    assert main(["strategies", str(run_dir), "--out", str(out), "--clusters", "2", "--embedding", "spectral"]) == 0
    assert not (out / "stale.txt").exists() and (out / "strategies.csv").read_text() == first  # seeded
    assert json.loads((out / "strategies.json").read_text())[CLASSES[SHORTCUT_CLASS]]["n_clusters"] == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["elsewhere"]  # no temporary folder left


def test_a_crp_run_is_clustered_on_its_concepts(folder, tmp_path, capsys):
    out = tmp_path / "crp"
    (tmp_path / "six.txt").write_text("\n".join(str(folder / "in" / f"img{i:02d}.png") for i in range(6)) + "\n")
    arguments = ["run", f"@{tmp_path / 'six.txt'}", "--out", str(out), "--model", str(folder / "shortcut.pt")]
    arguments += ["--trust-model-file", "-j", "0", "-q", "--device", "cpu", "--method", "crp"]
    arguments += ["-M", "crp:layer=block3", "-M", "crp:concepts=3", "--target", str(SHORTCUT_CLASS), "--save-maps"]
    assert main(arguments) == 0
    assert main(["strategies", str(out), "--embedding", "spectral"]) == 0
    table = pd.read_csv(out / "strategies" / "strategies.csv")
    assert len(table) == 6 and set(table["method"]) == {"crp"}  # one row per image, not per concept
    entry = json.loads((out / "strategies" / "strategies.json").read_text())[CLASSES[SHORTCUT_CLASS]]
    assert entry["features"] == "concepts"
    for cluster in entry["clusters"]:
        assert "prototype" not in cluster and cluster["concepts"]
        assert all(concept.startswith("block3:") for concept in cluster["concepts"])
    assert main(["strategies", str(out), "--features", "maps"]) == 2
    assert "per concept" in capsys.readouterr().err


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("strategies"))
    return copy


@pytest.mark.parametrize(
    ("change", "options", "message"),
    [
        ("missing-npz", [], r"1 of the run's 16 \.npz map files are missing \(.*img00__gradcam\.npz\).*--save-maps"),
        ("no-maps", [], "saved no maps of gradcam: rerun `explain run` with --save-maps"),
        ("no-manifest", [], "holds no manifest.jsonl"),
        ("two-methods", [], "the run holds the methods gradcam, lrp: name one"),
        (None, ["--classes", "dog"], "no rows explain the classes dog; the run's classes: triangle"),
        (None, ["--clusters", "none"], "--clusters: 'auto'"),
        (None, ["--clusters", "30"], "n_clusters must be 'auto' or an int from 1 to the items less one"),
        (None, ["--method", "lrp"], "no finished rows of method 'lrp'"),
        (None, ["--classes", "triangle,dog"], "no rows explain the classes dog; the run's classes: triangle"),
    ],
)
def test_bad_input_exits_2_with_the_fix_and_writes_nothing(run_dir, tmp_path, capsys, change, options, message):
    copy = _copy(run_dir, tmp_path)
    rows = _rows(copy)
    if change == "missing-npz":
        (copy / rows[0]["maps"]).unlink()
    elif change == "no-maps":
        lines = [json.dumps({**row, "maps": None}) for row in rows]
        (copy / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    elif change == "no-manifest":
        (copy / "manifest.jsonl").unlink()
    elif change == "two-methods":
        lines = [json.dumps(row) for row in rows] + [json.dumps({**rows[0], "method": "lrp"})]
        (copy / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["strategies", str(copy), *options]) == 2
    error = capsys.readouterr().err
    assert error.startswith("explain: error:") and re.search(message, error), error
    assert not (copy / "strategies").exists()
    assert not [p for p in copy.iterdir() if p.name.startswith(".strategies")]


def test_a_class_with_two_images_is_left_out_with_a_note_or_refused_when_named(run_dir, tmp_path, capsys):
    copy = _copy(run_dir, tmp_path)
    rows = _rows(copy)
    for row in rows[:2]:  # two rows (and their .npz files) now explain the disc
        row.update(target="0", target_id=0, target_name="disc")
        with np.load(copy / row["maps"]) as npz:
            arrays = dict(npz)
        np.savez(copy / row["maps"], **{**arrays, "targets": np.zeros_like(arrays["targets"])})
    (copy / "manifest.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    assert main(["strategies", str(copy), "--embedding", "spectral"]) == 0
    captured = capsys.readouterr()
    assert "left out the classes with fewer than 5 items, too few to cluster: disc (2)" in captured.err
    assert list(json.loads((copy / "strategies" / "strategies.json").read_text())) == ["triangle"]
    assert main(["strategies", str(copy), "--classes", "disc"]) == 2
    assert "class disc: SpRAy needs at least 5 items of a class to cluster, got 2" in capsys.readouterr().err


def test_out_never_replaces_a_folder_of_other_files(run_dir, tmp_path, capsys):
    # --out as the run's folder, a folder above it or one holding other files: refused before
    # any work (exit 2), nothing deleted; an earlier strategies folder is replaced.
    copy = _copy(run_dir, tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out in (copy, tmp_path):
        assert main(["strategies", str(copy), "--out", str(out)]) == 2
        assert "the run's folder or a folder above it" in capsys.readouterr().err
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert main(["strategies", str(copy), "--out", str(other)]) == 2
    assert "holds other files than the strategies (keep.txt)" in capsys.readouterr().err
    assert (other / "keep.txt").read_text() == "mine"
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not p.is_relative_to(other)) == before
    assert main(["strategies", str(copy), "--out", str(tmp_path / "mine")]) == 0
    assert main(["strategies", str(copy), "--out", str(tmp_path / "mine")]) == 0  # its own: replaced
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["prototypes", "strategies.csv", "strategies.json"]
