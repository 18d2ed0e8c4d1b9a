"""The manifest's one writing rule (``explain.batch.manifest_file``), which both engines follow:
compacted at a run's start to the finished outputs (each once), every row appended whole as it
is recorded, compacted once more in the plan's order when a local run completes."""

import json
from pathlib import Path

import explain.batch.manifest_file
from explain.batch.local_run import LocalRun
from explain.batch.manifest_file import ManifestFile, RowCounts
from explain.batch.storage import OutputFolder
from explain.cli import main
from explain.report import iter_json_records

from test_cli import noise_image, read_rows, summary_counts


def _row(input: str, status: str = "ok", method: str = "gradcam", **values) -> dict:
    return dict(input=input, method=method, target="top1", status=status, **values)


def test_compaction_keeps_each_key_once_and_appends_go_on_in_the_new_file(tmp_path):
    manifest = ManifestFile(OutputFolder(tmp_path))
    assert manifest.compact([_row("a.png"), _row("a.png", "failed"), _row("b.png")]) == 2
    manifest.append([_row("c.png")])
    # The file is replaced, not rewritten in place: the appends after it must reach the new one.
    assert manifest.compact(iter_json_records(manifest.path.read_text().splitlines())) == 3
    manifest.append([_row("d.png"), _row("e.png", "failed", error="cannot read it")])
    manifest.close()
    rows = read_rows(manifest.path)
    assert [(row["input"], row["status"]) for row in rows] == [
        ("a.png", "ok"), ("b.png", "ok"), ("c.png", "ok"), ("d.png", "ok"), ("e.png", "failed")]
    assert not [path for path in tmp_path.iterdir() if path.name != "manifest.jsonl"], "a temporary file left"


def test_a_last_line_cut_short_by_a_kill_is_skipped_by_readers_and_removed_by_the_next_start(tmp_path):
    manifest = ManifestFile(OutputFolder(tmp_path))
    manifest.append([_row("a.png"), _row("b.png")])
    manifest.close()
    with open(manifest.path, "a", encoding="utf-8") as file:  # what a kill in the middle of a write leaves
        file.write(json.dumps(_row("c.png"))[:25])
    earlier = list(iter_json_records(manifest.path.read_text().splitlines()))
    assert [row["input"] for row in earlier] == ["a.png", "b.png"]
    manifest.compact(earlier)
    manifest.close()
    assert [row["input"] for row in read_rows(manifest.path)] == ["a.png", "b.png"]


def test_row_counts_count_statuses_the_time_of_rows_made_and_memory_failures():
    counts = RowCounts()
    for row in (_row("a", seconds=0.25), _row("b", "skipped", seconds=9.0), _row("c", "failed", seconds=0.5,
                error="out of memory: the CPU allocator could not have 1 MiB more"), _row("d", "failed", error="x")):
        counts.count(row)
    assert counts.stats == {"ok": 1, "skipped": 1, "failed": 2}
    assert counts.seconds == {"gradcam": 0.75}  # a skipped row's time is an earlier run's
    assert counts.out_of_memory == 1


def test_a_local_run_appends_each_row_as_recorded_and_compacts_only_at_its_start_and_end(tmp_path, monkeypatch,
                                                                                          capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(6):
        noise_image(i, size=(32, 32)).save(inputs / f"img{i}.png")
    (inputs / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "out"
    compactions, seen = [], []
    real_compact, real_between = ManifestFile.compact, LocalRun.between_batches

    def compact(self, rows):
        compactions.append(real_compact(self, rows))
        return compactions[-1]

    def between_batches(self):  # after each batch, the manifest holds every row recorded so far, each once
        self.drain()
        lines = (out / "manifest.jsonl").read_text().splitlines()
        seen.append(len(lines))
        assert len(lines) == len(self.run_plan.recorded_rows()) == len({line for line in lines})
        real_between(self)

    monkeypatch.setattr(ManifestFile, "compact", compact)
    monkeypatch.setattr(LocalRun, "between_batches", between_batches)
    missing = tmp_path / "missing.png"  # fails before decoding: recorded before the start
    listed = tmp_path / "list.txt"
    listed.write_text("".join(f"{path}\n" for path in [*sorted(inputs.iterdir()), missing]))
    command = ["run", f"@{listed}", "--out", str(out), "--batch-size", "2", "--workers", "0", "-q"]
    assert main(command) == 1  # the broken file and the missing one fail
    assert compactions == [1, 8]  # the start (the missing input's row), the end (all, in the plan's order)
    assert seen == [3, 5, 7, 8]  # rows appended batch by batch, not rewritten now and then
    rows = read_rows(out / "manifest.jsonl")
    assert [Path(row["input"]).name for row in rows] == ["broken.png"] + [f"img{i}.png" for i in range(6)] + [
        "missing.png"]

    # A rerun: the finished outputs kept as skipped by the start's compaction, the failed one redone.
    (inputs / "broken.png").unlink()
    noise_image(9, size=(32, 32)).save(inputs / "broken.png")
    compactions.clear()
    capsys.readouterr()
    monkeypatch.setattr(LocalRun, "between_batches", real_between)
    noise_image(8, size=(32, 32)).save(missing)
    assert main(command) == 0
    assert summary_counts(capsys.readouterr().out) == (2, 6, 0)
    assert compactions == [6, 8]
    rows = read_rows(out / "manifest.jsonl")
    assert [(Path(row["input"]).name, row["status"]) for row in rows] == [("broken.png", "ok")] + [
        (f"img{i}.png", "skipped") for i in range(6)] + [("missing.png", "ok")]


def test_both_engines_write_the_manifest_through_the_one_writer():
    import explain.batch.local_run
    import explain.batch.ray_driver

    assert explain.batch.local_run.ManifestFile is explain.batch.ray_driver.ManifestFile is ManifestFile
    assert not hasattr(explain.batch.ray_driver, "write_manifest") and not hasattr(explain.batch.local_run,
                                                                                   "write_manifest")
    assert explain.batch.manifest_file.PUBLISH_SECONDS > 0


def test_a_rerun_with_labels_marks_the_rows_it_keeps_as_the_ray_driver_does(tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(3):
        noise_image(i, size=(32, 32)).save(inputs / f"img{i}.png")
    labels = tmp_path / "labels.csv"
    command = ["run", str(inputs), "--out", str(tmp_path / "out"), "--workers", "0", "-q", "--labels", str(labels)]
    labels.write_text("path,label\n" + "".join(f"in/img{i}.png,7\n" for i in range(3)))
    assert main(command) == 0
    capsys.readouterr()
    labels.write_text("path,label\n" + "".join(f"in/img{i}.png,{i}\n" for i in range(3)))  # corrected
    assert main(command) == 0
    assert summary_counts(capsys.readouterr().out) == (0, 3, 0)
    rows = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert [(row["status"], row["label_id"], row["correct"] == (row["predicted_id"] == i))
            for i, row in enumerate(rows)] == [("skipped", i, True) for i in range(3)]
