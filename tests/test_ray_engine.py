"""``explain run --engine ray`` and :func:`explain.ray_data.explain_dataset` on a local Ray with
2 CPUs: the same files, manifest rows and maps as the local engine, resume after a killed
driver, and a driver that plans without torch."""

import csv
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import ray
import torch
from PIL import Image, ImageOps

import explain
import explain.batch.ray_stages
import explain.ray_data
from explain.cli import main
from explain.errors import UsageError
from explain.report import CONCEPT_FIELDS, MANIFEST_FIELDS
from explain.batch.concept_atlas import ATLAS_FILE, AtlasJob
from explain.batch.ray_cluster import import_ray
from explain.ray_data import explain_dataset
from explain.viewer import DATA_FOLDER, read_page

from test_cli import check_png, environment, noise_image, read_rows, summary_counts
from test_concept_atlas_cli import tiny_inputs

REPO = Path(__file__).resolve().parents[1]
PHOTOS = sorted((REPO / "data" / "images").iterdir())

# One Ray for the module, on one pytest-xdist worker (make test runs --dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()


def _photos(folder: Path) -> list[Path]:
    """The photos of data/images, and variations of them, in a small tree."""
    (folder / "nested").mkdir(parents=True)
    paths = []
    for photo in PHOTOS:
        with Image.open(photo) as image:
            image = image.convert("RGB")
            image.save(folder / photo.name)
            ImageOps.mirror(image).save(folder / "nested" / f"{photo.stem}_mirrored.jpg", quality=90)
            paths += [folder / photo.name, folder / "nested" / f"{photo.stem}_mirrored.jpg"]
    # A file name that is not UTF-8 (Latin-1 "é"), as archives and shared drives have them.
    noise_image(7, size=(300, 200)).save(folder / "nested" / os.fsdecode(b"nois\xe9.png"), format="PNG")
    # A name near the file system's limit: its outputs' names are shortened, as locally.
    noise_image(8).save(folder / "nested" / ("é" * 100 + "x" * 40 + ".png"))
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return paths


def _files(out: Path) -> set[str]:
    """The files of a run's folder, but index.html's data files (named afresh at each write)."""
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.parent.name != DATA_FOLDER}


def _by_key(rows: list[dict]) -> dict[tuple, dict]:
    keyed = {(r["input"], r["method"], r["target"], r.get("concept_rank")): r for r in rows}
    assert len(keyed) == len(rows), "a manifest row is written twice"
    return keyed


def _read_rows(path: Path) -> list[dict]:
    """The manifest's rows, parsed as strictly as :func:`test_cli.read_rows`; a last field of
    metric values (--metrics) allowed, and the concept columns of --method crp."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    rows = [json.loads(line) for line in text.splitlines()]
    for row in rows:
        assert list(row) in (list(MANIFEST_FIELDS), [*MANIFEST_FIELDS, "metrics"], [*MANIFEST_FIELDS, *CONCEPT_FIELDS])
    return rows


def _same_rows(found: Path, expected: Path) -> dict[tuple, dict]:
    """The manifest rows of ``found`` by key, checked equal to those of ``expected``, numbers to
    1e-5 (batches of other sizes round the last digits differently), times aside (present
    where the row is ok)."""
    found_rows, expected_rows = _by_key(_read_rows(found / "manifest.jsonl")), _by_key(_read_rows(expected / "manifest.jsonl"))
    assert found_rows.keys() == expected_rows.keys()
    for key, row in expected_rows.items():
        assert found_rows[key].keys() == row.keys()
        for field, value in row.items():
            if field == "seconds":
                assert (found_rows[key][field] is None) == (value is None) == (row["status"] != "ok"), key
            elif isinstance(value, (float, dict)):  # a dict: --metrics' values
                assert found_rows[key][field] == pytest.approx(value, abs=1e-5), (key, field)
            else:
                assert found_rows[key][field] == value, (key, field)
    return found_rows


def test_ray_engine_makes_what_the_local_engine_makes(tmp_path, capsys):
    # The same files, rows (--metrics' values among them) and summary, the metric table included.
    _photos(tmp_path / "in")
    (tmp_path / "list.txt").write_text("in\nmissing.png\n")
    os.chdir(tmp_path)
    options = ["@list.txt", "--method", "gradcam,layercam", "--target", "topk:2", "--save-maps",
               "--metrics", "sparseness", "-q"]
    assert main(["run", *options, "--out", "local", "--workers", "0"]) == 1
    local_out = capsys.readouterr().out
    assert main(["run", *options, "--out", "on_ray", "--engine", "ray", "--batch-size", "3"]) == 1
    ray_out = capsys.readouterr().out
    assert summary_counts(ray_out) == summary_counts(local_out) == (40, 0, 8)
    table = [line for line in ray_out.splitlines() if line.startswith(("gradcam", "layercam"))]
    assert len(table) == 2 and table == [line for line in local_out.splitlines()
                                         if line.startswith(("gradcam", "layercam"))]

    local, on_ray = tmp_path / "local", tmp_path / "on_ray"
    assert _files(on_ray) == _files(local)
    ray_rows = _same_rows(on_ray, local)
    failed = {k[0]: r["error"] for k, r in ray_rows.items() if r["status"] == "failed"}
    assert set(failed) == {"in/broken.png", "missing.png"} and failed["missing.png"] == "file not found"
    for name in _files(local):
        if name.endswith(".npz"):
            with np.load(local / name) as expected, np.load(on_ray / name) as found:
                assert sorted(found.files) == sorted(expected.files)
                for array in expected.files:
                    np.testing.assert_allclose(found[array], expected[array], atol=1e-5, err_msg=f"{name} {array}")
        elif name.endswith(".png"):
            check_png(on_ray / name)
            # Maps equal to 1e-5 can still fall on either side of a colormap step here and there.
            difference = np.abs(np.asarray(Image.open(on_ray / name), dtype=int)
                                - np.asarray(Image.open(local / name), dtype=int))
            assert difference.max() <= 8 and difference.mean() < 0.01, name
    page = read_page(on_ray / "index.html")
    shown = {m["output"] for m in page["maps"] if m["output"]}
    assert all(quote(row["output"]) in shown for row in ray_rows.values() if row["status"] == "ok")
    assert any(image["name"].endswith("nested/nois\\xe9.png") for image in page["images"])  # not UTF-8: escaped
    assert page["run"]["counts"] == {"ok": 40, "skipped": 0, "failed": 8}
    assert "sparseness" in page["tables"]["metric"]
    assert all(set(row["metrics"]) == {"sparseness"} for row in ray_rows.values() if row["status"] == "ok")
    assert all(row["metrics"]["sparseness"] > 0 for row in ray_rows.values() if row["status"] == "ok")
    assert sum("~" in name for name in _files(on_ray)) == 6  # two overlays and a .npz of each method


def test_crp_runs_on_ray_as_locally(tmp_path, capsys):
    # The actors' GroupExplainer runs --method crp as the local engine's: the same concept rows
    # (channel, rank, relevance) and overlays.
    from test_concept_atlas_cli import _tiny_cnn

    (tmp_path / "in").mkdir()
    for i in range(3):
        noise_image(i, size=(40, 32)).save(tmp_path / "in" / f"n{i}.png")
    torch.save(_tiny_cnn(), tmp_path / "tiny.pt")
    os.chdir(tmp_path)
    # the model by its absolute path, as the Ray engine records it in the settings
    options = ["in", "--model", str(tmp_path / "tiny.pt"), "--trust-model-file", "--method", "crp", "-M", "crp:concepts=2",
               "-M", "crp:layer=conv2", "-q"]
    assert main(["run", *options, "--out", "local", "-j", "0"]) == 0
    assert main(["run", *options, "--out", "on_ray", "--engine", "ray", "--batch-size", "2"]) == 0
    rows = _same_rows(tmp_path / "on_ray", tmp_path / "local")
    assert sorted(key[3] for key in rows) == [1, 1, 1, 2, 2, 2]
    assert all(row["status"] == "ok" and row["concept"].startswith("conv2:") for row in rows.values())
    assert _files(tmp_path / "on_ray") == _files(tmp_path / "local")
    # (the driver's resume of concept rows, planning.finished_pairs: tests/test_crp_cli.py)


def test_outputs_to_a_folder_given_by_uri(tmp_path, capsys):
    # Any filesystem pyarrow reaches (s3://, gs://, ...) goes through the same code as file://.
    os.chdir(tmp_path)
    options = ["run", str(REPO / "data" / "images"), "--method", "gradcam,layercam", "-q"]
    uri = (tmp_path / "remote").as_uri()
    assert main([*options, "--out", uri]) == 2
    assert "folders given by URI take --engine ray" in capsys.readouterr().err
    assert main([*options, "--out", "local"]) == 0
    assert main([*options, "--out", uri, "--engine", "ray"]) == 0
    assert f"see {uri}/index.html" in capsys.readouterr().out
    assert _files(tmp_path / "remote") == _files(tmp_path / "local")
    _same_rows(tmp_path / "remote", tmp_path / "local")
    assert main([*options, "--out", uri, "--engine", "ray"]) == 0  # resumes from the folder's manifest
    assert summary_counts(capsys.readouterr().out) == (0, 8, 0)


def test_segmentation_runs_on_ray_as_locally(tmp_path, capsys):
    # The actors run the local engine's segmentation pipeline; random weights are drawn from
    # one seed, so every process has the same model.
    os.chdir(tmp_path)
    options = ["run", str(REPO / "data" / "images"), "--model", "lraspp_mobilenet_v3_large", "--save-maps", "-q"]
    assert main([*options, "--out", "local"]) == 0
    assert main([*options, "--out", "on_ray", "--engine", "ray", "--batch-size", "2"]) == 0
    local_rows = _by_key([json.loads(line) for line in (tmp_path / "local" / "manifest.jsonl").open()])
    ray_rows = _by_key([json.loads(line) for line in (tmp_path / "on_ray" / "manifest.jsonl").open()])
    assert all(row.pop("seconds") > 0 for row in [*local_rows.values(), *ray_rows.values()])  # the times differ
    assert ray_rows == local_rows
    assert {row["task"] for row in local_rows.values()} == {"segment"}
    for row in local_rows.values():
        with np.load(tmp_path / "local" / row["maps"]) as expected, np.load(tmp_path / "on_ray" / row["maps"]) as found:
            np.testing.assert_allclose(found["maps"], expected["maps"], atol=1e-5)


def _preprocessed(paths: list[Path]) -> torch.Tensor:
    _, preprocess, _ = explain.models.load()
    return torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths])


def test_explain_dataset_gives_the_maps_of_the_explainers(tmp_path):
    paths = PHOTOS[:3]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    dataset = ray.data.from_items([{"path": str(p)} for p in [*paths, broken]])
    rows = explain_dataset(dataset, methods="gradcam,layercam", batch_size=2).take_all()
    assert len(rows) == 8
    model, _, names = explain.models.load()
    images = _preprocessed(paths)
    for method in ("gradcam", "layercam"):
        expected = explain.explainer(method, model)(images)
        for i, path in enumerate(paths):
            (row,) = [r for r in rows if r["input"] == str(path) and r["method"] == method]
            assert row["status"] == "ok" and row["error"] is None
            assert row["target_id"] == int(expected.targets[i]) and row["target_name"] == names[row["target_id"]]
            np.testing.assert_allclose(row["map"], expected.maps[i].numpy(), atol=1e-5)
    failed = [r for r in rows if r["input"] == str(broken)]
    assert len(failed) == 2 and all(r["status"] == "failed" and r["error"] == "not an image: the file holds text"
                                    for r in failed)
    assert all(r["map"].shape == (0, 0) for r in failed)


def test_explain_dataset_takes_images_as_arrays():
    arrays = [np.asarray(Image.open(p).convert("RGB")) for p in PHOTOS[:2]]
    dataset = ray.data.from_items([{"image": a, "id": f"photo{i}"} for i, a in enumerate(arrays)])
    rows = sorted(explain_dataset(dataset, methods="gradcam", target="topk:2").take_all(),
                  key=lambda r: (r["id"], r["target"]))
    assert [(r["id"], r["target"], r["status"], r["input"]) for r in rows] == [
        ("photo0", "top1", "ok", None), ("photo0", "top2", "ok", None),
        ("photo1", "top1", "ok", None), ("photo1", "top2", "ok", None)]
    model, _, _ = explain.models.load()
    expected = explain.GradCAM(model)(_preprocessed(PHOTOS[:2]), topk=2)
    found = np.stack([r["map"] for r in rows]).reshape(expected.maps.shape)
    np.testing.assert_allclose(found, expected.maps.numpy(), atol=1e-5)


def test_explain_dataset_reports_mistakes_before_any_image_runs():
    dataset = ray.data.from_items([{"picture": np.zeros((8, 8, 3), np.uint8)}])
    with pytest.raises(ValueError, match="neither an 'image' column"):
        explain_dataset(dataset)
    with pytest.raises(ValueError, match="^methods: unknown method"):
        explain_dataset(dataset, methods="gradcan")
    with pytest.raises(ValueError, match="^max_memory 2XB: "):  # its parameter, not the flag
        explain_dataset(dataset, max_memory="2XB")


def test_usage_errors_of_the_ray_engine(tmp_path, capsys, monkeypatch):
    noise_image(0).save(tmp_path / "a.png")
    os.chdir(tmp_path)
    assert main(["run", "a.png", "--out", "out", "--address", "auto"]) == 2
    assert "--address applies to --engine ray" in capsys.readouterr().err
    assert main(["run", "a.png", "--out", "out", "--engine", "ray", "--method", "gradcan"]) == 2
    assert "--method: unknown method 'gradcan'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UsageError, match=r"pip install 'explain-vision\[ray\]'"):
        import_ray()
    # the other commands with --engine ray: said before the model loads or --out is made
    for out, command in (("eval", ["evaluate", "a.png"]), ("atlas", ["concepts", "atlas", "a.png", "--layer", "x"])):
        assert main([*command, "--out", out, "--engine", "ray"]) == 2
        assert "--engine ray needs Ray Data: pip install 'explain-vision[ray]'" in capsys.readouterr().err
        assert not Path(out).exists()


def test_the_concept_atlas_runs_on_ray_as_locally_and_resumes_after_ctrl_c(tmp_path, capsys, monkeypatch):
    """A job with a worker (the atlas) on Ray: a first Ctrl-C keeps what reached the driver
    (exit 130), and the rerun ends with the local engine's atlas, concepts.json, patches and
    failures (values to float rounding: Ray's batches cut the images otherwise)."""
    inputs = tiny_inputs(tmp_path, 6) / "in"
    (inputs / "broken.png").write_bytes(b"not an image")
    monkeypatch.chdir(tmp_path)  # a model named relatively: the actors, elsewhere, find it too
    command = ["concepts", "atlas", str(inputs), "--layer", "conv2", "--model", "tiny.pt"]
    command += ["--trust-model-file", "-n", "2", "-b", "2", "-j", "0", "-q"]
    assert main([*command, "--out", str(tmp_path / "local")]) == 1  # the broken image fails

    take = AtlasJob.take

    def take_then_ctrl_c(job, indices, result):
        take(job, indices, result)
        if len(job.images) <= 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(AtlasJob, "take", take_then_ctrl_c)
    capsys.readouterr()
    assert main([*command, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 130
    captured = capsys.readouterr()
    assert "explain: stopping: the batches the actors hold are left to the next run" in captured.err
    assert captured.out.strip().splitlines()[-1].startswith("explain: interrupted, run the same command again")
    seen = torch.load(tmp_path / "ray" / ATLAS_FILE, weights_only=True)["images"]
    assert 0 < len(seen) < 6

    monkeypatch.setattr(AtlasJob, "take", take)
    assert main([*command, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 1
    assert f"{6 - len(seen)} images added to the atlas now, {len(seen)} skipped" in capsys.readouterr().out
    local, on_ray = (json.loads((tmp_path / out / "concepts.json").read_text()) for out in ("local", "ray"))
    assert local.keys() == on_ray.keys() and local["images"] == on_ray["images"] == 6
    for mine, theirs in zip(local["layers"]["conv2"]["concepts"], on_ray["layers"]["conv2"]["concepts"], strict=True):
        for kind in ("relmax", "actmax"):
            assert [(r["image"], r["box"]) for r in mine[kind]] == [(r["image"], r["box"]) for r in theirs[kind]]
            assert [r["value"] for r in mine[kind]] == pytest.approx([r["value"] for r in theirs[kind]], rel=1e-5)
            for ref, other in zip(mine[kind], theirs[kind], strict=True):
                local_patch = (tmp_path / "local" / ref["patch"]).read_bytes()
                assert local_patch == (tmp_path / "ray" / other["patch"]).read_bytes()
        assert mine["statistics"] == pytest.approx(theirs["statistics"], rel=1e-5)
    assert (tmp_path / "ray" / "failures.csv").read_text() == (tmp_path / "local" / "failures.csv").read_text()


def test_evaluate_scores_on_ray_what_it_scores_locally(tmp_path, capsys):
    """A second job on Ray through the job interface: explain evaluate's scores, failures (an
    unreadable file, an image without a region) and summary are the local engine's."""
    (tmp_path / "regions.csv").write_text("image,x0,y0,x1,y1\ncoffee.png,56,56,168,168\n")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    images = [str(PHOTOS[0].parent / "coffee.png"), str(PHOTOS[0].parent / "rocket.jpg"), str(tmp_path / "broken.png")]
    command = ["evaluate", *images, "--methods", "gradcam,saliency", "--metrics", "sparseness,pointing-game"]
    command += ["--regions", str(tmp_path / "regions.csv"), "-b", "2", "-q"]
    assert main([*command, "--out", str(tmp_path / "local")]) == 1
    assert main([*command, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("explain: 6 scored now, 0 skipped (already in scores.csv), 2 images failed")

    def scores(out: str) -> dict:
        with open(tmp_path / out / "scores.csv", newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
        return {(r["image"], r["method"], r["target"], r["metric"], r["settings"]): float(r["value"]) for r in rows}

    local, on_ray = scores("local"), scores("ray")
    assert len(local) == 6 and local.keys() == on_ray.keys()
    assert list(on_ray.values()) == pytest.approx([local[key] for key in on_ray], rel=1e-4, abs=1e-6)
    failures = {out: sorted((tmp_path / out / "failures.csv").read_text().splitlines()) for out in ("local", "ray")}
    assert failures["local"] == failures["ray"] and len(failures["ray"]) == 1 + 2 * 2 + 2
    assert (tmp_path / "ray" / "summary.md").is_file() and (tmp_path / "ray" / "index.html").is_file()


def test_the_driver_plans_without_torch():
    code = ("import sys, explain.batch.ray_driver, explain.ray_data, explain.cli.run, explain.cli.parser\n"
            "explain.cli.parser.build_parser().parse_args(['run', 'x', '--out', 'y', '--engine', 'ray'])\n"
            "assert 'torch' not in sys.modules, 'the driver imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, env=environment(), timeout=120)


def test_images_whose_batch_ray_loses_become_failed_rows_and_a_changed_method_option_is_redone(tmp_path, capsys,
                                                                                                monkeypatch):
    # The driver checks --method-option in its Ray task, the actors make their explainers with
    # it, and the settings it records decide the resume, as on the local engine: the rerun
    # redoes the images whose batch Ray lost, and the method whose option changed.
    (tmp_path / "in").mkdir()
    for i in range(4):
        noise_image(i).save(tmp_path / "in" / f"img{i}.png")
    # Another run's output folder among the inputs: skipped, not explained
    (tmp_path / "in" / "earlier").mkdir()
    noise_image(9).save(tmp_path / "in" / "earlier" / "img0__gradcam__1-x.png")
    (tmp_path / "in" / "earlier" / "manifest.jsonl").write_text("")
    (tmp_path / "in" / "earlier" / "index.html").write_text("")
    real = explain.batch.ray_stages.explain_plan

    def losing_img2(*args, **kwargs):  # as when an actor dies on img2's batch past Ray's retries
        for rows, kept in real(*args, **kwargs):
            yield [row for row in rows if row["input"] != "in/img2.png"], kept

    monkeypatch.setattr(explain.batch.ray_stages, "explain_plan", losing_img2)
    os.chdir(tmp_path)
    command = ["run", "in", "--out", "out", "--engine", "ray", "--method", "ig,gradcam", "-q"]
    assert main([*command, "-M", "ig:n_steps=2", "--batch-size", "1"]) == 1
    captured = capsys.readouterr()
    assert summary_counts(captured.out) == (6, 0, 2)
    assert "explain: skipped in/earlier: the output folder of another run" in captured.err
    rows = _by_key(read_rows(tmp_path / "out" / "manifest.jsonl"))
    for method in ("ig", "gradcam"):
        assert rows[("in/img2.png", method, "top1", None)]["error"].startswith("worker failed: Ray lost this image's batch")
    assert {row["method"]: row["settings"] for row in rows.values()} == {
        "ig": "model=efficientnet_lite0 weights=- cmap=jet alpha=0.5 n_steps=2",
        "gradcam": "model=efficientnet_lite0 weights=- cmap=jet alpha=0.5"}
    monkeypatch.undo()
    assert main([*command, "-M", "ig:n_steps=3"]) == 0  # the rerun makes img2, and ig again
    assert summary_counts(capsys.readouterr().out) == (5, 3, 0)
    rows = _by_key(read_rows(tmp_path / "out" / "manifest.jsonl"))
    assert {(row["input"], row["method"]): row["status"] for row in rows.values()} == {
        **{(f"in/img{i}.png", "ig"): "ok" for i in range(4)},
        **{(f"in/img{i}.png", "gradcam"): "skipped" for i in (0, 1, 3)}, ("in/img2.png", "gradcam"): "ok"}
    assert {row["settings"] for row in rows.values() if row["method"] == "ig"} == {
        "model=efficientnet_lite0 weights=- cmap=jet alpha=0.5 n_steps=3"}
    assert main([*command, "-M", "ig:n_steps=-1"]) == 2
    assert "--method-option ig:n_steps=-1: n_steps must be a positive int" in capsys.readouterr().err


def test_an_actor_explains_under_the_runs_memory_budget_and_times_each_method(tmp_path, heavy_method):
    # The actor of `explain run --engine ray`, in this process: what Ray runs in its workers.
    from explain.batch.options import RunOptions
    from explain.batch.ray_stages import WriteActor, decode_files

    noise_image(0).save(tmp_path / "a.png")
    options = RunOptions(inputs=[str(tmp_path)], out=str(tmp_path / "out"), methods="gradcam,heavypasses",
                         max_memory="300MiB")
    actor = WriteActor(options, threads=1)
    batch = {"input": np.array([b"a.png"], dtype=object), "path": np.array([os.fsencode(tmp_path / "a.png")], dtype=object),
             "folder": np.array([""]), "stem": np.array(["a"]), "methods": np.array(["gradcam,heavypasses"])}
    decoded = decode_files(batch, actor.explainer.prepared.checked().decoding, "path", None)
    heavy_method.budgets.clear()
    rows = [json.loads(line) for line in actor(decoded)["row"]]
    assert [(row["method"], row["status"]) for row in rows] == [("gradcam", "ok"), ("heavypasses", "ok")]
    assert all(row["seconds"] > 0 for row in rows)
    assert heavy_method.budgets and set(heavy_method.budgets) == {300 * 2**20}


@pytest.mark.slow
def test_ctrl_c_and_sigterm_keep_every_row_whose_files_were_written_and_a_rerun_redoes_none(tmp_path, capsys,
                                                                                          monkeypatch):
    # Ctrl-C of a Ray run dropped the rows the actors had kept: 64 overlays, 32 rows, and the
    # rerun wrote the 32 finished overlays again. Interrupted twice, a first run and a rerun
    # (by Ctrl-C once 2 overlays are on disk, then by SIGTERM once 4 more are, whether or not
    # their batch reached the driver), each rerun starting from the last: every overlay on disk
    # has its row, none is written twice, and the run's Ray execution ends with it (nothing is
    # written afterwards).
    from explain.batch import ray_driver
    from explain.batch.ray_driver import PLAN_PREFIX

    IMAGES = 16  # one a call: the actors cannot finish them all before the driver's look

    (tmp_path / "in").mkdir()
    for i in range(IMAGES):
        noise_image(i, size=(24, 20)).save(tmp_path / "in" / f"img{i:02d}.png")
    os.chdir(tmp_path)
    command = ["run", "in", "--out", "out", "--engine", "ray", "--method", "gradcam,saliency", "--batch-size", "1",
               "-q"]
    receive, received = ray_driver.RayRun._receive, []

    def overlays() -> dict[str, int]:
        return {p.relative_to(tmp_path / "out").as_posix(): p.stat().st_mtime_ns
                for p in (tmp_path / "out").rglob("*.png") if p.parent.name != DATA_FOLDER}

    written: dict[str, int] = {}
    for signum, after in ((signal.SIGINT, 2), (signal.SIGTERM, 4)):
        def interrupting(self, out, item, *args, signum=signum, after=after, before=len(written)):
            receive(self, out, item, *args)  # called every 0.1 s while the driver waits
            if not received and len(overlays()) >= before + after:
                received.append(signum)
                signal.raise_signal(signum)

        received.clear()
        monkeypatch.setattr(ray_driver.RayRun, "_receive", interrupting)
        assert main(command) == 128 + signum
        captured = capsys.readouterr()
        assert "interrupted, run the same command again to finish" in captured.out
        assert "SIGTERM received" not in captured.err  # Ray's native stack
        rows = _by_key(read_rows(tmp_path / "out" / "manifest.jsonl"))
        now = overlays()
        assert {row["output"] for row in rows.values()} == set(now)  # no row lost, none without its file
        assert all(now[name] == mtime for name, mtime in written.items())  # none written again
        assert received and len(written) < len(now) < 2 * IMAGES, "nothing made, or everything, before the stop"
        written = now
        assert not [p for p in (tmp_path / "out").glob(PLAN_PREFIX + "*")]
    monkeypatch.setattr(ray_driver.RayRun, "_receive", receive)
    assert main(command) == 0
    done, skipped, failed = summary_counts(capsys.readouterr().out)
    assert (skipped, done + skipped, failed) == (len(written), 2 * IMAGES, 0)
    assert all(overlays()[name] == mtime for name, mtime in written.items())
    assert len(_by_key(read_rows(tmp_path / "out" / "manifest.jsonl"))) == 2 * IMAGES
