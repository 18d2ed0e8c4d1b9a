"""``explain run --engine ray --out s3://...`` against a real S3 API: moto's server on a free
port of this machine (module-scoped), reached by pyarrow's S3 filesystem through the URI's
``endpoint_override`` or the ``AWS_ENDPOINT_URL`` variable. The outputs, manifest and index land
in the bucket; a killed driver's run is finished by the next; a second run on the same URI is
refused by the lease object that stands in for a lock there."""

import json
import logging
import re
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from io import BytesIO
from urllib.parse import unquote

import pytest
from moto.server import ThreadedMotoServer
from PIL import Image
from pyarrow import fs

import explain.batch.guards
import explain.batch.ray_cluster
import explain.batch.ray_driver
from explain.batch.guards import LEASE, leased_run
from explain.batch.outcome import EXIT_USAGE
from explain.batch.ray_driver import PLAN_PREFIX
from explain.batch.storage import OutputFolder
from explain.cli import main
from explain.errors import UsageError
from explain.viewer import DATA_FOLDER, read_data_file

from test_cli import environment, noise_image, summary_counts

BUCKET = "explain-tests"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # Ray's runs stay on one xdist worker


class Store:
    """The S3 server of the tests: URIs of folders in its bucket, and what they hold."""

    def __init__(self, port: int):
        self.endpoint = f"127.0.0.1:{port}"
        self.filesystem = fs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", allow_bucket_creation=True)

    def uri(self, folder: str) -> str:
        return f"s3://{BUCKET}/{folder}?endpoint_override={self.endpoint}&scheme=http"

    def files(self, folder: str) -> dict[str, int]:
        """The files under ``folder`` by name relative to it, with their sizes."""
        found = self.filesystem.get_file_info(fs.FileSelector(f"{BUCKET}/{folder}", recursive=True,
                                                              allow_not_found=True))
        return {info.path[len(f"{BUCKET}/{folder}/"):]: info.size for info in found if info.type == fs.FileType.File}

    def read(self, folder: str, name: str) -> bytes:
        with self.filesystem.open_input_stream(f"{BUCKET}/{folder}/{name}") as stream:
            return stream.read()

    def write(self, folder: str, name: str, data: bytes) -> None:
        with self.filesystem.open_output_stream(f"{BUCKET}/{folder}/{name}") as stream:
            stream.write(data)

    def rows(self, folder: str) -> list[dict]:
        """The manifest's rows, read strictly: whole lines only, one row per output."""
        text = self.read(folder, "manifest.jsonl").decode("utf-8")
        assert text == "" or text.endswith("\n"), "a torn last line"
        rows = [json.loads(line) for line in text.splitlines()]
        keys = [(row["input"], row["method"], row["target"]) for row in rows]
        assert len(set(keys)) == len(keys), "a row written twice"
        return rows


@pytest.fixture(scope="module")
def s3():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    # Test credentials, and no look-up of the instance's own (pyarrow would ask a metadata
    # address off this machine). Ray's workers inherit these from the process that starts Ray.
    with pytest.MonkeyPatch.context() as patch:
        for name, value in dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                                AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true").items():
            patch.setenv(name, value)
        store = Store(port)
        store.filesystem.create_dir(BUCKET)
        yield store
    server.stop()


def _check_outputs(s3: Store, folder: str, images: int, methods: tuple[str, ...]) -> list[dict]:
    """The bucket's folder holds a manifest row per image and method, each naming a complete
    overlay there, and no lock or plan left behind."""
    rows = s3.rows(folder)
    assert len(rows) == images * len(methods) and {row["method"] for row in rows} == set(methods)
    assert {row["status"] for row in rows} <= {"ok", "skipped"}
    for row in rows:
        with Image.open(BytesIO(s3.read(folder, row["output"]))) as image:
            image.load()  # raises on a truncated file
            assert image.format == "PNG" and image.size == (224, 224)
    names = set(s3.files(folder))
    data_files = {name for name in names if name.startswith(DATA_FOLDER + "/")}
    assert names - data_files == {"manifest.jsonl", "index.html"} | {row["output"] for row in rows}
    index = s3.read(folder, "index.html").decode()
    assert data_files == {f"{DATA_FOLDER}/{name}" for name in re.findall(rf'src="{DATA_FOLDER}/([^"]+)"', index)}
    shown = {unquote(output) for name in data_files
             for output in read_data_file(s3.read(folder, name))["maps"]["output"] if output}
    assert shown == {row["output"] for row in rows}
    return rows


def test_a_killed_driver_is_finished_by_the_next_run_and_a_second_run_meanwhile_is_refused(s3, tmp_path, capsys):
    IMAGES = 24
    (tmp_path / "in").mkdir()
    for i in range(IMAGES):
        noise_image(i, size=(64, 48)).save(tmp_path / "in" / f"img{i:02d}.png")
    options = ["run", "in", "--out", s3.uri("killed"), "--engine", "ray", "--method", "gradcam,layercam", "-q"]
    # The driver uploads the manifest after every batch here (every 30 s by default), so that
    # the kill comes after some rows reached the bucket.
    code = ("import sys; import explain.batch.manifest_file as files; files.PUBLISH_SECONDS = 0\n"
            "from explain.cli import main; sys.exit(main(sys.argv[1:]))")
    driver = subprocess.Popen([sys.executable, "-c", code, *options, "--batch-size", "1"], cwd=tmp_path,
                              env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while LEASE not in s3.files("killed"):  # the driver has started (Ray is starting)
            assert driver.poll() is None and time.monotonic() < deadline, "the run took no lease"
            time.sleep(0.1)
        time.sleep(0.5)  # past its read-back
        lease = json.loads(s3.read("killed", LEASE))
        assert (lease["pid"], lease["host"]) == (driver.pid, socket.gethostname()) and lease["expires"] > time.time()
        os.chdir(tmp_path)
        assert main(options) == EXIT_USAGE
        assert (f"another `explain run` (pid {driver.pid} on {socket.gethostname()}) is writing to {s3.uri('killed')}"
                in capsys.readouterr().err)
        while not ("manifest.jsonl" in s3.files("killed")
                   and sum(row["status"] == "ok" for row in s3.rows("killed")) >= 2):
            assert driver.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no rows reached the bucket"
            time.sleep(0.1)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray it started
        driver.wait()
    kept = [row for row in s3.rows("killed") if row["status"] == "ok"]
    assert 2 <= len(kept) < 2 * IMAGES

    # Its lease names a process of this machine that is gone: taken over at once. The outputs,
    # manifest and index land in the bucket (Ray started by the engine, and stopped).
    assert main(options) == 0
    stdout = capsys.readouterr().out
    ok, skipped, failed = summary_counts(stdout)
    assert (ok + skipped, failed) == (2 * IMAGES, 0) and skipped >= len(kept)
    assert f"see s3://{BUCKET}/killed/index.html?endpoint_override={s3.endpoint}&scheme=http" in stdout
    rows = _check_outputs(s3, "killed", IMAGES, ("gradcam", "layercam"))  # the page included
    assert {row["input"] for row in rows} == {f"in/img{i:02d}.png" for i in range(IMAGES)}
    assert not [name for name in s3.files("killed") if name.startswith(PLAN_PREFIX)]
    assert main(options) == 0  # resumes from the bucket's manifest
    assert summary_counts(capsys.readouterr().out) == (0, 2 * IMAGES, 0)
    _check_outputs(s3, "killed", IMAGES, ("gradcam", "layercam"))


def test_the_lease_refuses_a_second_run_is_renewed_and_is_released(s3, monkeypatch):
    # Through the AWS_ENDPOINT_URL variable this time, with a bare s3:// URI.
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3.endpoint}")
    monkeypatch.setattr(explain.batch.guards, "LEASE_SETTLE_SECONDS", 0.05)
    folder = OutputFolder(f"s3://{BUCKET}/lease")
    folder.create()
    with leased_run(folder, seconds=1.5) as taken_over:
        assert not taken_over
        held = json.loads(s3.read("lease", LEASE))
        assert (held["host"], held["pid"]) == (socket.gethostname(), os.getpid())
        with pytest.raises(UsageError, match=rf"another `explain run` \(pid {os.getpid()} on .*\) is writing to "
                                             rf"s3://{BUCKET}/lease; wait for it to finish or pass another --out"):
            with leased_run(OutputFolder(f"s3://{BUCKET}/lease")):
                pass
        time.sleep(1.0)  # renewed every 0.5 s
        renewed = json.loads(s3.read("lease", LEASE))
        assert renewed["owner"] == held["owner"] and renewed["expires"] > held["expires"]
    assert LEASE not in s3.files("lease")  # released

    for stop in (KeyboardInterrupt, RuntimeError):  # also by Ctrl-C and errors
        with pytest.raises(stop), leased_run(folder):
            assert LEASE in s3.files("lease")
            raise stop
        assert LEASE not in s3.files("lease")

    # Another machine's lease holds until it expires; one of this machine's dead process does not.
    others = {"owner": "other", "host": "elsewhere", "pid": 1, "expires": time.time() + 60}
    s3.write("lease", LEASE, json.dumps(others).encode())
    with pytest.raises(UsageError, match="pid 1 on elsewhere"), leased_run(folder):
        pass
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    s3.write("lease", LEASE, json.dumps(dict(others, host=socket.gethostname(), pid=int(dead.stdout))).encode())
    with leased_run(folder) as taken_over:
        assert taken_over and json.loads(s3.read("lease", LEASE))["pid"] == os.getpid()
    s3.write("lease", LEASE, json.dumps(dict(others, expires=time.time() - 1)).encode())
    with leased_run(folder) as taken_over:
        assert taken_over


def test_two_runs_that_start_together_get_one_lease(s3, monkeypatch):
    monkeypatch.setattr(explain.batch.guards, "LEASE_SETTLE_SECONDS", 0.3)
    folder = OutputFolder(s3.uri("race"))
    outcomes, holding, both_looked = [], threading.Barrier(2, timeout=10), threading.Barrier(2, timeout=10)
    write_lease = explain.batch.guards._renew

    def write_once_both_found_none(*args):
        both_looked.wait()
        write_lease(*args)

    monkeypatch.setattr(explain.batch.guards, "_renew", write_once_both_found_none)

    def start():
        try:
            with leased_run(folder):
                outcomes.append("ran")
                holding.wait()
        except UsageError:
            outcomes.append("refused")
            holding.wait()

    threads = [threading.Thread(target=start) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ran", "refused"]


def test_a_bucket_that_does_not_exist_is_a_usage_error_before_ray_starts(s3, tmp_path, capsys, monkeypatch):
    def no_ray(*args):
        raise AssertionError("Ray started before --out was checked")

    monkeypatch.setattr(explain.batch.ray_cluster, "connect", no_ray)
    noise_image(0).save(tmp_path / "a.png")
    uri = s3.uri("x").replace(BUCKET, "no-such-bucket")
    assert main(["run", str(tmp_path / "a.png"), "--out", uri, "--engine", "ray"]) == EXIT_USAGE
    assert f"explain: error: --out {uri}: cannot create the folder: Bucket 'no-such-bucket' not found" in \
        capsys.readouterr().err
