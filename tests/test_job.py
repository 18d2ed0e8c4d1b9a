"""The job interface of the batch layer (explain/batch/job.py): a third dataset command written
against :class:`DatasetJob` alone (here: each image's mean colour, resumable) gets the loader
loop, resume, the summary line, a full disk's stop and the exit statuses from
:func:`run_job`, without any engine's code."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from PIL import Image
from torch import nn
from torchvision import transforms

from explain.batch.decoding import ModelInputs
from explain.batch.inputs import collect_inputs
from explain.batch import ray_jobs
from explain.batch.job import DatasetJob, GroupWorker, run_job
from explain.batch.loop import LoopEnd
from explain.batch.options import ModelOptions
from explain.batch.outcome import EXIT_FAILED, EXIT_OK, EXIT_OUTPUT_DEVICE
from explain.batch.storage import OutputDeviceError
from explain.models import LoadedModel


class MeanColours(DatasetJob):
    """A dataset job of its own: each image's mean colour, one line per image in colours.csv;
    a rerun computes only the images not there yet."""

    def __init__(self, folder: Path, out: Path, refuse_after: int | None = None):
        preprocess = transforms.Compose(
            [transforms.Resize((16, 16)), transforms.ToTensor(), transforms.Normalize([0.0] * 3, [1.0] * 3)]
        )
        self.loaded = LoadedModel(nn.Identity(), preprocess, [], torch.device("cpu"), torch.zeros(1, 3, 16, 16))
        self.options = ModelOptions(inputs=[str(folder)], out=out, workers=0, batch_size=2, quiet=True)
        self.sources, self.costs = collect_inputs([str(folder)], out), {}
        self.inputs = ModelInputs(preprocess)
        self.path, self.refuse_after = out / "colours.csv", refuse_after
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.finished: tuple | None = None

    def plan(self) -> dict:
        done = {line.split(",")[0] for line in self.path.read_text().splitlines()} if self.path.exists() else set()
        self.skipped = sum(source.input in done for source in self.sources)
        return {i: "mean" for i, source in enumerate(self.sources) if source.input not in done}

    def failed_input(self, index: int, error: str) -> None:
        self.errors.append(f"{self.sources[index].input}: {error}")

    def group(self, indices: list[int], images) -> None:
        if self.refuse_after is not None and len(self.lines) >= self.refuse_after:
            raise OutputDeviceError("cannot write to out: no space left on device")
        for index, image in zip(indices, images.float().mean(dim=(2, 3)), strict=True):
            self.lines.append(f"{self.sources[index].input},{','.join(f'{v:.1f}' for v in image.tolist())}\n")

    def finish(self, end: LoopEnd, completed: bool, summary: str) -> None:
        with open(self.path, "a") as file:
            file.writelines(self.lines)
        self.finished = (end.images, completed)

    @property
    def failed(self) -> int:
        return len(self.errors)

    def summary(self, end: LoopEnd) -> str:
        return f"explain: {len(self.lines)} done now, {self.skipped} skipped, {self.failed} failed"


def _images(folder: Path, count: int) -> None:
    folder.mkdir()
    for i in range(count):
        Image.new("RGB", (20, 20), (10 * i, 0, 255)).save(folder / f"img{i}.png")


def test_a_third_job_runs_resumes_and_fails_as_the_others(tmp_path, capsys):
    _images(tmp_path / "in", 5)
    (tmp_path / "out").mkdir()
    job = MeanColours(tmp_path / "in", tmp_path / "out")
    assert run_job(job) == EXIT_OK
    assert job.finished == (5, True)
    lines = (tmp_path / "out" / "colours.csv").read_text().splitlines()
    assert [line.split(",")[1:] for line in lines][:2] == [["0.0", "0.0", "255.0"], ["10.0", "0.0", "255.0"]]
    assert capsys.readouterr().out.strip() == "explain: 5 done now, 0 skipped, 0 failed"

    # resume: nothing left; a broken image fails (exit 1) and the others stay done
    (tmp_path / "in" / "broken.png").write_bytes(b"not a png")
    again = MeanColours(tmp_path / "in", tmp_path / "out")
    assert run_job(again) == EXIT_FAILED
    assert again.lines == [] and again.skipped == 5 and len(again.errors) == 1
    assert "broken.png" in again.errors[0]
    assert capsys.readouterr().out.strip() == "explain: 0 done now, 5 skipped, 1 failed"


def test_a_full_disk_stops_the_job_and_keeps_what_it_did(tmp_path, capsys):
    _images(tmp_path / "in", 6)
    (tmp_path / "out").mkdir()
    job = MeanColours(tmp_path / "in", tmp_path / "out", refuse_after=2)
    assert run_job(job) == EXIT_OUTPUT_DEVICE
    assert job.finished == (0, False)  # the loop never returned: no image counted, not complete
    assert len((tmp_path / "out" / "colours.csv").read_text().splitlines()) == 2  # the first batch is kept
    captured = capsys.readouterr()
    assert "no space left on device" in captured.err
    assert captured.out.startswith("explain: stopped: cannot write to out: no space left on device")


class Recorded(DatasetJob):
    """A job whose group work is a worker, recording what an engine's loop hands it."""

    def __init__(self):
        self.options = ModelOptions(quiet=True)
        self.failures: list[tuple[int, str]] = []
        self.taken: list[tuple[list[int], str]] = []

    def failed_input(self, index: int, error: str) -> None:
        self.failures.append((index, error))

    def worker(self) -> GroupWorker:
        return GroupWorker()

    def take(self, indices: list[int], result) -> None:
        self.taken.append((indices, result))


def test_rays_loop_hands_results_to_the_job_fails_lost_images_once_and_stops_on_sigterm(monkeypatch):
    """ray_jobs.ray_loop without Ray: the stream of worked batches replaced by plain items
    (each: its failures, and its groups' results)."""
    batches = [([(3, "not an image")], [([0, 1], "result of 0, 1")]), ([], [([2], "result of 2")])]
    monkeypatch.setattr(ray_jobs, "worked_batches", lambda ray, job, work: iter(batches))
    job = Recorded()
    end = ray_jobs.ray_loop(None, job, [0, 1, 2, 3, 4, 5])
    assert job.taken == [([0, 1], "result of 0, 1"), ([2], "result of 2")]
    assert job.failures == [(3, "not an image"), (4, ray_jobs.LOST), (5, ray_jobs.LOST)]  # once each
    assert end.images == 6 and not end.interrupted and not end.terminated

    class TerminatedAtFirst(Recorded):
        def take(self, indices: list[int], result) -> None:
            super().take(indices, result)
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's StopFlag takes it

    job = TerminatedAtFirst()
    end = ray_jobs.ray_loop(None, job, [0, 1, 2, 3, 4, 5])
    assert job.taken == [([0, 1], "result of 0, 1")] and job.failures == [(3, "not an image")]  # nothing failed as lost
    assert end.interrupted and end.terminated and not end.forced and end.images == 3
