"""``explain run`` on an output folder whose device refuses writes: a small tmpfs that fills up
during the run (the local engine and the Ray engine), a read-only mount, a folder that cannot be
made. A full disk stops the run with exit status 4 and a message that names the folder and the
error; the manifest keeps whole lines whose files are complete, and a rerun with room finishes.

The tmpfs mounts need root (or CAP_SYS_ADMIN); where mount is refused the tests that need one
are skipped, saying so."""

import errno
import logging
import os
import subprocess
from pathlib import Path

import pytest

import explain.batch.commands
import explain.batch.manifest_file
import explain.batch.ray_cluster
import explain.batch.ray_driver
from explain.batch.outcome import EXIT_OUTPUT_DEVICE, EXIT_USAGE
from explain.batch.storage import OutputDeviceError, append_whole, device_errors
from explain.cli import main

from test_cli import check_png, noise_image, read_rows, summary_counts

IMAGES = 12


def _mount(folder: Path, options: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); these tests need root")


def _unmount(folder: Path) -> None:
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(folder)], check=True)  # still busy: detach it now, free it when idle


@pytest.fixture
def small_disk(tmp_path):
    """A 600 KiB tmpfs: room for 7 of the 12 overlays below (75 KB each)."""
    disk = tmp_path / "disk"
    _mount(disk, "size=600k")
    try:
        yield disk
    finally:
        os.chdir(tmp_path)
        _unmount(disk)


def _remount(disk: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def _fill(disk: Path) -> Path:
    """Fill what is left of the disk with a file; returns it."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as file:
        try:
            while True:
                file.write(b"\0" * 65536)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    return filler


def _inputs(tmp_path: Path) -> Path:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(IMAGES):
        noise_image(i).save(inputs / f"img{i:02d}.png")
    return inputs


def _check_consistent(out: Path, kept_rows: bool = False) -> list[dict]:
    """The manifest's lines are whole rows, one per output, each naming a complete PNG; every
    PNG in the folder is complete; no temporary file is left; no Ray plan folder is left but,
    after a Ray run stopped by the full disk (``kept_rows``), the rows its actors kept (their
    files written), which the next run reads. Returns the rows."""
    rows = read_rows(out / "manifest.jsonl") if (out / "manifest.jsonl").exists() else []
    assert len({(row["input"], row["method"], row["target"]) for row in rows}) == len(rows), "a row twice"
    for row in rows:
        assert row["status"] in ("ok", "skipped"), row
        check_png(out / row["output"])
    for png in out.rglob("*.png"):
        check_png(png)
    assert not [path for path in out.rglob(".*") if path.is_file()], "temporary files left"
    plans = [path for path in out.glob(".explain-ray-plan-*") if not (kept_rows and path.name.endswith("-rows"))]
    assert not plans, "a plan folder left"
    return rows


def _run(out: Path, *options: str) -> list[str]:
    return ["run", "in", "--out", str(out), "--method", "gradcam", "-q", *options]


def test_a_disk_that_fills_up_stops_the_run_and_a_rerun_with_room_finishes(small_disk, tmp_path, capsys):
    _inputs(tmp_path)
    os.chdir(tmp_path)
    out = small_disk / "out"
    assert main(_run(out, "--workers", "0", "--batch-size", "4")) == EXIT_OUTPUT_DEVICE
    stdout, stderr = capsys.readouterr()
    assert f"explain: error: cannot write to {out}: no space left on device" in stderr
    assert "Traceback" not in stderr and stdout.startswith(f"explain: stopped: cannot write to {out}")
    kept = _check_consistent(out)
    assert 0 < len(kept) < IMAGES and len(list(out.rglob("*.png"))) < IMAGES

    _remount(small_disk, "20m")
    assert main(_run(out, "--workers", "0")) == 0
    assert summary_counts(capsys.readouterr().out) == (IMAGES - len(kept), len(kept), 0)
    assert len(_check_consistent(out)) == IMAGES


def test_a_disk_that_fills_up_during_a_manifest_write_keeps_the_last_whole_manifest(small_disk, tmp_path, capsys,
                                                                                    monkeypatch):
    _inputs(tmp_path)
    os.chdir(tmp_path)
    out = small_disk / "out"
    _remount(small_disk, "20m")
    real, calls, before = explain.batch.manifest_file.append_whole, [], []

    def filling_from_the_third(file, data):  # rows appended, then the disk is full
        # Once, before rows that need a new page of the tmpfs (the file's last page has room
        # for what fits in it, full disk or not).
        calls.append(len(data))
        room = -os.fstat(file.fileno()).st_size % os.sysconf("SC_PAGE_SIZE")
        if len(calls) >= 3 and not before and len(data) > room:
            before.append((out / "manifest.jsonl").read_bytes())
            _fill(small_disk)  # and kept full: the overlays that fail give their space back
        real(file, data)

    monkeypatch.setattr(explain.batch.manifest_file, "append_whole", filling_from_the_third)
    assert main(_run(out, "--workers", "0", "--batch-size", "4")) == EXIT_OUTPUT_DEVICE
    assert f"cannot write to {out}: no space left on device" in capsys.readouterr().err
    assert (out / "manifest.jsonl").read_bytes() == before[0]  # the last whole version, not a torn one
    kept = _check_consistent(out)
    assert len(kept) < IMAGES

    monkeypatch.undo()
    (small_disk / "filler").unlink()
    assert main(_run(out, "--workers", "0")) == 0
    ok, skipped, failed = summary_counts(capsys.readouterr().out)
    assert (ok + skipped, failed) == (IMAGES, 0) and skipped >= len(kept)
    assert len(_check_consistent(out)) == IMAGES


def test_an_append_to_a_full_disk_leaves_no_torn_line(small_disk):
    manifest = small_disk / "manifest.jsonl"
    manifest.write_text('{"row": 1}\n')
    _fill(small_disk)
    with open(manifest, "ab", buffering=0) as file, pytest.raises(OutputDeviceError) as raised:
        with device_errors(small_disk):
            append_whole(file, b'{"row": 2}\n' * 20_000)
    assert str(raised.value) == f"cannot write to {small_disk}: no space left on device"
    assert manifest.read_text() == '{"row": 1}\n'


def test_an_out_that_cannot_be_made_or_written_is_a_usage_error_before_any_work(tmp_path, capsys, monkeypatch):
    noise_image(0).save(tmp_path / "a.png")
    (tmp_path / "a_file").write_text("")
    os.chdir(tmp_path)

    def no_work(*args, **kwargs):
        raise AssertionError("the run started before --out was checked")

    monkeypatch.setattr(explain.batch.commands, "prepare_run", no_work)
    monkeypatch.setattr(explain.batch.ray_cluster, "connect", no_work)
    read_only = tmp_path / "read_only"
    _mount(read_only, "size=64k,ro")
    try:
        for out, message in (("a_file/out", "cannot create the folder: not a directory"),
                             ("/proc/explain/out", "cannot create the folder: no such file or directory"),
                             ("read_only/out", "cannot create the folder: read-only file system"),
                             ("read_only", "cannot write there: read-only file system")):
            for engine in ("local", "ray"):
                assert main(["run", "a.png", "--out", out, "--engine", engine]) == EXIT_USAGE, (out, engine)
                stderr = capsys.readouterr().err
                assert stderr.startswith(f"explain: error: --out {out}: {message}"), stderr
    finally:
        _unmount(read_only)
    assert not (tmp_path / "a_file").read_text()


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_the_ray_engine_stops_on_a_full_disk_and_a_rerun_with_room_finishes(local_ray, small_disk, tmp_path, capsys,
                                                                           monkeypatch):
    _inputs(tmp_path)
    os.chdir(tmp_path)
    out = small_disk / "out"
    # The actors' overlays fill the disk.
    assert main(_run(out, "--engine", "ray", "--batch-size", "2")) == EXIT_OUTPUT_DEVICE
    stdout, stderr = capsys.readouterr()
    assert f"explain: error: cannot write to {out}: no space left on device" in stderr
    assert f"\nexplain: stopped: cannot write to {out}" in "\n" + stdout  # Ray's workers print there too
    kept = _check_consistent(out, kept_rows=True)
    assert 0 < len(kept) < IMAGES

    # The driver's own append to the manifest meets a full disk.
    _remount(small_disk, "20m")
    real, appended = explain.batch.manifest_file.append_whole, []

    def filling(file, data):
        # Once, before rows that need a new page of the tmpfs (the file's last page has room
        # for what fits in it, full disk or not).
        room = -os.fstat(file.fileno()).st_size % os.sysconf("SC_PAGE_SIZE")
        if not appended and len(data) > room:
            appended.append(Path(out / "manifest.jsonl").read_bytes())
            _fill(small_disk)
        real(file, data)

    monkeypatch.setattr(explain.batch.manifest_file, "append_whole", filling)
    assert main(_run(out, "--engine", "ray")) == EXIT_OUTPUT_DEVICE
    assert f"cannot write to {out}: no space left on device" in capsys.readouterr().err
    assert len(appended) == 1 and (out / "manifest.jsonl").read_bytes() == appended[0]
    kept = _check_consistent(out, kept_rows=True)

    monkeypatch.undo()
    (small_disk / "filler").unlink()
    assert main(_run(out, "--engine", "ray")) == 0
    ok, skipped, failed = summary_counts(capsys.readouterr().out)
    assert (ok + skipped, failed) == (IMAGES, 0) and skipped >= len(kept)
    assert len(_check_consistent(out)) == IMAGES


def test_explain_evaluate_stops_on_a_full_disk_and_a_rerun_with_room_finishes(small_disk, tmp_path, capsys):
    _inputs(tmp_path)
    os.chdir(tmp_path)
    out = small_disk / "scores"
    evaluate = ["evaluate", "in", "--out", str(out), "--method", "gradcam", "--metrics", "sparseness",
                "--workers", "0", "--batch-size", "4", "-q"]
    out.mkdir()
    filler = _fill(small_disk)
    assert main(evaluate) == EXIT_OUTPUT_DEVICE
    stdout, stderr = capsys.readouterr()
    assert f"explain: error: cannot write to {out}: no space left on device" in stderr and "Traceback" not in stderr
    assert f"explain: stopped: cannot write to {out}" in stdout
    # Room for the scores but not for the plots: the scores appended are kept.
    os.truncate(filler, filler.stat().st_size - 16 * 1024)
    assert main(evaluate) == EXIT_OUTPUT_DEVICE
    stdout, stderr = capsys.readouterr()
    assert "no space left on device" in stderr and "Traceback" not in stderr
    kept = len((out / "scores.csv").read_text().splitlines()) - 1
    filler.unlink()
    assert main(evaluate) == 0
    assert f"{IMAGES - kept} scored now, {kept} skipped" in capsys.readouterr().out
    assert main(evaluate) == 0 and "0 scored now" in capsys.readouterr().out
