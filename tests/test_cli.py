"""The `explain` command, end to end: real runs in subprocesses on temporary folders, and
quick in-process checks of usage errors and model files."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from explain import method_names as methods, models
from explain.catalogue import method_class
from explain.cli import main
from explain.errors import UsageError
from explain.report import MANIFEST_FIELDS, TEMP_SUFFIX
from explain.viewer import DATA_FOLDER, read_page

REPO = Path(__file__).resolve().parents[1]
CLASSES = models.imagenet_classes()
SETTINGS = "model=efficientnet_lite0 weights=- cmap=jet alpha=0.5"


def explain_command() -> list[str]:
    script = Path(sys.executable).with_name("explain")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "explain.cli"]


def environment() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run(*args, cwd, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(explain_command() + list(map(str, args)), cwd=cwd, env=environment(),
                          capture_output=True, text=True, timeout=timeout)


def run_here(monkeypatch, capsys, *args, cwd) -> subprocess.CompletedProcess:
    """``explain ARGS`` in this process, in ``cwd``: what ``run`` checks, without a new process
    that imports torch and the models again (seconds each). Signals need ``start``'s process."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(list(map(str, args)))
    streams = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, streams.out, streams.err)


def start(*args, cwd) -> subprocess.Popen:
    return subprocess.Popen(explain_command() + list(map(str, args)), cwd=cwd, env=environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_rows(path: Path) -> list[dict]:
    """Parse a manifest strictly: every line must be a complete JSON object."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    rows = [json.loads(line) for line in text.splitlines()]
    for row in rows:
        assert list(row) == list(MANIFEST_FIELDS)
    return rows


def wait_for_rows(manifest: Path, proc: subprocess.Popen, count: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be stopped"
        if manifest.is_file() and sum(r["status"] == "ok" for r in read_rows(manifest)) >= count:
            return
        time.sleep(0.01)
    raise AssertionError("no rows appeared in the manifest")


def safe(name: str) -> str:
    return re.sub(r"[^\w.+-]+", "_", name).strip("_")


def check_png(path: Path, size=(224, 224)) -> None:
    with Image.open(path) as image:
        image.load()  # raises on a truncated file
        assert image.format == "PNG" and image.size == size and image.mode == "RGB"


def check_ok_row(row: dict, out: Path, folder: str, stem: str, method: str = "gradcam", label: str = "top1") -> None:
    """An ok row: consistent ids, names and probabilities, and an overlay at the expected path."""
    assert row["status"] == "ok" and row["error"] is None and row["layer"] == "bn2"
    assert row["method"] == method and row["target"] == label and row["settings"] == SETTINGS
    assert row["target_name"] == CLASSES[row["target_id"]]
    assert row["predicted_name"] == CLASSES[row["predicted_id"]]
    assert 0 < row["target_probability"] <= row["predicted_probability"] <= 1
    if label == "top1":
        assert row["target_id"] == row["predicted_id"]
    prefix = f"{folder}/{stem}" if folder else stem
    assert row["output"] == f"{prefix}__{safe(method)}__{row['target_id']}-{safe(row['target_name'])}.png"
    check_png(out / row["output"])


def check_index(out: Path, rows: list[dict]) -> None:
    """index.html shows exactly the overlays of the ok and skipped rows, all existing, and the
    reasons of the failed ones."""
    page = read_page(out / "index.html")
    shown = {unquote(m["output"]) for m in page["maps"] if m["output"]}
    assert shown == {r["output"] for r in rows if r["status"] in ("ok", "skipped")}
    assert all((out / output).is_file() for output in shown)
    failed = [r for r in read_rows(out / "manifest.jsonl") if r["status"] == "failed"]
    assert {m["error"] for m in page["maps"] if m["status"] == 2} == {r["error"] for r in failed}


def noise_image(seed: int, size=(48, 40)) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def summary_counts(stdout: str) -> tuple[int, int, int]:
    match = re.search(r"(\d+) done now, (\d+) skipped \(done before\), (\d+) failed; (\d+ images in [\d.]+ s "
                      r"\([\d.]+ images/s\)|nothing left to do|no images explained)", stdout)
    assert match, stdout
    return tuple(map(int, match.groups()[:3]))


# --------------------------------------------------------------------------- end to end


def test_mixed_folder_of_good_and_bad_files(tmp_path, monkeypatch, capsys):
    photos = tmp_path / "photos"
    (photos / "sub" / "deeper").mkdir(parents=True)
    noise_image(0).save(photos / "good.png")
    noise_image(1).save(photos / "good.jpg")  # same stem as good.png: outputs keep the extension
    noise_image(2).convert("RGBA").save(photos / "rgba.png")
    noise_image(3).convert("P").save(photos / "palette.gif", transparency=0)
    noise_image(4).convert("L").save(photos / "sub" / "grey.png")
    Image.fromarray(np.random.default_rng(5).integers(0, 65536, (40, 48)).astype(np.uint16)).save(photos / "sub" / "g16.png")
    Image.new("CMYK", (48, 40), (0, 255, 255, 0)).save(photos / "sub" / "cmyk.jpg")
    rotated = noise_image(6)
    exif = rotated.getexif()
    exif[0x0112] = 6
    rotated.save(photos / "sub" / "deeper" / "rotated.jpg", exif=exif)
    (photos / "empty.jpg").write_bytes(b"")
    whole = (photos / "good.jpg").read_bytes()
    (photos / "truncated.jpg").write_bytes(whole[: len(whole) // 2])
    (photos / "text.jpg").write_text("hello, I am not an image\n")
    (photos / "vector.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    Image.new("RGB", (300, 300)).save(photos / "bomb.png")  # above --max-pixels: Pillow warns
    Image.new("RGB", (400, 400)).save(photos / "bigger-bomb.png")  # above twice the limit: Pillow raises
    (photos / "notes.txt").write_text("not an image extension: ignored when scanning folders")
    noise_image(7).save(photos / ".hidden.png")

    result = run_here(monkeypatch, capsys, "run", "photos", "--out", "out", "--max-pixels", 60_000, "--workers", 1,
                      "--batch-size", 3, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert summary_counts(result.stdout) == (8, 0, 6)
    out = tmp_path / "out"
    rows = read_rows(out / "manifest.jsonl")
    failures = {
        "photos/bigger-bomb.png": "decompression bomb: 160,000 pixels, more than the limit of 60,000 (--max-pixels raises it for files you trust)",
        "photos/bomb.png": "decompression bomb: 90,000 pixels, more than the limit of 60,000 (--max-pixels raises it for files you trust)",
        "photos/empty.jpg": "empty file (0 bytes)",
        "photos/text.jpg": "not an image: the file holds text",
        "photos/truncated.jpg": "truncated image: image file is truncated",
        "photos/vector.svg": "unsupported image format .svg: Pillow cannot decode it; convert it to PNG or JPEG",
    }
    successes = {
        "photos/good.jpg": ("", "good.jpg"),
        "photos/good.png": ("", "good.png"),
        "photos/palette.gif": ("", "palette"),
        "photos/rgba.png": ("", "rgba"),
        "photos/sub/cmyk.jpg": ("sub", "cmyk"),
        "photos/sub/g16.png": ("sub", "g16"),
        "photos/sub/grey.png": ("sub", "grey"),
        "photos/sub/deeper/rotated.jpg": ("sub/deeper", "rotated"),
    }
    assert [r["input"] for r in rows] == [
        "photos/bigger-bomb.png", "photos/bomb.png", "photos/empty.jpg", "photos/good.jpg", "photos/good.png",
        "photos/palette.gif", "photos/rgba.png", "photos/text.jpg", "photos/truncated.jpg", "photos/vector.svg",
        "photos/sub/cmyk.jpg", "photos/sub/g16.png", "photos/sub/grey.png", "photos/sub/deeper/rotated.jpg",
    ]
    for row in rows:
        if row["input"] in failures:
            error = row.pop("error")
            assert error.startswith(failures[row["input"]])
            assert row == {
                "input": row["input"], "method": "gradcam", "layer": "bn2", "target": "top1",
                "target_id": None, "target_name": None, "target_probability": None, "predicted_id": None,
                "predicted_name": None, "predicted_probability": None, "output": None, "maps": None,
                "status": "failed", "settings": SETTINGS, "seconds": None, "label_id": None, "label_name": None,
                "correct": None,
            }
            assert f"explain: failed: {row['input']}: {error}" in result.stderr
        else:
            check_ok_row(row, out, *successes[row["input"]])
    produced = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()
                      and p.parent.name != DATA_FOLDER)
    assert produced == sorted(["index.html", "manifest.jsonl"] + [r["output"] for r in rows if r["output"]])
    check_index(out, rows)
    page = read_page(out / "index.html")
    assert "empty file (0 bytes)" in {m["error"] for m in page["maps"]}
    assert "photos/sub/deeper/rotated.jpg" in {image["name"] for image in page["images"]}


# Enough that a run signalled after its first rows cannot have finished by then.
IMAGES = 48


def _numbered_images(root: Path, count: int) -> None:
    for i in range(count):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        noise_image(i, size=(32, 32)).save(folder / f"img{i:02d}.png")


def test_resume_after_sigkill_then_overwrite(tmp_path, monkeypatch, capsys):
    _numbered_images(tmp_path / "in", IMAGES)
    command = ("run", "in", "--out", "out", "--batch-size", 2, "--workers", 0)
    manifest = tmp_path / "out" / "manifest.jsonl"
    proc = start(*command, cwd=tmp_path)
    try:
        wait_for_rows(manifest, proc, 2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    killed = read_rows(manifest)  # complete JSON lines only: the manifest is never torn
    done = {r["output"] for r in killed if r["status"] == "ok"}
    assert 2 <= len(done) < IMAGES
    pngs = list((tmp_path / "out").rglob("*.png"))
    for png in pngs:
        check_png(png)  # a file with the final name is always whole
    assert {p.relative_to(tmp_path / "out").as_posix() for p in pngs} >= done

    resumed = run_here(monkeypatch, capsys, *command, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert summary_counts(resumed.stdout) == (IMAGES - len(done), len(done), 0)
    rows = read_rows(manifest)
    assert [r["input"] for r in rows] == [f"in/a/img{i:02d}.png" for i in range(1, IMAGES, 2)] + [
        f"in/b/img{i:02d}.png" for i in range(0, IMAGES, 2)]
    assert {r["output"] for r in rows if r["status"] == "skipped"} == done
    for row in rows:
        folder, name = row["input"].split("/")[1:]
        check_ok_row(dict(row, status="ok"), tmp_path / "out", folder, name[:-4])
    assert not list((tmp_path / "out").rglob(f"*{TEMP_SUFFIX}"))
    assert len(list((tmp_path / "out").rglob("*.png"))) == IMAGES
    check_index(tmp_path / "out", rows)

    before = {r["output"]: (tmp_path / "out" / r["output"]).stat().st_mtime_ns for r in rows}
    redone = run_here(monkeypatch, capsys, *command, "--overwrite", "--quiet", cwd=tmp_path)
    assert redone.returncode == 0, redone.stderr
    assert summary_counts(redone.stdout) == (IMAGES, 0, 0)
    assert redone.stderr == ""  # --quiet: no progress bar
    rows = read_rows(manifest)
    assert {r["status"] for r in rows} == {"ok"}
    assert all((tmp_path / "out" / out).stat().st_mtime_ns != t for out, t in before.items())


def test_ctrl_c_stops_after_the_current_batch(tmp_path):
    _numbered_images(tmp_path / "in", IMAGES)
    manifest = tmp_path / "out" / "manifest.jsonl"
    proc = start("run", "in", "--out", "out", "--batch-size", 2, "--workers", 1, cwd=tmp_path)
    try:
        wait_for_rows(manifest, proc, 2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "stopping: the running method stops at its next layer" in stderr and "Traceback" not in stderr
    assert "interrupted, run the same command again to finish" in stdout
    rows = read_rows(manifest)
    assert 2 <= len(rows) < IMAGES and {r["status"] for r in rows} == {"ok"}
    for row in rows:
        check_png(tmp_path / "out" / row["output"])
    check_index(tmp_path / "out", rows)


def test_list_file_glob_several_methods_topk_and_saved_maps(tmp_path, monkeypatch, capsys):
    (tmp_path / "imgs" / "nested").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    noise_image(0).save(tmp_path / "imgs" / "a.png")
    noise_image(1).save(tmp_path / "imgs" / "b.jpg")
    noise_image(2).save(tmp_path / "imgs" / "nested" / "c.png")
    noise_image(3).save(tmp_path / "other" / "d.png")
    noise_image(4).save(tmp_path / "other" / "e.png")
    (tmp_path / "list.txt").write_text("# inputs\nimgs/a.png\n\nimgs/nested\nmissing.png\nother/*.png\nimgs/a.png\n")

    result = run_here(monkeypatch, capsys, "run", "@list.txt", "imgs/b.*", "--out", "out", "--method",
                      "GradCAM,layercam", "--target", "topk:2", "--save-maps", "--workers", 0, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert summary_counts(result.stdout) == (20, 0, 4)
    out = tmp_path / "out"
    rows = read_rows(out / "manifest.jsonl")
    inputs = ["imgs/a.png", "imgs/nested/c.png", "missing.png", "other/d.png", "other/e.png", "imgs/b.jpg"]
    expected = [(i, m, t) for i in inputs for m in ("gradcam", "layercam") for t in ("top1", "top2")]
    assert [(r["input"], r["method"], r["target"]) for r in rows] == expected
    for row in rows:
        if row["input"] == "missing.png":
            assert (row["status"], row["error"], row["output"]) == ("failed", "file not found", None)
            continue
        folder, stem = row["input"].rsplit("/", 1)
        check_ok_row(row, out, folder, stem.split(".")[0], row["method"], row["target"])
        assert row["maps"] == f"{folder}/{stem.split('.')[0]}__{row['method']}.npz"
    top1, top2 = rows[0], rows[1]
    assert top1["target_id"] != top2["target_id"] and top2["target_probability"] <= top1["target_probability"]
    with np.load(out / top1["maps"]) as saved:
        assert saved["maps"].shape == (2, 224, 224) and saved["raw_bn2"].shape == (2, 7, 7)
        assert saved["targets"].tolist() == [top1["target_id"], top2["target_id"]]
        assert 0 <= saved["maps"].min() and saved["maps"].max() <= 1
    check_index(out, rows)


# --------------------------------------------------------------------------- in process


def test_demo_command_on_the_sample_photos(tmp_path, capsys):
    code = main(["run", str(REPO / "data" / "images"), "--out", str(tmp_path), "--method", "gradcam,gradcam++,layercam"])
    assert code == 0
    assert summary_counts(capsys.readouterr().out) == (12, 0, 0)
    rows = read_rows(tmp_path / "manifest.jsonl")
    assert [(Path(r["input"]).name, r["method"]) for r in rows] == [
        (name, method) for name in ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg")
        for method in ("gradcam", "gradcam++", "layercam")
    ]
    predicted = {Path(r["input"]).stem: r["predicted_name"] for r in rows}
    assert predicted["chelsea"] in ("tabby", "tiger cat", "Egyptian cat")
    assert predicted["coffee"] in ("espresso", "cup", "coffee mug")
    check_index(tmp_path, rows)

    assert main(["run", str(REPO / "data" / "images"), "--out", str(tmp_path), "--method", "gradcam++,layercam,gradcam", "-q"]) == 0
    rerun = capsys.readouterr().out
    assert summary_counts(rerun) == (0, 12, 0)
    # Nothing ran, and the summary (also index.html's) says so: no count of 0 images at 0.00 images/s.
    assert "; nothing left to do; see " in rerun and "images/s" not in rerun
    run = read_page(tmp_path / "index.html")["run"]
    assert "0 done now, 12 skipped (done before), 0 failed; nothing left to do" in run["summary"]
    assert run["counts"] == {"ok": 0, "skipped": 12, "failed": 0} and run["images"] == 0 and run["seconds"] < 60


def test_a_log_file_gets_whole_lines_and_no_carriage_returns(photos, capsys, monkeypatch):
    from explain.batch import progress

    (photos / "broken.png").write_bytes(b"not a png")
    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)  # a line after every batch
    assert main(["run", str(photos), "--out", str(photos.parent / "out"), "--workers", "0", "-b", "1"]) == 1
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert [line for line in lines if line.startswith("explain: failed:")] == [
        f"explain: failed: {photos / 'broken.png'}: not an image: the file holds text"]
    assert [line.split(" (")[0] for line in lines if re.match(r"explain: \d", line) and " passes" not in line] == [
        "explain: 1/4 images", "explain: 2/4 images", "explain: 3/4 images"]
    assert all(line.startswith("explain: ") for line in lines), lines
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal gets tqdm's bar
    assert type(progress.progress_bar(4, quiet=False).bar).__name__ == "tqdm"


def test_progress_moves_within_a_batch_and_names_the_running_method(photos, capsys, monkeypatch, heavy_method):
    monkeypatch.setenv("EXPLAIN_PROGRESS_EVERY", "0")  # a line after every inner batch
    command = ["run", str(photos), "--out", str(photos.parent / "out"), "--method", "gradcam,heavypasses",
               "--workers", "0", "-b", "2"]
    assert main(command) == 0
    err = capsys.readouterr().err
    assert "\r" not in err  # no bar: the method's own (it runs 600 passes) stays off too
    lines = [line for line in err.splitlines() if re.match(r"explain: \d.*heavypasses", line)]
    # The first batch (2 images) runs 600 passes in inner batches of 50, the second 300.
    assert [line.split("; ")[-1] for line in lines] == [f"heavypasses {done}/600 passes" for done in range(50, 601, 50)] \
        + [f"heavypasses {done}/300 passes" for done in range(50, 301, 50)]
    images = [float(re.match(r"explain: ([\d.]+)/3 images \(", line)[1]) for line in lines]
    assert images == sorted(images) and 0 < images[0] < images[11] < 2 <= images[12] < images[-1] < 3, images
    assert len(set(images)) > 6  # it moves within the batches
    assert "explain: 2/3 images (" in err  # and between them
    assert main(command + ["--overwrite", "-q"]) == 0
    assert capsys.readouterr().err == ""  # -q: nothing


def test_a_terminal_bar_moves_within_a_batch_and_names_the_method(monkeypatch):
    from explain.batch import progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = progress.progress_bar(4, quiet=False)
    bar.update(1)
    bar.within(0.57, "scorecam 340/1280 passes")
    assert bar.bar.n == 1.5 and "1.5/4" in str(bar.bar) and "scorecam 340/1280 passes" in str(bar.bar)
    bar.update(2)
    assert bar.bar.n == 3 and "3/4" in str(bar.bar) and "passes" not in str(bar.bar)
    bar.close()
    quiet = progress.progress_bar(4, quiet=True)
    quiet.within(0.5, "scorecam 1/2 passes")
    assert quiet.bar.disable


def test_the_batch_share_counts_finished_methods_by_their_cost():
    from explain.batch.progress import WithinBatch

    shown = []

    class Progress:
        def within(self, images, note):
            shown.append((images, note))

    within = WithinBatch(Progress(), {"gradcam": 1.0, "scorecam": 6.0, "ig": 3.0})
    within.start(2)
    within("scorecam", 3, 6)
    within("ig", 5, 10)
    within("deletion", 1, 4)  # a metric: named, and moves nothing
    assert shown == [(2 * 3 / 10, "scorecam 3/6 passes"), (2 * 7.5 / 10, "ig 5/10 passes"),
                     (2 * 9 / 10, "deletion 1/4 passes")]
    within("ig", 10, 10)
    assert shown[-1] == (2 * 9 / 10, "ig 10/10 passes")
    within("gradcam", 1, 1)
    assert shown[-1][0] == 2 * 0.99  # never the whole batch before it ends
    within.start(1)
    within("scorecam", 6, 6)
    assert shown[-1][0] == 6 / 10


def test_the_manifest_and_the_summary_give_each_methods_time(photos, capsys, heavy_method):
    heavy_method.pause = 0.02  # 6 inner batches an image: over 0.12 s an image
    command = ["run", str(photos), "--out", str(photos.parent / "out"), "--method", "gradcam,layercam,heavypasses",
               "--target", "topk:2", "-q"]
    assert main(command) == 0
    summary = capsys.readouterr().out
    rows = read_rows(photos.parent / "out" / "manifest.jsonl")
    assert len(rows) == 18 and all(row["seconds"] > 0 for row in rows)
    total = {method: sum(row["seconds"] for row in rows if row["method"] == method)
             for method in ("gradcam", "layercam", "heavypasses")}
    assert total["heavypasses"] > 3 * 6 * 0.02
    # The CAMs explained together share their pass's time, by their estimated costs (equal here).
    assert [r["seconds"] for r in rows if r["method"] == "gradcam"] == pytest.approx(
        [r["seconds"] for r in rows if r["method"] == "layercam"], rel=0.01)
    times = [time.split() for time in re.search(r"; method times: (.+?); see ", summary)[1].split(", ")]
    assert sorted(name for name, _, _ in times) == sorted(total)
    assert [float(seconds) for _, seconds, _ in times] == sorted((float(s) for _, s, _ in times), reverse=True)
    for name, seconds, unit in times:
        assert unit == "s" and float(seconds) == pytest.approx(total[name], abs=0.051)
    # A rerun skips them all: their rows keep the time they took, and it names no times of its own.
    assert main(command) == 0
    assert "method times" not in capsys.readouterr().out
    assert [r["seconds"] for r in read_rows(photos.parent / "out" / "manifest.jsonl")] == [r["seconds"] for r in rows]


def test_a_run_whose_methods_cost_far_more_than_the_rest_warns(photos, capsys, monkeypatch, heavy_method):
    image, out = str(photos / "p0.png"), str(photos.parent / "out")

    def warnings(*options) -> list[str]:
        assert main(["run", image, "--out", out, "--overwrite", *options]) == 0
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("explain: warning:")]

    found = warnings("--method", "gradcam,layercam,heavypasses")
    assert len(found) == 1 and re.fullmatch(
        r"explain: warning: heavypasses \((9\d) %\) takes ~\1 % of this run's estimated time; leave it out of "
        r"--method to go faster", found[0]), found
    assert warnings("--method", "gradcam,layercam,heavypasses", "-q") == []
    assert warnings("--method", "gradcam,layercam") == []
    assert warnings("--method", "heavypasses") == []  # alone, at 300 passes an image
    monkeypatch.setattr(heavy_method, "pass_cost", lambda self, images: 4500.0 * len(images))
    assert warnings("--method", "heavypasses") == [
        "explain: warning: heavypasses costs ~4,500 forward passes of the model per image: expect a long run"]


def test_max_memory_bounds_the_methods_inner_batches(photos, capsys, heavy_method):
    command = ["run", str(photos / "p0.png"), "--out", str(photos.parent / "out"), "--method", "heavypasses", "-q"]
    assert main(command + ["--max-memory", "300MiB"]) == 0
    assert heavy_method.budgets and set(heavy_method.budgets) == {300 * 2**20}
    for size in ("2XB", "-1GB", "0", "lots"):
        assert main(command + [f"--max-memory={size}"]) == 2
        assert f"--max-memory {size}: give a size such as 2GB, 512MiB" in capsys.readouterr().err


def test_score_cam_ablation_cam_fullgrad_and_smoothing_options_end_to_end(tmp_path, capsys):
    # One photo. Score-CAM runs a masked pass per channel of its layer: at blocks.3 (80
    # channels) rather than the automatic bn2 (1,280, a quarter of them constant), 16 times
    # fewer; the automatic layer is the demo's (test_demo_command_on_the_sample_photos).
    images = str(REPO / "data" / "images" / "coffee.png")
    code = main(["run", images, "--out", str(tmp_path), "--method", "scorecam,ablationcam", "--layer", "blocks.3",
                 "-q"])
    assert code == 0 and summary_counts(capsys.readouterr().out) == (2, 0, 0)
    fullgrad = tmp_path / "fullgrad"  # it takes no layer
    assert main(["run", images, "--out", str(fullgrad), "--method", "fullgrad", "-q"]) == 0
    assert summary_counts(capsys.readouterr().out) == (1, 0, 0)
    for out, expected in ((tmp_path, {("scorecam", "blocks.3"), ("ablationcam", "blocks.3")}),
                          (fullgrad, {("fullgrad", "input+biases")})):
        rows = read_rows(out / "manifest.jsonl")
        assert {(r["method"], r["layer"]) for r in rows} == expected
        for row in rows:
            check_png(out / row["output"])
            assert row["predicted_name"] == "espresso"
        check_index(out, rows)

    # The smoothing options are part of the settings: outputs made without them are redone.
    smoothed = main(["run", images, "--out", str(tmp_path), "--method", "ablationcam", "--layer", "blocks.3",
                     "--eigen-smooth", "--aug-smooth", "-q"])
    assert smoothed == 0 and summary_counts(capsys.readouterr().out) == (1, 0, 0)
    rows = [r for r in read_rows(tmp_path / "manifest.jsonl") if r["method"] == "ablationcam"]
    assert {r["settings"] for r in rows} == {SETTINGS + " eigen_smooth=1 aug_smooth=1"}
    # --eigen-smooth where it cannot apply is a usage error that names the method.
    assert main(["run", images, "--out", str(tmp_path), "--method", "eigencam", "--eigen-smooth", "-q"]) == 2
    error = capsys.readouterr().err
    assert "--method eigencam" in error and "eigen_smooth does not apply" in error


def test_attribution_methods_end_to_end(tmp_path, capsys):
    # Two photos; saliency and IG (8 steps, not 50: the maps' sign is what matters here) next to
    # Grad-CAM in one run, signed (--reduction sum).
    images = [str(REPO / "data" / "images" / name) for name in ("coffee.png", "rocket.jpg")]
    code = main(["run", *images, "--out", str(tmp_path), "--method", "saliency,ig,gradcam", "--reduction", "sum",
                 "-M", "ig:n_steps=8", "--save-maps", "-q"])
    assert code == 0 and summary_counts(capsys.readouterr().out) == (6, 0, 0)
    rows = read_rows(tmp_path / "manifest.jsonl")
    assert {(r["method"], r["layer"]) for r in rows} == {("saliency", "input"), ("ig", "input"), ("gradcam", "bn2")}
    assert {(r["method"], r["settings"]) for r in rows} == {
        ("saliency", SETTINGS + " reduction=sum signed_cmap=RdBu_r"),
        ("ig", SETTINGS + " reduction=sum n_steps=8 signed_cmap=RdBu_r"),
        ("gradcam", SETTINGS)}  # the option shapes the attributions only
    for row in rows:
        assert row["status"] == "ok" and row["target_id"] == row["predicted_id"]
        check_png(tmp_path / row["output"])
        saved = np.load(tmp_path / row["maps"])
        if row["method"] == "gradcam":
            assert saved["maps"].shape == (1, 224, 224) and saved["maps"].min() >= 0
            assert saved["raw_bn2"].shape == (1, 7, 7)
        else:  # signed maps and the attributions per colour channel
            assert saved["maps"].shape == (1, 224, 224) and saved["maps"].min() < 0 < saved["maps"].max()
            assert saved["raw_input"].shape == (1, 3, 224, 224)
    # Signed overlays fade to the photo where the evidence is zero: they differ from the
    # photo less than Grad-CAM's, whose colour covers every pixel.
    photo = np.asarray(Image.open(images[0]).convert("RGB").resize((256, 256)).crop((16, 16, 240, 240)), float)
    by_method = {r["method"]: r for r in rows if r["input"] == images[0]}
    change = {m: np.abs(np.asarray(Image.open(tmp_path / r["output"]), float) - photo).mean() for m, r in by_method.items()}
    assert change["saliency"] < change["gradcam"] and change["ig"] < change["gradcam"], change

    # A layer for methods that take none, or an option no named method takes, is a usage error.
    assert main(["run", *images, "--out", str(tmp_path), "--method", "saliency,ig", "--layer", "bn2", "-q"]) == 2
    assert "--layer applies to none of the methods saliency, ig" in capsys.readouterr().err
    assert main(["run", *images, "--out", str(tmp_path), "--method", "saliency", "--eigen-smooth", "-q"]) == 2
    assert "--eigen-smooth applies to none of the methods saliency" in capsys.readouterr().err
    # With a CAM among them, the layer goes to the CAM and Guided Grad-CAM; the rest need none.
    assert main(["run", images[0], "--out", str(tmp_path / "layer"), "--method", "saliency,guidedgradcam,gradcam",
                 "--layer", "blocks.6", "-q"]) == 0
    rows = read_rows(tmp_path / "layer" / "manifest.jsonl")
    assert {(r["method"], r["layer"]) for r in rows} == {
        ("saliency", "input"), ("guidedgradcam", "blocks.6"), ("gradcam", "blocks.6")}


def test_a_method_that_fails_on_every_batch_fails_alone(tmp_path, capsys, monkeypatch):
    # DeepLift passes its start-up check here but raises on every batch: its rows fail with
    # the reason, Grad-CAM's and saliency's are written, and nothing runs twice.
    import explain

    def broken(self, scored, images, k):
        raise RuntimeError("DeepLift broke")

    calls = {"saliency": 0}
    plain_call = explain.Saliency.__call__

    def counted(self, *args, **kwargs):
        calls["saliency"] += 1
        return plain_call(self, *args, **kwargs)

    monkeypatch.setattr(explain.DeepLift, "check", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(explain.DeepLift, "attribute", broken)
    monkeypatch.setattr(explain.Saliency, "__call__", counted)
    images = [str(REPO / "data" / "images" / name) for name in ("coffee.png", "rocket.jpg", "chelsea.png")]
    code = main(["run", *images, "--out", str(tmp_path), "--method", "gradcam,deeplift,saliency", "-b", "2", "-q"])
    assert code == 1 and summary_counts(capsys.readouterr().out) == (6, 0, 3)
    rows = read_rows(tmp_path / "manifest.jsonl")
    assert {r["status"] for r in rows if r["method"] != "deeplift"} == {"ok"}
    assert {(r["status"], r["error"]) for r in rows if r["method"] == "deeplift"} == {("failed", "RuntimeError: DeepLift broke")}
    assert calls["saliency"] == 2  # two batches, once each


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)).eval()


def test_method_all_leaves_out_what_does_not_apply_in_one_plain_line_each(capsys):
    from explain.batch.explainers import build_explainers, parse_target
    from explain.models import LoadedModel

    loaded = LoadedModel(_tiny_model(), None, list("abcde"), torch.device("cpu"), torch.rand(1, 3, 32, 32))
    explainers = build_explainers("all", loaded, "auto", parse_target("top1", loaded.class_names))
    notes = capsys.readouterr().err.splitlines()
    left_out = [re.match(r"explain: --method all: leaving out ([\w-]+): ", note)[1] for note in notes]
    # the detector's method, the transformers' (AttnLRP's too: a model without attention) and
    # those whose maps are per concept, in listing order
    left = [m for m in methods() if method_class(m).family == "transformer attention" or m == "attnlrp"
            or getattr(method_class(m), "task", "classify") == "detect" or method_class(m).per_concept]
    assert left_out == left
    assert len(explainers) == len(methods()) - len(left)
    for note in notes:  # why, in the command line's words: no Python arguments, no other models' quirks
        assert len(note) < 200 and not re.search(r"\w=|Swin|\bpass\b|\buse\b", note), note


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        noise_image(i).save(folder / f"p{i}.png")
    return folder


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--method", "gradcamm"], "unknown method 'gradcamm'; did you mean gradcam"),
        (["--model", "nowhere/model.pt"], "model file nowhere/model.pt does not exist"),
        (["--model", "resnet5O"], "unknown model 'resnet5O'; did you mean resnet50"),
        (["--model", "resnet5O"], "timm:NAME for a timm model, yolo:FILE.pt or yolo:FILE.yaml for an Ultralytics YOLO detector, a folder"),
        (["--model", "vit_tiny_patch16_224"], "did you mean timm:vit_tiny_patch16_224"),
        (["--weights", "missing.pth", "--model", "resnet18"], "missing.pth does not exist"),
        (["--layer", "bn3"], "model has no layer named 'bn3'; did you mean: bn2"),
        (["--layer", "classifier"], "--method gradcam --layer classifier: "),
        (["--target", "tabbby"], "unknown class name 'tabbby'; did you mean: 'tabby'"),
        (["--target", "1000"], "the model has 1000 classes"),
        (["--target", "topk:0"], "--target topk:0: K must be at least 1"),
        (["--target", "topk:1001"], "K must lie in 1..1000"),
        (["--alpha", "2"], "--alpha must lie in 0..1"),
        (["--cmap", "jett"], "unknown --cmap 'jett'"),
        (["--device", "gpu"], "unknown device 'gpu'"),
        (["--max-pixels", "1000"], "--max-pixels must be at least the model's input size, 50176"),
    ],
)
def test_usage_errors_exit_2_with_the_fix(photos, capsys, options, message):
    assert main(["run", str(photos), "--out", str(photos.parent / "out"), "--workers", "0", *options]) == 2
    error = capsys.readouterr().err
    assert error.startswith("explain: error: ") and message in error
    assert not re.search(r"\w+(Error|Exception):", error), error  # a sentence, not a Python class name
    assert not (photos.parent / "out" / "manifest.jsonl").exists()


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (["nothing-here"], "nothing-here: no such file or folder"),
        (["*.jpeg"], "no files match '*.jpeg'"),
        (["@absent.txt"], "cannot read list file @absent.txt"),
        (["empty-folder"], "no images found in empty-folder; folders are searched (recursively, hidden files left "
                           "out) for files ending .jpg, .jpeg, .png, .webp, .bmp, .tif, .tiff, .gif, .apng,"),
    ],
)
def test_input_usage_errors(tmp_path, monkeypatch, capsys, inputs, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty-folder").mkdir()
    assert main(["run", *inputs, "--out", "out"]) == 2
    assert message in capsys.readouterr().err


def test_model_files(photos, capsys):
    model = _tiny_model()
    folder = photos.parent
    x = torch.rand(2, 3, 64, 64)
    dynamic = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    torch.export.save(dynamic, folder / "dynamic.pt2")
    torch.export.save(torch.export.export(model, (x[:1],)), folder / "fixed.pt2")
    torch.save(model, folder / "pickled.pt")
    torch.save(model.state_dict(), folder / "state.pt")
    torch.jit.save(torch.jit.script(model), folder / "scripted.pt")

    def explain_with(model_file, *options):
        out = folder / f"out-{model_file}"
        code = main(["run", str(photos), "--out", str(out), "--model", str(folder / model_file), "--workers", "0", *options])
        return code, out, capsys.readouterr()

    for exported in ("dynamic.pt2", "fixed.pt2"):  # torch.export keeps the layers hookable
        code, out, _ = explain_with(exported, "--target", "topk:2", "--batch-size", "3")
        assert code == 0
        rows = read_rows(out / "manifest.jsonl")
        assert len(rows) == 6 and {r["layer"] for r in rows} == {"3"}
        assert {r["target_name"] for r in rows} <= {"0", "1", "2", "3", "4"}
        check_png(out / rows[0]["output"], size=(64, 64))

    code, _, streams = explain_with("pickled.pt")
    assert code == 2 and "--trust-model-file" in streams.err and "runs code" in streams.err
    code, out, _ = explain_with("pickled.pt", "--trust-model-file")
    assert code == 0 and len(read_rows(out / "manifest.jsonl")) == 3

    # a pickled module's pretrained_cfg (timm's keys) sets its input size, crop and normalisation
    model.pretrained_cfg = {"input_size": (3, 48, 40), "crop_pct": 1.0, "mean": (0.5,) * 3, "std": (0.25,) * 3}
    torch.save(model, folder / "configured.pt")
    loaded = models.load_model(str(folder / "configured.pt"), None, True, "cpu")
    picture = Image.new("RGB", (80, 96), (255, 128, 0))
    expected = (torch.tensor([1.0, 128 / 255, 0.0]) - 0.5) / 0.25
    torch.testing.assert_close(loaded.preprocess(picture), expected[:, None, None].expand(3, 48, 40))
    code, out, _ = explain_with("configured.pt", "--trust-model-file")
    assert code == 0
    check_png(out / read_rows(out / "manifest.jsonl")[0]["output"], size=(40, 48))

    code, _, streams = explain_with("scripted.pt")
    assert code == 2 and "TorchScript" in streams.err and ".pt2" in streams.err
    code, _, streams = explain_with("state.pt")
    assert code == 2 and "--weights" in streams.err and "state dict" in streams.err


def test_torchvision_name_with_a_weights_file(photos, capsys):
    import torchvision

    torch.manual_seed(0)
    torch.save(torchvision.models.mobilenet_v3_small().state_dict(), photos.parent / "weights.pth")
    out = photos.parent / "out"
    code = main(["run", str(photos), "--out", str(out), "--model", "mobilenet_v3_small",
                 "--weights", str(photos.parent / "weights.pth"), "--layer", "features.12", "--target", "tabby",
                 "--workers", "0", "--cmap", "viridis", "--alpha", "0.3"])
    assert code == 0
    rows = read_rows(out / "manifest.jsonl")
    assert {(r["layer"], r["target"], r["target_id"], r["target_name"]) for r in rows} == {("features.12", "281", 281, "tabby")}
    assert rows[0]["settings"] == f"model=mobilenet_v3_small weights={photos.parent / 'weights.pth'} cmap=viridis alpha=0.3"


#: Mistakes that show without the model, answered before torch is imported: (command, message).
MISTAKES_WITHOUT_TORCH = [
    (["run", "no-such-folder", "--out", "o"], "no-such-folder: no such file or folder"),
    (["run", ".", "--out", "o", "--alpha", "3"], "--alpha must lie in 0..1"),
    (["run", ".", "--out", "o", "--method", "gradcam,scorecan"], "--method: unknown method 'scorecan'; did you mean "
     "scorecam"),
    (["run", ".", "--out", "o", "-m", "smoothgrad:igg"], "--method: unknown method 'igg'; did you mean ig"),
    (["run", ".", "--out", "o", "-m", "blur:ig"], "--method: unknown noise tunnel 'blur'; use one of smoothgrad"),
    (["run", ".", "--out", "o", "-m", ""], "--method is empty"),
    (["run", ".", "--out", "o", "--metrics", "delction"], "--metrics: unknown metric 'delction'; did you mean "
     "deletion"),
    (["run", ".", "--out", "o", "--metrics", "pointing-game"], "--metrics: pointing-game need the objects' regions"),
    (["run", ".", "--out", "o", "--step", "9"], "--step goes with --metrics"),
    (["run", ".", "--out", "o", "--target", "topk:x"], "--target topk:x: topk:K takes a whole number"),
    (["run", ".", "--out", "o", "--target", "box:first"], "--target box:first: box:I takes a box index"),
    (["run", ".", "--out", "o", "--target", "similar:"], "--target similar:IMAGE names the reference image"),
    (["run", ".", "--out", "o", "-M", "ig"], "--method-option ig: give METHOD:KEY=VALUE"),
    (["run", ".", "--out", "o", "-M", "igg:n_steps=3"], "--method-option igg:n_steps=3: unknown method 'igg'"),
    (["run", ".", "--out", "o", "--max-memory", "2XB"], "--max-memory 2XB: give a size such as 2GB"),
    (["run", ".", "--out", "o", "--labels", "absent.csv"], "--labels absent.csv: no such file"),
    (["run", ".", "--out", "o", "--engine", "ray", "-m", "gradcan"], "--method: unknown method 'gradcan'"),
    (["evaluate", ".", "--out", "o", "--methods", "gradcamm"], "--methods: unknown method 'gradcamm'"),
    (["evaluate", ".", "--out", "o", "--metrics", "relevance-mass"], "--metrics relevance-mass: these metrics "
     "need the objects' regions; pass --regions FILE"),
    (["evaluate", ".", "--out", "o", "--regions", "absent.csv", "--metrics", "pointing-game"], "--regions absent.csv: "
     "no such file or folder"),
    (["evaluate", "no-such-folder", "--out", "o"], "no-such-folder: no such file or folder"),
    (["concepts", "atlas", ".", "--out", "o", "--layer", "auto"], "--layer: name the layer(s) of the atlas"),
    (["concepts", "atlas", ".", "--out", "o", "--layer", "l", "--channels", "2-x"], "--channels 2-x: give channel"),
    (["concepts", "atlas", ".", "--out", "o", "--layer", "l", "--max-memory", "2XB"], "--max-memory 2XB: give a"),
    (["concepts", "atlas", "no-such-folder", "--out", "o", "--layer", "l"], "no-such-folder: no such file or folder"),
    (["concepts", "visualize", "m", "l:0", "conv2", "--out", "o"], "concept 'conv2': give LAYER:CHANNEL"),
    (["concepts", "visualize", "m", "l:3-1", "--out", "o"], "concept 'l:3-1': the ranges hold no channel"),
    (["strategies", "no-such-run"], "no-such-run holds no manifest.jsonl: pass the --out folder of a finished"),
]


def test_help_methods_and_usage_errors_answer_without_torch():
    """`explain --help`, `explain methods` and mistakes that show without the model (method
    and metric names, the form of --target, -M and --max-memory, flags that go together)
    must not wait for torch (about 2 s to import here, 5.7 s with the models). One process
    for all of them: each new one would import PIL and numpy again."""
    code = ("import sys\n"
            "from explain.cli import main\n"
            "assert main(['methods']) == 0 and main(['samples']) == 0\n"
            f"for command, _ in {MISTAKES_WITHOUT_TORCH!r}:\n"
            "    assert main(command) == 2, command\n"
            "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n")
    done = subprocess.run([sys.executable, "-c", code], env=environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    errors = done.stderr.splitlines()
    assert len(errors) == len(MISTAKES_WITHOUT_TORCH), done.stderr
    for (command, message), error in zip(MISTAKES_WITHOUT_TORCH, errors):
        assert error.startswith(f"explain: error: {message}"), (command, error)
    from explain.data import sample_folder

    assert str(sample_folder()) in done.stdout.splitlines()  # explain samples: where the sample photos are


def test_the_tables_kept_for_a_fast_start_match_the_registries():
    from explain import options
    from explain.cli.listing import method_rows
    from explain.cli.method_table import METHOD_ROWS
    from explain.methods.attribution_base import reduce_channels
    from explain.metrics import METRICS

    assert METHOD_ROWS == method_rows(), "run python -m explain.cli.listing to regenerate explain/cli/method_table.py"
    assert options.METRIC_NAMES == tuple(METRICS)
    assert options.LOCALISATION_METRICS == tuple(name for name, spec in METRICS.items() if spec.needs == "regions")
    assert all(name in METRICS for name in options.STEP_METRICS)
    assert all(name in METRICS for name in options.PIXEL_METRICS)
    for reduction in options.REDUCTIONS:
        reduce_channels(torch.ones(1, 3, 2, 2), reduction)
    assert options.BUNDLED_MODEL == models.BUNDLED


def test_methods_table_fits_the_terminal_with_a_heading_on_every_column(capsys, monkeypatch):
    from explain.cli.listing import method_rows

    for columns in (80, 100, 300):
        monkeypatch.setenv("COLUMNS", str(columns))
        assert main(["methods"]) == 0
        listed = capsys.readouterr().out.splitlines()
        assert max(map(len, listed)) < columns
        assert listed[0].split()[:3] == ["method", "family", "layer"] and listed[0].split()[-1] == "description"
        starts = [i for i, line in enumerate(listed) if line[:1] not in ("", " ")]
        assert [listed[i].split()[0] for i in starts[1:]] == methods()
        # Descriptions wrap, whole: the last column's pieces of each row join into the registry's text.
        column = listed[0].index("description")
        for (name, *_, description), start, end in zip(method_rows(), starts[1:], starts[2:] + [len(listed)]):
            pieces = [line[column:].strip() for line in listed[start:end]]
            assert " ".join(piece for piece in pieces if piece) == description, name
    ig = " ".join(listed[starts[methods().index("ig") + 1]].split())  # 300 columns: one line a method
    assert ig.startswith("ig gradient attribution - 1 forward + n_steps (50) forward + backward Integrated")
    assert any(line.endswith("and the residual connections.") for line in listed)  # cut short before


def test_help_shows_each_default_once_and_every_option_has_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")

    def help_of(*command) -> str:
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--help"])
        assert exit_info.value.code == 0
        return capsys.readouterr().out

    top = help_of()
    commands = re.findall(r"^    (\w+)(?: |$)", top, flags=re.MULTILINE)
    assert commands == ["run", "evaluate", "concepts", "strategies", "methods", "layers", "samples"]
    for command in [*commands, "concepts atlas", "concepts visualize", "concepts craft", "concepts tcav"]:
        text = help_of(*command.split())
        assert "default: None" not in text and "default: False" not in text, command
        # An entry: its flags (or name) at two spaces, its help after them or on the lines below.
        entries = re.split(r"\n(?=  \S)", text.split("\n\n", 2)[2])
        for entry in entries:
            if entry.endswith(":") or not entry.startswith("  "):  # a group's heading
                continue
            flags, _, rest = entry.strip().partition("  ")
            assert rest.strip(), f"explain {command}: {flags} has no help"
            assert entry.count("default:") <= 1, f"explain {command}: {flags} shows two defaults"
    assert "--batch-size BATCH_SIZE, -b BATCH_SIZE\n" in help_of("run")
    assert "(default: 16)" in help_of("evaluate") and "(default: cuda if available, else cpu)" in help_of("layers")


def test_layers_shows_a_summary_and_the_main_candidates_and_all_on_request(capsys):
    assert main(["layers", "efficientnet_lite0"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == ("efficientnet_lite0: classifier, 4.65 M parameters, 0.39 GMACs (multiply-adds) for an "
                         "input of 1x3x224x224")
    assert listed[1] == "automatic target layer (--layer auto): bn2 (BatchNormAct2d, output 1280x7x7)"
    start = listed.index("main candidate target layers (spatial outputs), in execution order; * marks the "
                         "automatic choice:")
    table = listed[start + 2:listed.index("", start)]
    assert listed[start + 1].split() == ["layer", "type", "output", "shape"]
    assert [line.split()[1] for line in table if line.startswith("*")] == ["bn2"]
    names = [line.split()[-3] for line in table]
    assert {"conv_stem", "blocks.0", "blocks.6", "blocks", "conv_head", "bn2"} <= set(names)
    assert len(names) <= 31 and "blocks.1.0.conv_dw" not in names and len(listed) < 40
    assert listed[-1].endswith("explain layers efficientnet_lite0 --all")
    assert main(["layers", "efficientnet_lite0", "--all"]) == 0
    listed = capsys.readouterr().out.splitlines()
    # The per-layer table: parameters and multiply-adds, the automatic target marked, totals.
    assert listed[0].split() == ["layer", "type", "output", "shape", "parameters", "multiply-adds"]
    assert re.fullmatch(r"   conv_stem +Conv2dSame +32x112x112 +864 +10,838,016", listed[1])
    assert [line.split()[:5] for line in listed if line.startswith("*  ")][0] == [
        "*", "bn2", "BatchNormAct2d", "1280x7x7", "2,560"]
    assert "total: 4.65 M parameters, 0.39 GMACs (multiply-adds) for an input of 1x3x224x224" in listed
    # Then every candidate target layer.
    assert re.fullmatch(r"\* +bn2 +BatchNormAct2d +1280x7x7", listed[-1])
    candidates = listed[listed.index("candidate target layers (spatial outputs), in execution order; * marks the "
                                     "automatic choice:"):]
    assert sum(line.startswith("*") for line in candidates) == 1 and len(candidates) > 250


def test_usage_mistakes_print_the_usage(capsys):
    for command in (["run", "x", "--out", "o", "--batch-size", "0"], ["run", "--out", "o"], ["explain-everything"]):
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        assert exit_info.value.code == 2
        assert "usage: explain" in capsys.readouterr().err


def test_workers_hand_over_uint8_crops_and_the_model_input_is_unchanged():
    import torchvision
    from torchvision import transforms

    from explain.batch.decoding import ModelInputs, collate

    photo = Image.open(REPO / "data" / "images" / "chelsea.png").convert("RGB")
    bundled = models.imagenet_preprocess(resize=256, crop=224, mean=(0.5,) * 3, std=(0.5,) * 3)
    preset = torchvision.models.ResNet50_Weights.IMAGENET1K_V2.transforms()  # no download: transforms only
    custom = transforms.Compose([transforms.Resize((64, 80)), transforms.PILToTensor(),
                                 transforms.ConvertImageDtype(torch.float32), transforms.Normalize([0.4] * 3, [0.2] * 3)])
    for preprocess, split in ((bundled, True), (preset, True), (custom, False)):
        inputs = ModelInputs(preprocess)
        batch = collate([(0, inputs.in_workers(photo), None), (1, inputs.in_workers(photo), None)])
        (indices, images), = batch.groups
        assert indices == [0, 1]
        assert images.dtype == (torch.uint8 if split else torch.float32)
        model_input = inputs.model_input(images)
        assert torch.equal(model_input, preprocess(photo).expand(2, -1, -1, -1))  # bitwise
        pictures = inputs.pictures(images, model_input)
        assert pictures.dtype == np.uint8 and pictures.shape == (2, *model_input.shape[-2:], 3)
        if split:  # the overlays are drawn on the very pixels of the crop
            crop = transforms.CenterCrop(224)(transforms.Resize(preset.resize_size if preprocess is preset else 256)(photo))
            assert np.array_equal(pictures[0], np.asarray(crop))


def test_reused_heap_trims_only_when_the_heap_creeps_up(monkeypatch):
    import platform

    from explain import heap as heap_module

    heap = heap_module.ReusedHeap(warmup=2, slack=0.01)
    assert heap.enabled is (platform.libc_ver()[0] == "glibc")
    if not heap.enabled:
        return
    trims = []
    heap._libc = type("FakeLibc", (), {"malloc_trim": staticmethod(lambda pad: trims.append(pad))})()
    resident = iter([100, 110, 111, 112, 105, 120])
    monkeypatch.setattr(heap_module, "_resident_pages", lambda: next(resident))
    for _ in range(6):
        heap.after_batch()
    # reference = 110 (largest of the first two); 111 is within 1 %, 112 and 120 are not
    assert heap.reference == 110 and trims == [0, 0] and heap.trims == 2
    monkeypatch.undo()
    heap_module.ReusedHeap().close()  # the real allocator back to glibc's initial settings


def test_reused_heap_hands_back_the_setup_and_what_a_batch_of_passes_grows_past_its_room(monkeypatch):
    import platform

    from explain import heap as heap_module

    if platform.libc_ver()[0] != "glibc":
        assert not heap_module.ReusedHeap().enabled
        return
    trims = []
    fake = type("FakeLibc", (), {"malloc_trim": staticmethod(lambda pad: trims.append(pad)),
                                 "mallopt": staticmethod(lambda option, value: 1)})()
    monkeypatch.setattr(heap_module, "_glibc", lambda: fake)
    monkeypatch.setattr(heap_module, "_page_size", lambda: 1000)
    resident = iter([500, 600, 700, 701, 650])
    monkeypatch.setattr(heap_module, "_resident_pages", lambda: next(resident))
    heap = heap_module.ReusedHeap(room=200_000)  # 200 pages
    assert trims == [0] and heap.floor == 500 and heap.ceiling == 700  # the setup's freed memory went back first
    heap.after_passes()  # 600
    heap.after_passes()  # 700: at the ceiling, kept
    assert trims == [0]
    heap.after_passes()  # 701: past it
    heap.after_passes()  # 650
    assert trims == [0, 0] and heap.trims == 1
    # Once the first batches set a reference above the room, what they need is kept.
    heap.reference = 1000
    monkeypatch.setattr(heap_module, "_resident_pages", lambda: 1005)
    heap.after_passes()
    assert heap.trims == 1


def test_commands_give_the_allocator_back(tmp_path, monkeypatch):
    # explain.cli.main() called from Python sets glibc's thresholds for its run and puts
    # glibc's initial ones back when the run ends, returning the kept memory.
    from explain import heap as heap_module

    calls = []

    class FakeLibc:
        @staticmethod
        def mallopt(option, value):
            calls.append(("mallopt", option, value))
            return 1

        @staticmethod
        def malloc_trim(pad):
            calls.append(("malloc_trim", pad))

    monkeypatch.setattr(heap_module, "_glibc", lambda: FakeLibc())
    assert main(["run", str(REPO / "data" / "images" / "coffee.png"), "--out", str(tmp_path / "out"), "-q"]) == 0
    one_gib, initial = 1 << 30, 128 * 1024
    assert calls[:2] == [("mallopt", -3, one_gib), ("mallopt", -1, one_gib)]
    assert calls[-3:] == [("mallopt", -1, initial), ("mallopt", -3, initial), ("malloc_trim", 0)]


def test_exif_rotation_reaches_the_overlay(tmp_path, capsys):
    # Landscape: left half black, right half white; EXIF orientation 6 means "rotate 90° clockwise
    # to view", which puts the black half on top.
    pixels = np.zeros((40, 60, 3), dtype=np.uint8)
    pixels[:, 30:] = 255
    photo = Image.fromarray(pixels)
    exif = photo.getexif()
    exif[0x0112] = 6
    photo.save(tmp_path / "turned.jpg", exif=exif, quality=95)
    assert main(["run", str(tmp_path / "turned.jpg"), "--out", str(tmp_path / "out"), "--workers", "0", "-q"]) == 0
    row, = read_rows(tmp_path / "out" / "manifest.jsonl")
    overlay = np.asarray(Image.open(tmp_path / "out" / row["output"]).convert("L"), dtype=float)
    top, bottom, left, right = overlay[:100].mean(), overlay[-100:].mean(), overlay[:, :100].mean(), overlay[:, -100:].mean()
    assert bottom - top > 60 and abs(left - right) < 20


def test_outputs_mirror_the_tree_below_the_folder_given(tmp_path, capsys):
    (tmp_path / "photos" / "sub").mkdir(parents=True)
    noise_image(0).save(tmp_path / "photos" / "sub" / "only.png")
    assert main(["run", str(tmp_path / "photos"), "--out", str(tmp_path / "out"), "--workers", "0", "-q"]) == 0
    row, = read_rows(tmp_path / "out" / "manifest.jsonl")
    assert row["output"].startswith("sub/only__gradcam__")


def test_a_second_run_on_the_same_folder_is_refused_and_globals_are_restored(photos, capsys, monkeypatch):
    import fcntl

    from explain.batch import evaluating, preparation

    out = photos.parent / "out"
    out.mkdir()
    limit = Image.MAX_IMAGE_PIXELS
    held = os.open(out, os.O_RDONLY)
    loads = []  # refused before the model loads (45 s on a loaded machine), not after
    with monkeypatch.context() as patch:
        for module in (preparation, evaluating):
            patch.setattr(module, "load_model", lambda *args, **kwargs: loads.append(args))
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running `explain run` holds it
            assert main(["run", str(photos), "--out", str(out), "--workers", "0"]) == 2
            assert "another `explain run` is writing to" in capsys.readouterr().err
            assert main(["evaluate", str(photos), "--out", str(out), "--workers", "0"]) == 2
            assert "another `explain evaluate` is writing to" in capsys.readouterr().err
        finally:
            os.close(held)
    assert loads == []
    assert main(["run", str(photos), "--out", str(out), "--workers", "0", "--max-pixels", "0", "-q"]) == 0
    assert Image.MAX_IMAGE_PIXELS == limit
    assert summary_counts(capsys.readouterr().out) == (3, 0, 0)
    assert main(["run", str(photos), "--out", str(out), "--workers", "0", "-q"]) == 0  # the lock was released
    assert summary_counts(capsys.readouterr().out) == (0, 3, 0)


def test_random_weights_warn_and_broken_model_files_are_usage_errors(photos, capsys):
    import zipfile

    out = photos.parent / "out"
    assert main(["run", str(photos), "--out", str(out), "--model", "squeezenet1_1", "--workers", "0", "-q"]) == 0
    assert "squeezenet1_1 has random weights" in capsys.readouterr().err
    with zipfile.ZipFile(photos.parent / "broken.pt2", "w") as archive:
        archive.writestr("broken/archive_format", "pt2")
        archive.writestr("broken/models/model.json", "{not json")
    cases = [("broken.pt2", "RuntimeError", [])]
    # Foreign bytes fail torch.load in several ways (UnpicklingError, IndexError, KeyError,
    # UnicodeDecodeError for these seeds on torch 2.14); each must read as the same usage error.
    for seed in (0, 2, 20, 195):
        (photos.parent / f"noise{seed}.pt").write_bytes(random.Random(seed).randbytes(256))
        cases.append((f"noise{seed}.pt", "not a PyTorch file, or a damaged one", []))
    (photos.parent / "notes.pt").write_text("these are not weights\n")
    cases += [("notes.pt", "not a PyTorch file, or a damaged one", []),
              ("notes.pt", "not a PyTorch file, or a damaged one", ["--trust-model-file"])]
    for name, reason, flags in cases:
        args = ["run", str(photos), "--out", str(out), "--model", str(photos.parent / name), "--workers", "0"]
        assert main(args + flags) == 2
        error = capsys.readouterr().err
        assert "explain: error: cannot load " in error and str(photos.parent / name) in error and reason in error
        assert "--trust-model-file" not in error and "Traceback" not in error and "Warning" not in error


@pytest.mark.parametrize(("device", "cores", "threads", "expected"), [
    ("cpu", 2, 2, 0), ("cpu", 6, 4, 2), ("cpu", 16, 8, 4), ("cuda", 2, 2, 2), ("cuda", 16, 8, 4),
])
def test_default_decode_workers_use_the_cores_the_model_leaves(monkeypatch, device, cores, threads, expected):
    from explain.batch.decoding import default_workers

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert default_workers(torch.device(device)) == expected


def test_out_of_memory_halves_the_batch_and_is_no_usage_error(tmp_path, capsys, monkeypatch, one_image_at_a_time):
    # The run explains each group in halves down to single images.
    from explain.methods import cam_base

    sizes = one_image_at_a_time
    out = tmp_path / "out"
    assert main(["run", str(REPO / "data" / "images"), "--out", str(out), "--method", "gradcam,layercam",
                 "--batch-size", "4", "-q"]) == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["status"] == "ok" and (out / r["output"]).is_file() for r in rows)
    assert len({(r["input"], r["method"]) for r in rows}) == 8  # nothing written twice
    assert sizes[0] == 1 and 4 in sizes and 2 in sizes  # the probe, then 4 -> 2 -> 1
    # Out of memory on the one-image probe is the device's limit, not a usage error: exit 3.
    monkeypatch.setattr(cam_base.BaseCAM, "capture", lambda *args, **kwargs: (_ for _ in ()).throw(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")))
    capsys.readouterr()
    assert main(["run", str(REPO / "data" / "images"), "--out", str(tmp_path / "again"), "-q"]) == 3
    assert "out of memory before any image was explained (CUDA out of memory" in capsys.readouterr().err


class _CountedModel(nn.Sequential):
    """The tiny model, pickled for --trust-model-file, counting the rows of its forward passes
    (a class attribute: the loaded copy is another object)."""

    rows: ClassVar[list[int]] = []

    def forward(self, x):
        _CountedModel.rows.append(len(x))
        return super().forward(x)


def _counted_model_file(folder: Path) -> Path:
    path = folder / "counted.pt"
    torch.save(_CountedModel(*_tiny_model()), path)
    return path


def test_method_options_reach_their_methods_are_recorded_and_redo_them_on_resume(photos, capsys):
    model = _counted_model_file(photos.parent)
    images = [str(photos / "p0.png"), str(photos / "p1.png")]
    common = ["run", *images, "--model", str(model), "--trust-model-file", "--workers", "0", "-q"]

    def forward_rows(out: str, *options: str) -> int:
        _CountedModel.rows.clear()
        assert main([*common, "--out", str(photos.parent / out), "--method", "ig", *options]) == 0
        capsys.readouterr()
        return sum(_CountedModel.rows)

    # IG's steps are its passes: two steps more, two rows more per image (its start-up check runs none).
    assert forward_rows("ig3", "-M", "ig:n_steps=3") + 2 * len(images) == forward_rows("ig5", "-M", "IG:n-steps=5")
    assert read_rows(photos.parent / "ig5" / "manifest.jsonl")[0]["settings"].endswith(" n_steps=5")

    out = photos.parent / "out"
    options = ["--method", "ig,lrp,layer-ig,gradcam", "--save-maps", "--out", str(out)]
    lrp_options = ["-M", "lrp:composite=epsilon-plus-flat", "--method-option", "layer-ig:neuron=3,2,2"]
    assert main([*common, *options, "-M", "ig:n_steps=3", *lrp_options]) == 0
    assert summary_counts(capsys.readouterr().out) == (8, 0, 0)
    rows = {(r["input"], r["method"]): r for r in read_rows(out / "manifest.jsonl")}
    base = f"model={model} weights=- cmap=jet alpha=0.5"
    assert {m: r["settings"] for (_, m), r in rows.items()} == {
        "ig": base + " n_steps=3", "lrp": base + " composite=epsilon-plus-flat", "layer-ig": base + " neuron=(3,2,2)",
        "gradcam": base}
    assert all(r["status"] == "ok" for r in rows.values())
    # With neuron=, layer IG explains one neuron of the layer by the input: no class target.
    assert {(r["layer"], r["target_id"]) for (_, m), r in rows.items() if m == "layer-ig"} == {("input", -1)}
    assert {r["layer"] for (_, m), r in rows.items() if m == "gradcam"} == {"3"}  # the auto layer
    with np.load(out / rows[(images[0], "lrp")]["maps"]) as saved:
        flat = saved["maps"]

    # The same options again: nothing to do. Other options for IG, none for LRP: those two are redone.
    assert main([*common, *options, "-M", "ig:n_steps=3", *lrp_options]) == 0
    assert summary_counts(capsys.readouterr().out) == (0, 8, 0)
    assert main([*common, *options, "-M", "ig:n_steps=4", "-M", "layer-ig:neuron=(3, 2, 2)"]) == 0
    assert summary_counts(capsys.readouterr().out) == (4, 4, 0)
    rows = {(r["input"], r["method"]): r for r in read_rows(out / "manifest.jsonl")}
    assert rows[(images[0], "lrp")]["settings"] == base and rows[(images[0], "ig")]["settings"] == base + " n_steps=4"
    with np.load(out / rows[(images[0], "lrp")]["maps"]) as saved:
        assert not np.allclose(saved["maps"], flat, atol=1e-3)  # the default composite draws another map


def test_method_all_takes_a_method_option_for_that_method_alone():
    from explain.batch.explainers import build_explainers, parse_method_options, parse_target
    from explain.models import LoadedModel

    loaded = LoadedModel(_tiny_model(), None, list("abcde"), torch.device("cpu"), torch.rand(1, 3, 32, 32))
    options = parse_method_options(["ig:n_steps=3", "smoothgrad:ig:n_samples=2"])
    with pytest.raises(UsageError, match=r"--method-option smoothgrad:ig:n_samples=2: smoothgrad:ig is not among "
                                         r"--method all; add it to --method"):
        build_explainers("all", loaded, "auto", parse_target("top1", loaded.class_names), options)
    del options[method_class("smoothgrad:ig")]
    cams = {cam.name: cam for cam in build_explainers("all", loaded, "auto", parse_target("top1", ["a"] * 5), options)}
    image = loaded.example
    assert cams["ig"].planned_passes(image) == 1 + 3  # the scoring pass and the 3 steps
    for name in ("layer-ig", "blurig", "smoothgrad"):  # methods that take n_steps or n_samples: their defaults
        assert cams[name].planned_passes(image) == method_class(name)(loaded.model).planned_passes(image) > 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["-M", "ig:n_steps=3"], "--method-option ig:n_steps=3: ig is not among --method gradcam; add it to --method"),
        (["-m", "ig", "-M", "ig:n_steps=0"], "--method-option ig:n_steps=0: n_steps must be a positive int, got 0"),
        (["-m", "ig", "-M", "ig:steps=3"],
         "--method-option ig:steps=3: ig takes no steps; its options: n_steps, method, baseline, seed, "
         "internal_batch_size, clip_percentile"),
        (["-m", "ig", "-M", "ig:reduction=sum"],
         "reduction is set by --reduction for all the methods; use --reduction"),
        (["-M", "gradcam:target_layer=bn2"], "target_layer is set by --layer for all the methods; use --layer"),
        (["-M", "gradcam:eigen_smooth=true"], "eigen_smooth is set by --eigen-smooth"),
        (["-m", "ig", "-M", "ig:n_steps=3", "-M", "IG:n-steps=4"],
         "--method-option IG:n-steps=4: ig's n_steps is given twice"),
        (["-M", "n_steps=3"], "--method-option n_steps=3: give METHOD:KEY=VALUE, such as ig:n_steps=32"),
        (["-M", "ig:n_steps"], "--method-option ig:n_steps: give METHOD:KEY=VALUE"),
        (["-M", "igg:n_steps=3"], "--method-option igg:n_steps=3: unknown method 'igg'; did you mean ig"),
        (["-m", "layer-ig", "-M", "layer-ig:neuron=(3,99,99)"],
         "--method-option layer-ig:neuron=(3,99,99): neuron=(3, 99, 99) is not in layer 'bn2', whose grid holds 1280 "
         "channels of 7 x 7"),
        (["-m", "layer-ig", "-M", "layer-ig:neuron=3", "--target", "topk:2"],
         "--method-option layer-ig:neuron=3: layer-ig with neuron= explains that neuron's activation, not a class"),
    ],
)
def test_method_option_usage_errors_name_the_fix(photos, capsys, options, message):
    assert main(["run", str(photos), "--out", str(photos.parent / "out"), "--workers", "0", *options]) == 2
    error = capsys.readouterr().err
    assert error.startswith("explain: error: ") and message in error, error
    assert not re.search(r"\w+(Error|Exception):", error), error
    assert not (photos.parent / "out" / "manifest.jsonl").exists()
