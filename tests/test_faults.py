"""Faults of the machine and of the input files that a run survives (the README's
Reliability section lists the classes covered here and elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from explain.cli import main
from explain.viewer import read_page

REPO = Path(__file__).resolve().parents[1]
CPU_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 822083584 bytes"


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("where", ["model_input", "capture"])
def test_a_failed_cpu_allocation_halves_the_batch_as_out_of_memory_does(tmp_path, monkeypatch, where):
    # Under `ulimit -v` or a container's limit, the CPU allocator raises a RuntimeError, not
    # torch.OutOfMemoryError: it is the same fault, and the batch is explained in halves.
    from explain.batch.decoding import ModelInputs
    from explain.methods import cam_base

    owner, name = (ModelInputs, "model_input") if where == "model_input" else (cam_base.BaseCAM, "capture")
    original, sizes = getattr(owner, name), []

    def fits_one_image(self, images, *args, **kwargs):
        sizes.append(len(images))
        if len(images) > 1:
            raise RuntimeError(CPU_ALLOCATION_FAILED)
        return original(self, images, *args, **kwargs)

    monkeypatch.setattr(owner, name, fits_one_image)
    out = tmp_path / "out"
    assert main(["run", str(REPO / "data" / "images"), "--out", str(out), "--batch-size", "4", "--workers", "0",
                 "-q"]) == 0
    rows = _rows(out)
    assert len(rows) == 4 and all(r["status"] == "ok" and (out / r["output"]).is_file() for r in rows)
    assert 4 in sizes and 2 in sizes and sizes.count(1) >= 4


def _image(folder: Path, name: str = "red.png") -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 32), "red").save(folder / name)
    return folder / name


def test_a_list_without_line_ends_is_refused_not_read_without_bound(tmp_path, capsys):
    # @/dev/zero once read until the kernel killed the process; a line this long is no path.
    for list_file in ["/dev/zero", tmp_path / "nul.txt"]:
        if list_file != "/dev/zero":
            list_file.write_bytes(b"a.png\n\0\0\0\n")
        code = main(["run", f"@{list_file}", "--out", str(tmp_path / "out"), "-q"])
        error = capsys.readouterr().err
        assert code == 2 and f"list file @{list_file}" in error
        assert ("longer than 16384 characters" in error) or ("NUL byte" in error)


@pytest.mark.parametrize("reader", ["labels", "regions"])
def test_labels_and_regions_without_line_ends_are_refused_not_read_without_bound(tmp_path, reader):
    # --labels /dev/zero and `explain evaluate --regions /dev/zero` read 3.2 GB and more.
    from explain.batch.ground_truth import read_labels
    from explain.errors import UsageError
    from explain.evaluation import read_regions

    (tmp_path / "long.csv").write_text("a" * 100_000)
    for path in ["/dev/zero", tmp_path / "long.csv"]:
        if reader == "labels":
            with pytest.raises(UsageError, match=rf"^--labels {path}: line 1 is longer than 16384 characters; give a"):
                read_labels(path, ["cat", "dog"])
        else:
            with pytest.raises(ValueError, match=rf"^regions file {path}: line 1 is longer than 16384 characters"):
                read_regions(path, ["a.png"], (4, 4))


def test_labels_are_csv_records_with_a_bounded_field_and_no_silent_duplicates(tmp_path, capsys):
    from explain.batch.ground_truth import read_labels
    from explain.errors import UsageError

    labels = tmp_path / "labels.csv"
    # A quoted path holds commas, quotes and U+2028 (str.splitlines once broke the line there).
    labels.write_text('path,label\n"a\u2028b, ""c"".png",dog\nd.png,cat\n', encoding="utf-8")
    assert read_labels(labels, ["cat", "dog"]) == {
        "a\u2028b, \"c\".png": 1, str(tmp_path / "a\u2028b, \"c\".png"): 1,
        "d.png": 0, str(tmp_path / "d.png"): 0}
    labels.write_text('a.png,cat\n"' + ("x" * 1000 + "\n") * 140 + '",dog\n')  # a field of 140,140 characters
    with pytest.raises(UsageError, match=rf"^--labels {labels}: line 132: field larger than field limit \(131072\)"):
        read_labels(labels, ["cat", "dog"])
    labels.write_text("a.png,cat\nb.png,dog\n./a.png,dog\n")
    with pytest.raises(UsageError, match=rf"^--labels {labels} line 3: './a.png' is labelled 'dog' here and 'cat' on "
                                         "line 1; keep one label per image"):
        read_labels(labels, ["cat", "dog"])
    labels.write_text("a.png,cat\nb.png,dog\na.png,0\nb.png,dog\n")
    assert read_labels(labels, ["cat", "dog"])["a.png"] == 0
    assert capsys.readouterr().err == f"explain: note: --labels {labels} line 3 repeats line 1 (2 repeated lines in all)\n"


def test_out_of_memory_before_the_first_image_is_exit_3_whatever_the_message(tmp_path, monkeypatch, capsys):
    # A bare MemoryError() crashed the handler with IndexError (the first line of no text).
    from explain.batch import preparation

    for error in [MemoryError(), RuntimeError(CPU_ALLOCATION_FAILED + "\nError code 12")]:
        def out_of_memory(*args, **kwargs):
            raise error

        monkeypatch.setattr(preparation, "load_model", out_of_memory)
        assert main(["run", str(REPO / "data" / "images"), "--out", str(tmp_path / "out")]) == 3
        message = capsys.readouterr().err
        assert message.startswith("explain: error: out of memory before any image was explained (")
        assert ("(MemoryError)" if isinstance(error, MemoryError) else f"({CPU_ALLOCATION_FAILED})") in message


@pytest.mark.parametrize("weights", ["weights.pth", "weights.safetensors", "model.pt"])
def test_memory_running_out_while_loading_weights_is_no_damaged_file(tmp_path, monkeypatch, capsys, weights):
    # A failed CPU allocation in torch.load read as "not a state dict ..., or a damaged one" (exit 2).
    import safetensors.torch

    def out_of_memory(*args, **kwargs):
        raise RuntimeError(CPU_ALLOCATION_FAILED)

    monkeypatch.setattr(torch, "load", out_of_memory)
    monkeypatch.setattr(safetensors.torch, "load_file", out_of_memory)
    (tmp_path / weights).write_bytes(b"weights")
    model = ["--model", str(tmp_path / weights), "--trust-model-file"] if weights == "model.pt" else [
        "--model", "resnet18", "--weights", str(tmp_path / weights)]
    assert main(["run", str(REPO / "data" / "images"), "--out", str(tmp_path / "out"), *model]) == 3
    error = capsys.readouterr().err
    assert error.startswith(f"explain: error: out of memory before any image was explained ({CPU_ALLOCATION_FAILED}); ")
    assert "damaged" not in error


def test_a_list_line_of_the_longest_length_is_still_read(tmp_path, capsys):
    from explain.batch.inputs import MAX_LIST_LINE, collect_inputs

    (tmp_path / "list.txt").write_text("x" * MAX_LIST_LINE + "\n")
    (source,) = collect_inputs([f"@{tmp_path / 'list.txt'}"], tmp_path / "out")
    assert source.error == "file not found" and len(source.input) == MAX_LIST_LINE


def test_a_list_that_is_not_utf8_names_its_files_and_missing_entries_are_counted(tmp_path, capsys):
    from explain.batch.inputs import collect_inputs

    _image(tmp_path / "photos")
    entries = [str(tmp_path / "photos" / "red.png").encode()] + [f"gone{i}.png".encode() for i in range(5)]
    (tmp_path / "list.txt").write_bytes(b"# caf\xe9\n" + b"\n".join(entries) + b"\n")
    sources = collect_inputs([f"@{tmp_path / 'list.txt'}"], tmp_path / "out")
    assert [s.error for s in sources] == [None] + ["file not found"] * 5
    error = capsys.readouterr().err
    assert "explain: 5 input(s) cannot be read and are recorded as failed: gone0.png (file not found)" in error
    assert "gone2.png" in error and "gone3.png" not in error and error.count("\n") == 1


def test_an_unreadable_subfolder_and_file_are_named_failures_with_their_reason(tmp_path, monkeypatch):
    # The tests run as root, who reads everything: the system's refusals are simulated.
    import os

    from PIL import Image

    from explain.batch.inputs import collect_inputs
    from explain.images import ImageError, load_rgb

    _image(tmp_path / "photos")
    _image(tmp_path / "photos" / "locked")
    locked, scandir = str(tmp_path / "photos" / "locked"), os.scandir

    def refusing(path="."):
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    sources = collect_inputs([str(tmp_path / "photos")], tmp_path / "out")
    assert [(Path(s.path).name, s.error) for s in sources] == [
        ("red.png", None), ("locked", "cannot list this folder: permission denied")]

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "photos" / "red.png"))

    monkeypatch.setattr(Image, "open", denied)
    with pytest.raises(ImageError, match="^permission denied: this user cannot read the file$"):
        load_rgb(tmp_path / "photos" / "red.png")


def test_an_unreadable_subfolder_is_a_failed_row_and_fails_the_run(tmp_path, monkeypatch, capsys):
    # stderr said "recorded as failed", but the run dropped the folder: no row, 0 failed, exit 0.
    import os

    _image(tmp_path / "photos")
    _image(tmp_path / "photos" / "locked")
    locked, scandir = str(tmp_path / "photos" / "locked"), os.scandir

    def refusing(path="."):
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "photos"), "--out", str(out), "--workers", "0", "-q"]) == 1
    captured = capsys.readouterr()
    assert "1 input(s) cannot be read and are recorded as failed" in captured.err
    assert "1 done now, 0 skipped (done before), 1 failed" in captured.out
    by_input = {row["input"]: row for row in _rows(out)}
    assert by_input[locked]["status"] == "failed"
    assert by_input[locked]["error"] == "cannot list this folder: permission denied"
    assert by_input[str(tmp_path / "photos" / "red.png")]["status"] == "ok"
    assert read_page(out / "index.html")["run"]["counts"] == {"ok": 1, "skipped": 0, "failed": 1}


def test_file_names_near_the_limit_get_shortened_outputs_that_a_rerun_finds(tmp_path, capsys):
    # The overlay's name (stem + __method__target.png) and its temporary file's passed the
    # file system's 255 bytes: "File name too long" on every rerun. A folder whose name is not
    # UTF-8 grows too: each byte becomes U+FFFD (3 bytes) in the mirrored tree.
    import os

    photos = tmp_path / "photos"
    names = ["é" * 100 + "x" * 30 + ".png", "a" * 240 + ".png", "a" * 239 + "b.png"]
    for name in names:
        _image(photos, name)
    nested = os.path.join(os.fsencode(photos), b"\xe9" * 200)
    os.mkdir(nested)
    _image(Path(os.fsdecode(nested)), names[1])
    command = ["run", str(photos), "--out", str(tmp_path / "out"), "--save-maps", "--workers", "0", "-q"]
    assert main(command) == 0
    assert "1 done now" not in capsys.readouterr().out
    rows = _rows(tmp_path / "out")
    assert len(rows) == 4 and {row["status"] for row in rows} == {"ok"}
    outputs = {row["output"] for row in rows} | {row["maps"] for row in rows}
    assert len(outputs) == 8  # each name its own
    for output in outputs:
        assert (tmp_path / "out" / output).is_file()
        *folders, file = output.split("/")
        assert len(file.encode()) <= 255 - 22 and all(len(part.encode()) <= 255 for part in folders)
    assert any("~" in output for output in outputs) and any(row["output"].startswith("é" * 20) for row in rows)
    assert main(command) == 0  # the rerun finds every output under its shortened name
    assert "0 done now, 4 skipped (done before), 0 failed" in capsys.readouterr().out


def test_other_runs_output_folders_among_the_inputs_are_skipped_with_a_note(tmp_path, capsys):
    # `explain run d --out d/out`, then `--out d/out2`: d/out's overlays were explained as images.
    from explain.batch.guards import LEASE
    from explain.batch.inputs import PLAN_PREFIX, RUN_FOLDER_FILES, collect_inputs
    from explain.batch.manifest import MANIFEST
    from explain.evaluation.files import SCORES

    assert RUN_FOLDER_FILES == ((MANIFEST, "index.html"), (SCORES, "index.html"))
    photos = tmp_path / "d"
    _image(photos)
    marks = {"scored": ["scores.csv", "index.html"], "leased": [LEASE], "planned": [f"{PLAN_PREFIX}1a2b/x"]}
    for folder, names in marks.items():
        _image(photos / folder / "deep", "overlay.png")
        for name in names:
            (photos / folder / name).parent.mkdir(exist_ok=True)
            (photos / folder / name).write_text("")
    command = ["run", str(photos), "--workers", "0", "-q"]
    assert main([*command, "--out", str(photos / "out")]) == 0
    capsys.readouterr()
    assert main([*command, "--out", str(photos / "out2")]) == 0
    captured = capsys.readouterr()
    assert "1 done now, 0 skipped (done before), 0 failed" in captured.out
    assert [row["input"] for row in _rows(photos / "out2")] == [str(photos / "red.png")]
    notes = [line for line in captured.err.splitlines() if "the output folder of another run" in line]
    assert notes == [f"explain: skipped {photos / folder}: the output folder of another run (it holds {held}); "
                     "name its files to explain them" for folder, held in [
                         ("leased", LEASE), ("out", "manifest.jsonl and index.html"), ("planned", f"{PLAN_PREFIX}1a2b/"),
                         ("scored", "scores.csv and index.html")]]
    # A glob's matches in such a folder are skipped too, unless the glob names the folder itself.
    assert [Path(s.path).name for s in collect_inputs([str(photos / "**" / "*.png")], tmp_path / "o")] == ["red.png"]
    assert [Path(s.path).name for s in collect_inputs([str(photos / "scored" / "*" / "*.png")], tmp_path / "o")] == [
        "overlay.png"]


def test_a_manifest_row_of_other_types_is_made_again_not_a_crash(tmp_path):
    _image(tmp_path / "photos")
    out = tmp_path / "out"
    args = ["run", str(tmp_path / "photos"), "--out", str(out), "--model", "resnet18", "--workers", "0", "-q"]
    assert main(args) == 0
    row = _rows(out)[0]
    broken = [dict(row, output=5), dict(row, input=["red.png"]), dict(row, metrics=[1, 2]), dict(row, target={"a": 1})]
    (out / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in broken))
    assert main(args) == 0
    rows = _rows(out)
    assert [(r["input"], r["status"]) for r in rows] == [(row["input"], "ok")]
    assert (out / rows[0]["output"]).is_file()


def test_a_file_name_that_is_not_utf8_is_explained_recorded_losslessly_and_skipped_on_rerun(tmp_path, capsys):
    import os
    import shutil

    folder = tmp_path / "d"
    _image(folder, "ok.png")
    shutil.copy(folder / "ok.png", os.fsdecode(bytes(folder) + b"/caf\xe9.png"))
    out = tmp_path / "out"
    args = ["run", str(folder), "--out", str(out), "--model", "resnet18", "--workers", "0", "-q"]
    assert main(args) == 0
    manifest = (out / "manifest.jsonl").read_bytes()
    manifest.decode("utf-8")  # valid UTF-8, the odd name as a JSON escape
    rows = _rows(out)
    names = sorted(os.fsencode(Path(r["input"]).name) for r in rows)
    assert names == [b"caf\xe9.png", b"ok.png"] and all(r["status"] == "ok" for r in rows)
    assert all((out / r["output"]).is_file() and r["output"].encode("utf-8") for r in rows)
    names = [Path(image["name"]).name for image in read_page(out / "index.html")["images"]]
    assert sorted(names) == ["caf\\xe9.png", "ok.png"]  # shown with the byte escaped
    assert main(args) == 0 and [r["status"] for r in _rows(out)] == ["skipped", "skipped"]
    evaluate = ["evaluate", str(folder), "--out", str(tmp_path / "scores"), "--model", "resnet18",
                "--metrics", "sparseness", "--workers", "0", "-q"]
    assert main(evaluate) == 0 and main(evaluate) == 0
    assert "0 scored now, 2 skipped" in capsys.readouterr().out


def test_a_fifo_and_symlink_loops_are_failed_rows_and_the_run_goes_on(tmp_path):
    import os

    folder = tmp_path / "d"
    _image(folder, "ok.png")
    os.mkfifo(folder / "pipe.png")  # opening it would wait for a writer for ever
    os.symlink(folder / "b.png", folder / "a.png")
    os.symlink(folder / "a.png", folder / "b.png")
    os.symlink(folder, folder / "again")  # a folder loop: not followed
    out = tmp_path / "out"
    assert main(["run", str(folder), "--out", str(out), "--model", "resnet18", "--workers", "0", "-q"]) == 1
    rows = {Path(r["input"]).name: r for r in _rows(out)}
    assert set(rows) == {"ok.png", "pipe.png", "a.png", "b.png"}
    assert rows["ok.png"]["status"] == "ok" and rows["pipe.png"]["error"] == "not a regular file"
    assert all("symbolic links" in rows[name]["error"] for name in ("a.png", "b.png"))


def test_images_that_fail_for_memory_running_out_say_so_and_exit_3(tmp_path, monkeypatch, capsys):
    # Under an address-space limit every image failed with the allocator's raw text, exit 1.
    from explain.methods import cam_base

    capture = cam_base.BaseCAM.capture

    def no_memory(self, images, *args, **kwargs):
        if images.flatten(2).std(dim=2).max() == 0:  # the blank image of the checks
            return capture(self, images, *args, **kwargs)
        raise RuntimeError(f"[enforce fail at alloc_cpu.cpp:117] . {CPU_ALLOCATION_FAILED}. Error code 12")

    monkeypatch.setattr(cam_base.BaseCAM, "capture", no_memory)
    out = tmp_path / "out"
    assert main(["run", str(REPO / "data" / "images"), "--out", str(out), "--batch-size", "2", "--workers", "0",
                 "-q"]) == 3
    rows = _rows(out)
    assert len(rows) == 4 and {(r["status"], r["error"]) for r in rows} == {
        ("failed", "out of memory: the CPU allocator could not have 784 MiB more")}
    error = capsys.readouterr().err
    assert "gradcam: out of memory: the CPU allocator could not have 784 MiB more" in error
    assert error.splitlines()[-1].startswith("explain: error: 4 output(s) failed for out of memory: this is the "
                                             "device's limit, not the images'")
