"""``explain concepts craft FOLDER --class C`` (explain/cli/craft.py over explain.concepts.CRAFT
and explain.analysis.write_craft) on a folder of the planted-shortcut triangles: craft.json and
the craft.csv that pandas reads, the best crops and the concept maps as PNGs; a rerun replaces
the folder whole; bad input exits 2 with the fix and writes nothing.

Cheap: the shortcut CNN pickled for --trust-model-file (run at its own 64 pixels, from its
pretrained_cfg), 6 triangles, 3 concepts, 8 Sobol designs (the mark found is test_craft.py's)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

from explain.cli import main
from explain.data import SHORTCUT_CLASS, load_shortcut_model, shortcut_dataset


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """root/triangles: 6 triangles of the shortcut set as PNGs; root/shortcut.pt the CNN."""
    root = tmp_path_factory.mktemp("craft")
    (root / "triangles" / "more").mkdir(parents=True)
    data = shortcut_dataset(24, seed=4)
    triangles = data.images[data.labels == SHORTCUT_CLASS]
    for i, image in enumerate(triangles):
        place = root / "triangles" / ("more" if i % 2 else "") / f"tri{i:02d}.png"
        Image.fromarray((image.permute(1, 2, 0) * 255).round().byte().numpy()).save(place)
    torch.save(load_shortcut_model(), root / "shortcut.pt")
    return root


def craft(folder: Path, *extra: str) -> int:
    model = ["--model", str(folder / "shortcut.pt"), "--trust-model-file", "--device", "cpu"]
    options = ["--layer", "block3", "--concepts", "3", "--designs", "8", "--best", "4", "--maps", "2"]
    return main(["concepts", "craft", str(folder / "triangles"), "--class", "triangle", *model, *options, *extra])


def test_craft_writes_the_json_the_csv_the_crops_and_the_maps(folder, capsys):
    out = folder / "out"
    assert craft(folder, "--out", str(out), "--crops", "3") == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "craft.json").read_text())
    assert summary["class"] == "triangle" and summary["class_id"] == SHORTCUT_CLASS and summary["layer"] == "block3"
    assert len(summary["images"]) == 6 and "more/tri01.png" in summary["images"] and summary["crops"] == 6 * 3
    assert summary["settings"]["concepts"] == 3 and 0 <= summary["error"] < 1
    importances = [entry["importance"] for entry in summary["concepts"]]
    assert importances == sorted(importances, reverse=True) and len(importances) == 3
    table = pd.read_csv(out / "craft.csv")
    assert list(table.columns) == ["concept", "importance", "importance_sd", "best_image", "best_crop"]
    assert table["concept"].tolist() == [0, 1, 2] and table["importance"].tolist() == pytest.approx(importances)
    for entry in summary["concepts"]:
        assert len(entry["best_crops"]) == 4
        coefficients = [crop["coefficient"] for crop in entry["best_crops"]]
        assert coefficients == sorted(coefficients, reverse=True)
        for crop in entry["best_crops"]:
            assert crop["image"] in summary["images"] and crop["box"][2:] == [32, 32]  # half of 64
            with Image.open(out / crop["file"]) as picture:
                assert picture.size == (128, 128)
    maps = sorted(p.name for p in (out / "maps").iterdir())
    assert maps == [f"{stem}__c{j}.png" for stem in ("more__tri01", "more__tri03") for j in range(3)]
    assert "triangle at block3: 3 concepts from 18 crops of 6 images" in printed
    assert f"wrote {out / 'craft.json'}, craft.csv, crops/ and maps/" in printed
    # a rerun replaces the folder whole: no file of the earlier one stays
    (out / "stale.txt").write_text("from before")
    assert craft(folder, "--out", str(out), "--maps", "0", "--crops", "2", "--seed", "1") == 0
    assert not (out / "stale.txt").exists() and not (out / "maps").exists()
    assert json.loads((out / "craft.json").read_text())["crops"] == 12


def test_the_default_out_is_beside_the_folder(folder):
    assert craft(folder, "--maps", "0", "--crops", "1") == 0
    assert (folder / "triangles-craft" / "craft.json").is_file()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--class", "triangel"], r"unknown class name 'triangel'; did you mean: 'triangle'"),
        (["--crops", "some"], r"--crops: 'grid' or a number of random crops per image, got 'some'"),
        (["--crop-size", "2.5"], r"--crop-size: pixels \(such as 96\) or a share"),
        (["--crop-size", "1"], r"--crop-size 1 means crops of 1 x 1 pixels, under the 8 .* \(--crop-size 1.0 is the whole image"),
        (["--crop-size", "1.0", "--concepts", "7"],
         r"--concepts 7 needs at least 7 crops, got 6: pass more images, more crops \(--crops N"),
        (["--layer", "block3.0"], r"negative activations .* pick a layer after a ReLU .* or pass --relu to factorize"),
        (["--layer", "blok3"], r"model has no layer named 'blok3'; did you mean: block3"),
    ],
)
def test_bad_input_exits_2_with_the_fix_and_writes_nothing(folder, capsys, extra, message):
    out = folder / "bad"
    assert craft(folder, "--out", str(out), "--crops", "1", *extra) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists() and not list(folder.glob(".bad.*"))


def test_a_folder_that_is_missing_empty_or_holds_the_output(folder, tmp_path, capsys):
    assert main(["concepts", "craft", str(tmp_path / "none"), "--class", "triangle"]) == 2
    assert "is not a folder: pass the folder that holds the class's images" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    model = ["--model", str(folder / "shortcut.pt"), "--trust-model-file", "--device", "cpu"]
    assert main(["concepts", "craft", str(tmp_path / "empty"), "--class", "triangle", *model]) == 2
    assert "holds no images (" in capsys.readouterr().err
    inside = folder / "triangles" / "out"
    assert craft(folder, "--out", str(inside), "--crops", "1") == 2
    assert "the images' folder, one in it or one above it" in capsys.readouterr().err and not inside.exists()
    # the images' parent is never replaced, even where an earlier run's craft.json lies in it
    (folder / "craft.json").write_text("{}")
    try:
        assert craft(folder, "--out", str(folder), "--crops", "1") == 2
        assert "the images' folder, one in it or one above it" in capsys.readouterr().err
    finally:
        (folder / "craft.json").unlink()
    assert (folder / "shortcut.pt").is_file() and (folder / "triangles").is_dir()
    # nor a folder of other files: it would be deleted
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert craft(folder, "--out", str(other), "--crops", "1") == 2
    error = capsys.readouterr().err
    assert "holds other files than CRAFT's concepts (keep.txt)" in error and "give a new folder" in error
    assert (other / "keep.txt").read_text() == "mine"


def test_the_current_folder_as_the_images_folder(folder, tmp_path, monkeypatch, capsys):
    # `explain concepts craft .` from inside the class's folder: the default --out beside it.
    work = tmp_path / "triangles"
    shutil.copytree(folder / "triangles", work)
    monkeypatch.chdir(work)
    model = ["--model", str(folder / "shortcut.pt"), "--trust-model-file", "--device", "cpu"]
    options = ["--layer", "block3", "--concepts", "2", "--designs", "4", "--best", "2", "--crops", "1"]
    assert main(["concepts", "craft", ".", "--class", "triangle", *model, *options]) == 0
    assert (tmp_path / "triangles-craft" / "craft.json").is_file()


def test_images_of_different_sizes_after_preprocessing_are_a_usage_error(tmp_path):
    """The model's preprocessing resizes (every model explain loads): a preprocessing of one's
    own that keeps the images' sizes gets the message (the command's image reader, directly)."""
    from types import SimpleNamespace

    from torchvision.transforms import ToTensor

    from explain.cli.craft import folder_images
    from explain.errors import UsageError

    for name, size in (("a.png", (20, 16)), ("b.png", (16, 16))):
        Image.new("RGB", size, (200, 10, 10)).save(tmp_path / name)
    loaded = SimpleNamespace(preprocess=ToTensor(), device=torch.device("cpu"))
    with pytest.raises(UsageError, match=r"different sizes after the model's preprocessing .* resize them to one size"):
        folder_images(tmp_path, loaded)
    (tmp_path / "a.png").unlink()
    names, inputs, pictures = folder_images(tmp_path, loaded)  # no normalisation found: the pixels as they are
    assert names == ["b.png"] and inputs.shape == (1, 3, 16, 16) and torch.equal(pictures, inputs)
