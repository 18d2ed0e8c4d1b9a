"""``explain run --engine ray --address`` on a real Ray cluster on this machine
(:class:`ray.cluster_utils.Cluster`: a head and two worker nodes, each with its own raylet and
object store), with real parts lost mid-run: an explaining actor's process, a worker node, and
the driver. Every image ends ok in the manifest, once, and a rerun completes what a killed
driver left.

The model is a tiny pickled module (``slow_net`` below, written beside the cluster) whose
forward sleeps in the explaining actors, so that a run lasts long enough to be hit mid-way, and
notes which process and node explain, so that the test kills a process that is explaining."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch

from explain.batch.ray_driver import PLAN_PREFIX
from explain.cli import main

from test_cli import check_png, environment, explain_command, noise_image, read_rows, summary_counts

# One Ray at a time on a pytest-xdist worker (make test runs --dist loadgroup), as in
# test_ray_engine.py; slow (a cluster and Ray workers that import torch), but run by CI.
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow]

SLOW_NET = '''
"""A tiny classifier whose forward, in an explaining actor, notes the process and node that
run it (a file named by the pid, holding the node id) and sleeps."""

import os
import time

import torch
from torch import nn


class SlowNet(nn.Sequential):
    def __init__(self, seconds, notes):
        super().__init__(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
        self.seconds, self.notes = seconds, notes

    def forward(self, x):
        import ray

        context = ray.get_runtime_context() if ray.is_initialized() else None
        if torch.is_grad_enabled() and context is not None and context.get_actor_id():
            with open(os.path.join(self.notes, str(os.getpid())), "w") as note:
                note.write(context.get_node_id())
            time.sleep(self.seconds)
        return super().forward(x)
'''
IMAGES = 40
NODE_CPUS = 3
RUN = ["run", "in", "--out", "out", "--engine", "ray", "--model", "slow.pt", "--trust-model-file", "--batch-size", "2"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head without CPUs (the actors go to the worker nodes, which can be lost) and two worker
    nodes of 3 CPUs: an actor on each, reserving 2, and a CPU for the decode tasks (on nodes of
    2, an actor restarted beside another could take that CPU and hang the run). The head
    declares a node dead after 3 missed health checks a second apart (Ray's default: 5, 3 s
    apart). The cluster has its own temporary folder, so that ``ray.init()`` elsewhere on this
    machine does not find it (Ray notes there the last cluster started), with a short path for
    Ray's sockets."""
    from ray.cluster_utils import Cluster

    code = tmp_path_factory.mktemp("slow_net")
    (code / "slow_net.py").write_text(SLOW_NET)
    ray_temp = tempfile.mkdtemp(prefix="rayf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", ray_temp)
        # The nodes' workers and the drivers import slow_net. Ray's memory monitor is off: other
        # jobs on this machine may fill its memory for a while, and it would kill our workers.
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(code), environment()["PYTHONPATH"]])))
        patch.setenv("RAY_memory_monitor_refresh_ms", "0")
        patch.syspath_prepend(str(code))
        health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
        cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False,
                                                                    _system_config=health))
        try:
            for _ in range(2):
                cluster.add_node(num_cpus=NODE_CPUS)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            cluster.shutdown()
            shutil.rmtree(ray_temp, ignore_errors=True)


def _make_run(folder: Path) -> Path:
    """Images in folder/in, the slow model (0.3 s a batch) and its notes folder."""
    from slow_net import SlowNet

    (folder / "in").mkdir()
    for i in range(IMAGES):
        noise_image(i).save(folder / "in" / f"img{i:02d}.png")
    notes = folder / "notes"
    notes.mkdir()
    torch.save(SlowNet(0.3, str(notes)), folder / "slow.pt")
    return notes


def _start(folder: Path, cluster) -> subprocess.Popen:
    """The driver, in its own process, its output in folder/driver.log."""
    with open(folder / "driver.log", "w") as log:
        return subprocess.Popen(explain_command() + RUN + ["--address", cluster.address], cwd=folder,
                                env=environment(), stdout=log, stderr=subprocess.STDOUT)


def _ok_rows(manifest: Path) -> int:
    """Ok rows in a manifest being written (a last line may be cut short)."""
    if not manifest.is_file():
        return 0
    return sum(line.endswith("\n") and '"status": "ok"' in line for line in manifest.open(encoding="utf-8"))


def _wait_for_rows(manifest: Path, driver: subprocess.Popen, count: int) -> None:
    """Until ``count`` rows are in the manifest: at most 5 minutes, as a loaded 2-core machine
    with a node lost by the test before may take to start the actors again."""
    deadline = time.monotonic() + 300
    log = manifest.parent.parent / "driver.log"
    while _ok_rows(manifest) < count:
        assert driver.poll() is None, "the run ended before it could be hit:\n" + log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"fewer than {count} rows reached the manifest:\n" + log.read_text()[-3000:]
        time.sleep(0.05)


def _explaining(notes: Path) -> dict[int, str]:
    """The live processes of explaining actors that have run the model, with their nodes."""
    found = {}
    for note in notes.iterdir():
        if note.name.isdigit():
            try:
                os.kill(int(note.name), 0)
            except ProcessLookupError:
                continue
            found[int(note.name)] = note.read_text()
    return found


def _one_row_per_image(folder: Path) -> dict[str, dict]:
    """The manifest, parsed strictly: one row per image (one method, one target), each ok row's
    overlay on disk."""
    rows = read_rows(folder / "out" / "manifest.jsonl")
    by_input = {row["input"]: row for row in rows}
    assert len(by_input) == len(rows), "an image has two rows"
    assert set(by_input) == {f"in/img{i:02d}.png" for i in range(IMAGES)}, "an image has no row"
    for row in rows:
        assert (row["method"], row["target"]) == ("gradcam", "top1")
        if row["status"] in ("ok", "skipped"):
            check_png(folder / "out" / row["output"])
    return by_input


def test_an_actor_and_a_node_lost_mid_run_cost_no_image(cluster, tmp_path, monkeypatch, capsys):
    notes = _make_run(tmp_path)
    manifest = tmp_path / "out" / "manifest.jsonl"
    driver = _start(tmp_path, cluster)
    try:
        _wait_for_rows(manifest, driver, 4)
        killed = next(iter(_explaining(notes)))
        os.kill(killed, signal.SIGKILL)  # an explaining actor's process
        _wait_for_rows(manifest, driver, _ok_rows(manifest) + 4)
        nodes = {node.node_id: node for node in cluster.worker_nodes}
        lost = next(node for pid, node in _explaining(notes).items() if pid != killed and node in nodes)
        # A worker node with an explaining actor, gone at once (its processes killed), and its
        # replacement, as an autoscaler brings one.
        cluster.remove_node(nodes[lost], allow_graceful=False)
        assert driver.poll() is None and _ok_rows(manifest) < IMAGES
        cluster.add_node(num_cpus=NODE_CPUS)
        assert driver.wait(timeout=180) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    # Ray restarted the actors and tried their batches again: every image made, once.
    assert {row["status"] for row in _one_row_per_image(tmp_path).values()} == {"ok"}
    assert len(list(notes.iterdir())) >= 3, "no actor was restarted"

    monkeypatch.chdir(tmp_path)
    assert main(RUN + ["--address", cluster.address, "-q"]) == 0  # a rerun finds every output made
    assert summary_counts(capsys.readouterr().out) == (0, IMAGES, 0)


def test_a_killed_driver_leaves_a_manifest_the_rerun_completes(cluster, tmp_path, monkeypatch, capsys):
    _make_run(tmp_path)
    manifest = tmp_path / "out" / "manifest.jsonl"
    driver = _start(tmp_path, cluster)
    try:
        _wait_for_rows(manifest, driver, 4)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    with open(manifest, "a", encoding="utf-8") as file:
        file.write('{"input": "in/img09.png", "method": "gradc')  # a row cut short by the kill
    lines = manifest.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [json.loads(line) for line in lines if line.endswith("\n")]
    assert 4 <= sum(row["status"] == "ok" for row in kept) < IMAGES

    time.sleep(2)  # the killed driver's actors go too
    overlays = len(list((tmp_path / "out").rglob("*.png")))

    monkeypatch.chdir(tmp_path)
    assert main(RUN + ["--address", cluster.address, "-q"]) == 0
    # The rows the killed driver wrote whole are kept, and those the actors kept for the
    # batches whose rows had not reached it; the rest is made, each row once. At most the
    # batches in flight (2 actors x 2 calls x 2 images) are made again.
    done, skipped, failed = summary_counts(capsys.readouterr().out)
    assert (done + skipped, failed) == (IMAGES, 0) and skipped >= len(kept)
    assert skipped >= overlays - 8
    assert {row["status"] for row in _one_row_per_image(tmp_path).values()} <= {"ok", "skipped"}
    assert not list((tmp_path / "out").glob(PLAN_PREFIX + "*")) and not list((tmp_path / "out").rglob(".*tmp"))


def test_sigterm_of_the_driver_keeps_every_finished_row_without_ray_s_native_stack(cluster, tmp_path, monkeypatch,
                                                                                   capsys):
    # SIGTERM (as `kill`, a scheduler or `docker stop` send it) of a driver in its own process,
    # with Ray's own signal handlers installed: it stops as Ctrl-C does (exit 143), every
    # overlay on disk has its row, and the rerun writes none of them again.
    _make_run(tmp_path)
    manifest = tmp_path / "out" / "manifest.jsonl"
    driver = _start(tmp_path, cluster)
    try:
        _wait_for_rows(manifest, driver, 4)
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=120) == 143, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    log = (tmp_path / "driver.log").read_text()
    assert "explain: terminated: stopping: the actors finish the batches they hold" in log
    assert "SIGTERM received" not in log and "*** " not in log, log[-3000:]  # Ray's native stack
    overlays = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").rglob("*.png")
                if p.parent.name != "index-data"}
    rows = {Path(row["output"]).name for row in read_rows(manifest)}
    assert rows == set(overlays) and 4 <= len(rows) < IMAGES

    monkeypatch.chdir(tmp_path)
    assert main(RUN + ["--address", cluster.address, "-q"]) == 0
    assert summary_counts(capsys.readouterr().out) == (IMAGES - len(rows), len(rows), 0)
    assert all((tmp_path / "out" / name).stat().st_mtime_ns == mtime for name, mtime in overlays.items())
    _one_row_per_image(tmp_path)
