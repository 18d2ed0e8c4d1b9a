"""Ctrl-C during a long method: the first one stops the running method after its current
inner batch, keeps what was finished (exit 130), and a rerun finishes the rest."""

import queue
import re
import shutil
import signal
import subprocess
import threading
import time

from explain.cli import main

from test_cli import REPO, check_png, environment, explain_command, noise_image, read_rows, summary_counts


def test_the_first_ctrl_c_stops_the_running_method_after_its_inner_batch(tmp_path, capsys, monkeypatch, heavy_method):
    (tmp_path / "in").mkdir()
    for i in range(3):
        noise_image(i).save(tmp_path / "in" / f"p{i}.png")
    inner_batches = []  # of the photos

    def each_inner_batch(self, images):
        if images.flatten(2).std(dim=2).max() > 0:  # not the blank image of the checks
            inner_batches.append(len(images))
            if len(inner_batches) == 6 + 2:  # the second photo's second inner batch
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(heavy_method, "each_inner_batch", each_inner_batch)
    monkeypatch.chdir(tmp_path)
    command = ["run", "in", "--out", "out", "--method", "gradcam,heavypasses", "-b", "1", "--workers", "0"]
    assert main(command) == 130
    assert len(inner_batches) == 8  # it stopped there, before another inner batch
    captured = capsys.readouterr()
    assert "explain: stopping after the current inner batch (Ctrl-C again to stop now)" in captured.err
    assert "interrupted, run the same command again to finish" in captured.out
    rows = read_rows(tmp_path / "out" / "manifest.jsonl")
    # The second photo's Grad-CAM finished before the stop: it is kept too.
    assert [(row["input"], row["method"], row["status"]) for row in rows] == [
        ("in/p0.png", "gradcam", "ok"), ("in/p0.png", "heavypasses", "ok"), ("in/p1.png", "gradcam", "ok")]
    for row in rows:
        check_png(tmp_path / "out" / row["output"])

    assert main(command) == 0
    assert summary_counts(capsys.readouterr().out) == (3, 3, 0)


def test_ctrl_c_within_a_batch_keeps_the_methods_that_finished_on_it(tmp_path, capsys, monkeypatch, heavy_method):
    # One batch of three photos: Grad-CAM finishes on all of them, then Ctrl-C comes within the
    # heavy method; Grad-CAM's outputs are written, the heavy method and Saliency after it are
    # left for the rerun.
    (tmp_path / "in").mkdir()
    for i in range(3):
        noise_image(i).save(tmp_path / "in" / f"p{i}.png")
    inner_batches = []

    def each_inner_batch(self, images):
        if images.flatten(2).std(dim=2).max() > 0:  # not the blank image of the checks
            inner_batches.append(len(images))
            if len(inner_batches) == 2:
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(heavy_method, "each_inner_batch", each_inner_batch)
    monkeypatch.chdir(tmp_path)
    command = ["run", "in", "--out", "out", "--method", "gradcam,heavypasses,saliency", "-b", "3", "--workers", "0"]
    assert main(command) == 130
    assert inner_batches == [3, 3]
    assert "interrupted, run the same command again to finish. 3 done now" in capsys.readouterr().out
    rows = read_rows(tmp_path / "out" / "manifest.jsonl")
    assert sorted((row["input"], row["method"], row["status"]) for row in rows) == [
        (f"in/p{i}.png", "gradcam", "ok") for i in range(3)]
    for row in rows:
        check_png(tmp_path / "out" / row["output"])

    assert main(command) == 0
    assert summary_counts(capsys.readouterr().out) == (6, 3, 0)


def _lines(stream) -> queue.Queue:
    """The lines of ``stream``, read by a thread as they come."""
    lines: queue.Queue = queue.Queue()

    def read():
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_ctrl_c_stops_score_cam_within_two_seconds_and_a_rerun_finishes(tmp_path, capsys, monkeypatch):
    (tmp_path / "in").mkdir()
    for name in ("chelsea.png", "coffee.png"):
        shutil.copy(REPO / "data" / "images" / name, tmp_path / "in" / name)
    # Score-CAM over the 40 channels of blocks.2: 40 passes of the model an image.
    command = ["run", "in", "--out", "out", "--method", "scorecam", "--layer", "blocks.2", "-b", "1", "--workers", "0"]
    env = dict(environment(), EXPLAIN_PROGRESS_EVERY="0")  # a progress line after every inner batch
    proc = subprocess.Popen(explain_command() + command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines, seen = _lines(proc.stderr), []
        deadline = time.monotonic() + 90
        # Wait for Score-CAM at work on the second image, the first one done.
        while not (seen and re.match(r"explain: 1(\.\d)?/2 images \(.*\); scorecam \d+/\d+ passes$", seen[-1])):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
            try:
                seen.append(lines.get(timeout=0.5).rstrip("\n"))
            except queue.Empty:
                pass
        proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        proc.wait(timeout=30)
        stopped_after = time.monotonic() - signalled
        stdout = proc.stdout.read()
    finally:
        proc.kill()
    assert proc.returncode == 130, "\n".join(seen)
    assert stopped_after < 2.0, stopped_after
    assert "interrupted, run the same command again to finish" in stdout
    rows = read_rows(tmp_path / "out" / "manifest.jsonl")
    assert [(row["input"], row["status"]) for row in rows] == [("in/chelsea.png", "ok")]
    check_png(tmp_path / "out" / rows[0]["output"])

    monkeypatch.chdir(tmp_path)
    assert main(command + ["-q"]) == 0  # the rerun (in this process, which has torch loaded already)
    assert summary_counts(capsys.readouterr().out) == (1, 1, 0)
    check_png(tmp_path / "out" / read_rows(tmp_path / "out" / "manifest.jsonl")[1]["output"])


def test_ctrl_c_before_the_first_batch_exits_130_without_a_traceback(tmp_path, capsys, monkeypatch):
    from explain.batch import preparation

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(preparation, "load_model", interrupted)  # Ctrl-C while the model loads
    assert main(["run", str(REPO / "data" / "images"), "--out", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err.strip() == "explain: interrupted before any image was explained"


def test_sigterm_stops_a_run_as_the_first_ctrl_c_does_with_status_143(tmp_path, capsys, monkeypatch, heavy_method):
    # SIGTERM (docker stop, kill, a scheduler's timeout) ended the run at once: no summary, the
    # page left "in progress", the finished rows only in the last periodic write.
    from explain.viewer import read_page

    (tmp_path / "in").mkdir()
    for i in range(3):
        noise_image(i).save(tmp_path / "in" / f"p{i}.png")
    inner_batches = []

    def each_inner_batch(self, images):
        if images.flatten(2).std(dim=2).max() > 0:  # not the blank image of the checks
            inner_batches.append(len(images))
            if len(inner_batches) == 6 + 2:  # the second photo's second inner batch
                signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(heavy_method, "each_inner_batch", each_inner_batch)
    monkeypatch.chdir(tmp_path)
    handler = signal.getsignal(signal.SIGTERM)
    command = ["run", "in", "--out", "out", "--method", "gradcam,heavypasses", "-b", "1", "--workers", "0"]
    assert main(command) == 143
    assert len(inner_batches) == 8 and signal.getsignal(signal.SIGTERM) == handler
    captured = capsys.readouterr()
    assert "explain: terminated: stopping after" in captured.err
    assert "interrupted, run the same command again to finish" in captured.out
    rows = read_rows(tmp_path / "out" / "manifest.jsonl")
    assert [(row["input"], row["method"], row["status"]) for row in rows] == [
        ("in/p0.png", "gradcam", "ok"), ("in/p0.png", "heavypasses", "ok"), ("in/p1.png", "gradcam", "ok")]
    assert read_page(tmp_path / "out" / "index.html")["run"]["state"] == "interrupted"
    assert main(command) == 0
    assert summary_counts(capsys.readouterr().out) == (3, 3, 0)


def test_sigterm_before_the_first_batch_exits_143_without_a_traceback(tmp_path, capsys, monkeypatch):
    from explain.batch import preparation

    def terminated(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)  # while the model loads

    monkeypatch.setattr(preparation, "load_model", terminated)
    handler = signal.getsignal(signal.SIGTERM)
    assert main(["run", str(REPO / "data" / "images"), "--out", str(tmp_path / "out")]) == 143
    assert capsys.readouterr().err.strip() == "explain: terminated before any image was explained"
    assert signal.getsignal(signal.SIGTERM) == handler
