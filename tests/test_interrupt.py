"""Ctrl-C (and SIGTERM) during a long method: the first one stops the running method at its
next layer, keeps what was finished (exit 130; 143 for SIGTERM), and a rerun finishes the rest."""

import shutil
import signal

import pytest

from conftest import ModelSteps
from explain.cli import main

from test_cli import REPO, check_png, noise_image, read_rows, summary_counts


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
    assert "explain: stopping: the running method stops at its next layer; what is finished is kept (Ctrl-C again " \
           "to stop now)" in captured.err
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


@pytest.mark.parametrize("method, point, rerun, counts", [
    # The reruns take cheaper settings (--layer redoes Grad-CAM too): the folder must resume.
    ("scorecam", ("forward", 600), ["--layer", "blocks.2"], (2, 0, 0)),
    ("sscam", ("forward", 1200), ["--layer", "blocks.2", "-M", "sscam:n_samples=1"], (2, 0, 0)),
    ("rise", ("forward", 600), ["-M", "rise:n_masks=16"], (1, 1, 0)),
    ("ig", ("backward", 300), ["-M", "ig:n_steps=4"], (1, 1, 0)),
])
def test_ctrl_c_in_a_heavy_method_is_answered_within_a_layer_and_a_rerun_finishes(
        tmp_path, capsys, monkeypatch, method, point, rerun, counts):
    # Default settings on the bundled model, Ctrl-C at a layer deep in the method's passes: the
    # stop was answered after the inner batch (7.6-9.4 s on a loaded 2-core machine). Now not
    # one more layer runs; what finished is kept (exit 130), and the folder resumes cleanly.
    from explain.viewer import read_page

    (tmp_path / "in").mkdir()
    shutil.copy(REPO / "data" / "images" / "chelsea.png", tmp_path / "in" / "chelsea.png")
    monkeypatch.chdir(tmp_path)
    command = ["run", "in", "--out", "out", "--method", f"gradcam,{method}", "--workers", "0"]
    with ModelSteps(*point, signal=signal.SIGINT) as steps:
        assert main(command) == 130
    assert steps.asked and steps.after == 0, steps.steps
    captured = capsys.readouterr()
    assert "explain: stopping: the running method stops at its next layer" in captured.err
    assert "interrupted, run the same command again to finish" in captured.out
    rows = read_rows(tmp_path / "out" / "manifest.jsonl")
    assert [(row["input"], row["method"], row["status"]) for row in rows] == [("in/chelsea.png", "gradcam", "ok")]
    check_png(tmp_path / "out" / rows[0]["output"])
    assert read_page(tmp_path / "out" / "index.html")["run"]["state"] == "interrupted"
    assert not [p for p in (tmp_path / "out").rglob("*") if p.name.endswith(".explain-tmp")]

    assert main(command + rerun + ["-q"]) == 0
    assert summary_counts(capsys.readouterr().out) == counts
    for row in read_rows(tmp_path / "out" / "manifest.jsonl"):
        assert row["status"] in ("ok", "skipped")
        check_png(tmp_path / "out" / row["output"])


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
    assert "explain: terminated: stopping: the running method stops at its next layer" in captured.err
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
