"""``explain concepts tcav FOLDER --class C --concept NAME=FOLDER --random FOLDER --layer L``
(explain/cli/tcav.py over explain.concepts.TCAV and explain.analysis.write_tcav) on folders of
the planted-shortcut set: tcav.json and the tcav.csv that pandas reads, random sets drawn
from one folder or one per folder, the activation cache reused by a rerun, bad input exits 2
with the fix and writes nothing.

Cheap: the shortcut CNN pickled for --trust-model-file, 6 triangles, 6 mark images, a pool of
16 random images (the significance on the benchmark is test_tcav.py's acceptance test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

from explain.analysis.tcav_files import TCAV_FIELDS
from explain.cli import main
from explain.data import SHORTCUT_CLASS, load_shortcut_model, shortcut_dataset


def save(images: torch.Tensor, folder: Path) -> None:
    folder.mkdir(parents=True)
    for i, image in enumerate(images):
        Image.fromarray((image.permute(1, 2, 0) * 255).round().byte().numpy()).save(folder / f"{i:02d}.png")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """root/triangles (6), root/mark (6 mark-only images), root/pool (16 images of the set),
    root/sets/sJ (3 random sets of 4); root/shortcut.pt the CNN."""
    root = tmp_path_factory.mktemp("tcav")
    data = shortcut_dataset(24, seed=4)
    save(data.images[data.labels == SHORTCUT_CLASS], root / "triangles")
    marked = shortcut_dataset(6, seed=5, mark_rate=(1, 1, 1, 1))
    save(torch.where(marked.marks[:, None], marked.images, torch.full_like(marked.images, 0.6)), root / "mark")
    pool = shortcut_dataset(16, seed=7).images
    save(pool, root / "pool")
    for j in range(3):
        save(pool[4 * j : 4 * j + 4], root / "sets" / f"s{j}")
    torch.save(load_shortcut_model(), root / "shortcut.pt")
    return root


MODEL = ["--trust-model-file", "--device", "cpu"]


def tcav(folder: Path, *extra: str, randoms=("pool",)) -> int:
    model = ["--model", str(folder / "shortcut.pt"), *MODEL]
    options = ["--concept", f"mark={folder / 'mark'}", "--layer", "block3", "--random-sets", "4", "--random-size", "5"]
    options += ["--min-random-sets", "4"]
    random = [item for name in randoms for item in ("--random", str(folder / name))]
    command = ["concepts", "tcav", str(folder / "triangles"), "--class", "triangle"]
    return main([*command, *model, *options, *random, *extra])


def test_tcav_writes_the_json_and_the_csv_and_reuses_the_cache(folder, capsys):
    out = folder / "out"
    assert tcav(folder, "--out", str(out), "--layer", "block4,") == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "tcav.json").read_text())
    assert summary["method"] == "tcav" and summary["correction"] == "bonferroni" and summary["tests"] == 2
    assert summary["layers"] == ["block3", "block4"] and summary["concepts"] == ["mark"]
    assert summary["classes"] == [{"id": SHORTCUT_CLASS, "name": "triangle"}] and len(summary["random_sets"]) == 4
    assert summary["sources"]["random"] == [{"folder": str(folder / "pool"), "images": 16}]
    assert summary["sources"]["concepts"]["mark"]["images"] == 6 and len(summary["sources"]["images"]) == 6
    for entry in summary["scores"]:
        assert len(entry["scores"]) == len(entry["null_scores"]) == len(entry["accuracies"]) == 4
        assert entry["score_mean"] == pytest.approx(sum(entry["scores"]) / 4, abs=2e-6)
        assert entry["corrected_p"] == pytest.approx(min(1, 2 * entry["p_value"]), abs=4e-6)
        assert entry["significant"] == (entry["corrected_p"] < 0.05) and entry["direction"] in "+-0"
    table = pd.read_csv(out / "tcav.csv")
    assert list(table.columns) == list(TCAV_FIELDS) and len(table) == 2
    assert table["layer"].tolist() == ["block3", "block4"] and table["class"].tolist() == ["triangle"] * 2
    assert table["score_mean"].tolist() == pytest.approx([e["score_mean"] for e in summary["scores"]])
    assert "mark at block3 for triangle: " in printed and f"wrote {out / 'tcav.json'} and tcav.csv" in printed
    cache = folder / "out-cache"
    cached = {p.name: p.stat().st_mtime_ns for p in cache.glob("*.pt")}
    assert len(cached) == 2 * 2  # the mark and the pool, at two layers
    # a rerun replaces the folder whole and reads every folder's activations from the cache
    (out / "stale.txt").write_text("from before")
    assert tcav(folder, "--out", str(out)) == 0
    assert not (out / "stale.txt").exists() and json.loads((out / "tcav.json").read_text())["layers"] == ["block3"]
    assert {p.name: p.stat().st_mtime_ns for p in cache.glob("*.pt")} == cached


def test_one_random_set_per_folder_and_the_default_out(folder):
    sets = [f"sets/s{j}" for j in range(3)]
    assert tcav(folder, "--min-random-sets", "3", "--alternative", "greater", randoms=sets) == 0
    summary = json.loads((folder / "triangles-tcav" / "tcav.json").read_text())
    assert summary["random_sets"] == ["random 0", "random 1", "random 2"] and summary["alternative"] == "greater"
    assert [s["images"] for s in summary["sources"]["random"]] == [4, 4, 4]
    assert (folder / "triangles-tcav-cache").is_dir()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--class", "triangel"], r"unknown class name 'triangel'; did you mean: 'triangle'"),
        (["--layer", "blok3"], r"model has no layer named 'blok3'; did you mean: block3"),
        (
            ["--random-sets", "3"],
            r"got 3 random sets; TCAV's test needs at least 4 \(--min-random-sets\): pass more "
            r"random sets, or one --random folder and --random-sets N",
        ),
        (
            ["--random-size", "16"],
            r"drawing random sets of 16 images from 16 needs 4 <= size < 16: add images to "
            r"the random folder .* or pass a --random-size in that range",
        ),
        (["--concept", "stripes"], r"--concept 'stripes': give NAME=FOLDER"),
        (["--alpha", "2"], r"alpha and test_size are in \(0, 1\)"),
        (["--concept", "mark={folder}/mark"], r"two --concept options name the same concept: give each its own NAME"),
        (["--random", "{folder}/pool"], r"a --random folder is given twice: give each random set its own folder"),
    ],
)
def test_bad_input_exits_2_with_the_fix_and_writes_nothing(folder, capsys, extra, message):
    out = folder / "bad"
    assert tcav(folder, "--out", str(out), *(text.format(folder=folder) for text in extra)) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists() and not list(folder.glob(".bad.*")) and not (folder / "bad-cache").exists()


def test_bad_folders_exit_2_and_write_nothing(folder, tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    assert tcav(folder, "--out", str(out), "--concept", f"none={tmp_path / 'empty'}") == 2
    assert "empty holds no images (" in capsys.readouterr().err
    save(torch.rand(2, 3, 64, 64), tmp_path / "two")
    sets = ["sets/s0", "sets/s1", str(tmp_path / "two")]
    assert tcav(folder, "--out", str(out), "--min-random-sets", "3", randoms=sets) == 2
    assert f"--random {tmp_path / 'two'} has 2 images; a CAV needs at least 4" in capsys.readouterr().err
    assert tcav(folder, "--out", str(folder / "mark" / "out")) == 2
    assert "an images' folder" in capsys.readouterr().err
    assert tcav(folder, "--out", str(out), "--cache", str(out / "cache")) == 2
    assert "lies in --out" in capsys.readouterr().err
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert tcav(folder, "--out", str(other)) == 2
    assert "holds other files than TCAV's scores (keep.txt)" in capsys.readouterr().err
    assert (other / "keep.txt").read_text() == "mine" and not out.exists()
    assert main(["concepts", "tcav", str(tmp_path / "no"), "--class", "1", "--concept", "a=b", "--random", "r",
                 "--layer", "x"]) == 2  # fmt: skip
    assert "is not a folder: pass the folder that holds the class's images" in capsys.readouterr().err
