"""``explain run --method crp`` (explain/concepts/method.py through the batch layer): one
overlay per top concept of each target, with the concept (``layer:channel``), its rank and
its relevance in the manifest's concept columns (absent from other methods' rows); a rerun
finds the finished concept outputs, one deleted overlay is made again; ``topk`` targets each
get their concepts; mistakes (more concepts than channels, --metrics, a transformer) are
usage errors that say why.

Cheap: a four-channel CNN pickled for --trust-model-file on three 24-pixel images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from explain.cli import main
from explain.report import CONCEPT_FIELDS, MANIFEST_FIELDS

from test_concept_atlas_cli import tiny_inputs


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Three small images (seeded noise with a square) and the tiny CNN as a model file."""
    return tiny_inputs(tmp_path_factory.mktemp("crp"), 3)


def _run(folder: Path, out: Path, *extra: str) -> int:
    arguments = ["run", str(folder / "in"), "--out", str(out), "--model", str(folder / "tiny.pt")]
    return main([*arguments, "--trust-model-file", "-j", "0", "-q", *extra])


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text(encoding="utf-8").splitlines()]


def test_crp_writes_an_overlay_per_concept_with_its_id_and_relevance(folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(folder, out, "--method", "gradcam,crp", "-M", "crp:concepts=2", "-M", "crp:layer=conv2",
                "--save-maps") == 0
    rows = _rows(out)
    gradcam = [row for row in rows if row["method"] == "gradcam"]
    crp = [row for row in rows if row["method"] == "crp"]
    assert len(gradcam) == 3 and len(crp) == 6
    assert all(list(row) == list(MANIFEST_FIELDS) for row in gradcam)  # other methods: no concept columns
    assert all(list(row) == [*MANIFEST_FIELDS, *CONCEPT_FIELDS] for row in crp)
    for image in ("img0", "img1", "img2"):
        mine = [row for row in crp if Path(row["input"]).stem == image]
        assert [row["concept_rank"] for row in mine] == [1, 2]
        assert all(row["status"] == "ok" and row["layer"] == "conv2" and row["target"] == "top1" for row in mine)
        channels = [int(row["concept"].split(":")[1]) for row in mine]
        assert all(row["concept"].startswith("conv2:") for row in mine) and len(set(channels)) == 2
        relevances = [row["concept_relevance"] for row in mine]
        assert relevances[0] >= relevances[1]
        # one overlay per concept, its channel in its name, different pictures
        overlays = [np.asarray(Image.open(out / row["output"])) for row in mine]
        assert all(f"__c{row['concept_rank']}-conv2_{c}" in row["output"] for row, c in zip(mine, channels))
        assert overlays[0].shape == overlays[1].shape and not np.array_equal(*overlays)
        # the .npz: the concepts' ids and relevances, and their raw conditional maps, whose sums
        # are the relevances (CRP's conservation: tests/test_concepts.py checks it by hand)
        with np.load(out / mine[0]["maps"]) as saved:
            assert saved["concept_ids"].tolist() == channels
            np.testing.assert_allclose(saved["concept_relevances"], relevances, rtol=1e-5)
            np.testing.assert_allclose(saved["raw_conv2"].sum(axis=(1, 2)), relevances, rtol=1e-3, atol=1e-6)
    _ray_driver_finds(out, rows)
    # a rerun finds every output; one overlay deleted is made again, the rest skipped
    assert _run(folder, out, "--method", "gradcam,crp", "-M", "crp:concepts=2", "-M", "crp:layer=conv2",
                "--save-maps") == 0
    assert {row["status"] for row in _rows(out)} == {"skipped"}
    (out / crp[1]["output"]).unlink()
    capsys.readouterr()
    assert _run(folder, out, "--method", "crp", "-M", "crp:concepts=2", "-M", "crp:layer=conv2",
                "--save-maps") == 0
    again = [row for row in _rows(out) if row["method"] == "crp"]
    assert [row["status"] for row in again] == ["ok", "ok", "skipped", "skipped", "skipped", "skipped"]
    assert [row["concept"] for row in again] == [row["concept"] for row in crp]
    assert (out / crp[1]["output"]).is_file()
    # another concept count is another setting: every crp output made again, 3 per image
    assert _run(folder, out, "--method", "crp", "-M", "crp:concepts=3", "-M", "crp:layer=conv2") == 0
    third = [row for row in _rows(out) if row["method"] == "crp"]
    assert len(third) == 9 and {row["status"] for row in third} == {"ok"}


def _ray_driver_finds(out: Path, rows: list[dict]) -> None:
    """The Ray driver's resume (planning.finished_pairs, by hashes) finds an image's crp
    outputs finished where each of its concepts' rows is, and not with more concepts asked
    for, or one overlay gone."""
    from explain.batch.options import CheckedRun
    from explain.batch.planning import finished_pairs

    crp = [row for row in rows if row["method"] == "crp"]
    inputs = sorted({row["input"] for row in crp})
    lines = (out / "manifest.jsonl").read_text(encoding="utf-8").splitlines()

    def finished(concepts: int, exists=lambda name: (out / name).is_file()) -> set[int]:
        checked = CheckedRun(["crp"], ["top1"], {"crp": "conv2"}, {"crp": crp[0]["settings"]}, "classify", [], [],
                             False, "cpu", concepts={"crp": concepts})
        return finished_pairs(lines, inputs, checked, exists, True)[1]

    assert finished(2) == {hash((input, "crp")) for input in inputs}
    assert finished(3) == set()
    gone = crp[0]["output"]
    assert finished(2, lambda name: name != gone and (out / name).is_file()) == {
        hash((input, "crp")) for input in inputs if input != crp[0]["input"]}


def test_crp_gives_each_target_its_concepts(folder, tmp_path):
    out = tmp_path / "out"
    assert _run(folder, out, "--method", "crp", "-M", "crp:concepts=2", "--layer", "conv2", "--target", "topk:2") == 0
    rows = [row for row in _rows(out) if row["input"].endswith("img0.png")]
    assert [(row["target"], row["concept_rank"]) for row in rows] == [("top1", 1), ("top1", 2), ("top2", 1), ("top2", 2)]
    assert rows[0]["target_id"] == rows[1]["target_id"] != rows[2]["target_id"] == rows[3]["target_id"]
    assert len({row["output"] for row in rows}) == 4


def _tiny_vit(path: Path) -> Path:
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(224, 56, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=16,
                                                 num_classes=3).eval()
    torch.save(model, path)
    return path


@pytest.mark.parametrize("extra, message", [
    (["--method", "crp", "-M", "crp:concepts=5", "-M", "crp:layer=conv2"],
     "layer conv2 has 4 channels, fewer than concepts=5; give concepts=4 or less"),
    (["--method", "crp", "--metrics", "sparseness"],
     "--method crp: its maps are per concept, and --metrics score the map of a target; run it without --metrics"),
    (["--method", "crp", "-M", "crp:layer=nothing"], "model has no layer named 'nothing'; top-level layers are: conv1"),
])
def test_crp_mistakes_are_usage_errors(folder, tmp_path, capsys, extra, message):
    assert _run(folder, tmp_path / "out", *extra) == 2
    assert message in capsys.readouterr().err


def test_explain_evaluate_refuses_crp(folder, tmp_path, capsys):
    assert main(["evaluate", str(folder / "in" / "img0.png"), "--model", str(folder / "tiny.pt"), "--trust-model-file",
                 "--metrics", "sparseness", "-q", "-j", "0", "--out", str(tmp_path / "one"), "--methods", "crp"]) == 2
    assert "--method crp: its maps are per concept, and explain evaluate scores the map" in capsys.readouterr().err


def test_crp_on_a_transformer_says_why_not(folder, tmp_path, capsys):
    model = _tiny_vit(tmp_path / "vit.pt")
    code = main(["run", str(folder / "in" / "img0.png"), "--out", str(tmp_path / "out"), "--model", str(model),
                 "--trust-model-file", "--method", "crp", "-q", "-j", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--method crp:" in err and "attention" in err


def test_an_unreadable_image_fails_each_of_crps_outputs_in_the_manifest(folder, tmp_path, capsys):
    inputs = tmp_path / "in"
    shutil.copytree(folder / "in", inputs)
    (inputs / "broken.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    command = ["run", str(inputs), "--out", str(out), "--model", str(folder / "tiny.pt"), "--trust-model-file"]
    assert main([*command, "-j", "0", "-q", "--method", "crp", "-M", "crp:concepts=2", "--layer", "conv2"]) == 1
    failed = [row for row in _rows(out) if row["status"] == "failed"]
    assert [(Path(row["input"]).name, row["concept_rank"]) for row in failed] == [("broken.png", 1), ("broken.png", 2)]
    assert sum(row["status"] == "ok" for row in _rows(out)) == 3 * 2
    capsys.readouterr()
    segmenter = ["--model", "lraspp_mobilenet_v3_large", "--method", "crp", "-q", "-j", "0"]
    assert main(["run", str(folder / "in" / "img0.png"), "--out", str(tmp_path / "seg"), *segmenter]) == 2
    assert "--method crp: with --task segment the command line runs CAMs" in capsys.readouterr().err
