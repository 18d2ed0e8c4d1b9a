"""``explain run --engine ray``: the same run on Ray Data, from one machine to a cluster.

The driver (this process) plans and reports, and never imports torch, so that planning a
list of millions of images stays in bounded memory: it streams the inputs
(:class:`~explain.batch.inputs.InputListing`), keeps the earlier manifest's finished outputs
(as ``skipped``) and writes the images still to explain to plan files under --out. Ray Data
then reads the plan, decodes and resizes the images in CPU tasks, explains them in a pool of
actors that each load the model once (:mod:`explain.ray_data`), and the actors write the
overlays; the driver appends the rows they return to ``manifest.jsonl`` as they come, and
writes ``index.html`` at the end. A rerun after a crash or a killed driver starts from the
rows that reached the manifest: finished outputs are skipped, the rest is made again, each
row written once.

Where the model is checked, the layers fixed and the settings recorded is the same code as
the local engine's (:func:`~explain.batch.preparation.prepare_run`), run in a Ray task; the
actors explain with the local engine's :class:`~explain.batch.explaining.GroupExplainer`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tqdm import tqdm

from ..errors import UsageError
from ..report import TEMP_SUFFIX, index_html, iter_json_records, manifest_line, remove_temp_files
from .guards import StopFlag, sole_run
from .inputs import InputListing
from .manifest import MANIFEST, manifest_row
from .options import CheckedRun, RunOptions
from .outcome import exit_code, interrupted_summary, report_failure
from .planning import finished_pairs
from .storage import OutputFolder

#: Images per plan file: Ray Data reads the plan file by file, a decode task per file.
PLAN_CHUNK = 1_000
#: Ray Data's block size for the run: a decoded batch (16 images at 224 px: 2.4 MB) is passed
#: on at once instead of gathered with the rest of its file, so that rows reach the manifest
#: as images finish.
BLOCK_BYTES = 1 << 20
#: A folder given by URI gets the manifest's working copy at most this often (and at the end).
PUBLISH_SECONDS = 30
#: index.html shows at most this many images (the manifest has them all).
INDEX_LIMIT = 10_000
PLAN_PREFIX = ".explain-ray-plan-"


def import_ray():
    """The ``ray`` module, or a usage error that names the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise UsageError("--engine ray needs Ray Data: pip install 'explain-vision[ray]' (or pip install 'ray[data]')") \
            from None
    return ray


def connect(ray, address: str | None) -> bool:
    """Join the cluster at ``address``, or start a local Ray on this machine's cores; True when
    this call started Ray (and should shut it down)."""
    import logging

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    data = ray.data.DataContext.get_current()
    data.enable_progress_bars = False  # ours counts images, not blocks
    data.print_on_execution_start = False
    data.target_max_block_size = BLOCK_BYTES
    data.max_errored_blocks = -1  # a batch Ray itself loses fails its images; the run goes on
    if ray.is_initialized():
        return False
    # Ray's notes at start and end (token authentication, "execution finished") are not the
    # user's business; its warnings about the run are, and workers' errors reach the driver.
    options = dict(logging_level=logging.ERROR, include_dashboard=False, log_to_driver=True)
    try:
        if address:
            ray.init(address=address, **options)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, **options)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise UsageError(f"cannot {'join the Ray cluster at ' + address if address else 'start Ray'}: {error}; "
                         "check --address (auto, ray://HEAD:10001) and that `ray status` answers there") from None
    return True


def run_on_ray(args: RunOptions) -> int:
    """``explain run --engine ray``: plan here, explain on Ray; returns the exit status."""
    folder = OutputFolder(args.out)
    local = folder.filesystem is None
    out_dir = Path(args.out)
    if local and out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file; pass a folder")
    listing = InputListing(args.inputs, out_dir if local else None)
    ray = import_ray()
    started = connect(ray, args.address)
    try:
        from .ray_stages import actor_resources, remote_prepare

        checked = remote_prepare(ray, args)
        if checked.messages:
            print(checked.messages, end="", file=sys.stderr)
        run = RayRun(args, folder, listing, checked, actor_resources(ray, args, checked))
        if not local:  # an object store has no lock and no partial files to clean up
            return run.execute(ray)
        out_dir.mkdir(parents=True, exist_ok=True)
        with sole_run(out_dir):
            remove_temp_files(out_dir)
            for stale in out_dir.glob(PLAN_PREFIX + "*"):
                shutil.rmtree(stale, ignore_errors=True)
            return run.execute(ray)
    finally:
        if started:
            ray.shutdown()


class RayRun:
    """The driver's side of one ``explain run --engine ray``."""

    def __init__(self, args: RunOptions, folder: OutputFolder, listing: InputListing, checked: CheckedRun,
                 resources: dict):
        self.args, self.folder, self.listing, self.checked, self.resources = args, folder, listing, checked, resources
        self.methods, self.labels = checked.methods, checked.labels
        self.stats = {"ok": 0, "skipped": 0, "failed": 0}
        # The manifest is appended to on this machine: in the folder itself, or for a folder
        # given by URI in a working copy that is uploaded now and then and at the end.
        if folder.filesystem is None:
            self.manifest = Path(folder.path(MANIFEST))
        else:
            self.manifest = Path(tempfile.mkdtemp(prefix="explain-ray-")) / MANIFEST
        self.plan_name = f"{PLAN_PREFIX}{uuid.uuid4().hex[:8]}"  # read by the workers
        self.plan_files: list[str] = []
        self.published = time.monotonic()

    # -- planning

    def _finished_pairs(self) -> tuple[set[int], set[int]]:
        return finished_pairs(self.folder.lines(MANIFEST), self.listing.inputs(), self.checked, self.folder.is_file,
                              self.args.save_maps)

    def _start_manifest(self, inputs: set[int], finished: set[int]) -> None:
        """Rewrite the manifest with the finished rows of this run's inputs, as skipped."""
        # Named as atomic_write names its files, so that a driver killed here leaves a file
        # the next run's remove_temp_files deletes.
        temp = self.manifest.with_name(f".{MANIFEST}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        with open(temp, "w", encoding="utf-8") as file:
            for row in iter_json_records(self.folder.lines(MANIFEST)):
                if hash(row.get("input")) in inputs and hash((row.get("input"), row.get("method"))) in finished \
                        and not self.args.overwrite:
                    file.write(manifest_line(dict(row, status="skipped", error=None)) + "\n")
                    self.stats["skipped"] += 1
        os.replace(temp, self.manifest)

    def _write_plan(self, finished: set[int], out) -> int:
        """Plan files of the images to explain, with the methods still to run on each; failed
        rows for the inputs that are missing. Returns how many images are planned."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.folder.filesystem is None:
            os.makedirs(self.folder.path(self.plan_name))
        else:
            self.folder.filesystem.create_dir(self.folder.path(self.plan_name), recursive=True)
        columns = ("input", "path", "folder", "stem", "methods")
        chunk: dict[str, list] = {name: [] for name in columns}
        planned = 0

        def flush() -> None:
            if chunk["input"]:
                path = self.folder.path(f"{self.plan_name}/part-{len(self.plan_files):05d}.parquet")
                pq.write_table(pa.table(chunk), path, filesystem=self.folder.filesystem)
                self.plan_files.append(path)
                for values in chunk.values():
                    values.clear()

        for source in self.listing:
            if source.error:
                self._append(out, [self._row(source.input, method, label, status="failed", error=source.error)
                                   for method in self.methods for label in self.labels])
                continue
            pending = [m for m in self.methods if self.args.overwrite or hash((source.input, m)) not in finished]
            if not pending:
                continue
            for name, value in zip(columns, (source.input, source.path, source.folder, source.stem, ",".join(pending))):
                chunk[name].append(value)
            planned += 1
            if len(chunk["input"]) >= PLAN_CHUNK:
                flush()
        flush()
        return planned

    def _row(self, input: str, method: str, label: str, **values) -> dict:
        checked = self.checked
        return manifest_row(input, method, label, checked.layers[method], checked.settings[method], checked.task,
                            **values)

    def _append(self, out, rows: list[dict], report: bool = False) -> None:
        """Rows to the manifest, whole lines in one write (a killed driver leaves at most a
        partial last line, which readers drop and the next run's rewrite removes); with
        ``report``, their failures on stderr too."""
        if not rows:
            return
        out.write("".join(manifest_line(row) + "\n" for row in rows))
        out.flush()
        if self.folder.filesystem is not None and time.monotonic() - self.published > PUBLISH_SECONDS:
            self._publish()
        reported = set()
        for row in rows:
            self.stats[row["status"]] += 1
            if report and row["status"] == "failed" and (row["input"], row["error"]) not in reported:
                reported.add((row["input"], row["error"]))
                report_failure(row["input"], row["error"])

    def _publish(self) -> None:
        """A folder given by URI: upload the working copy of the manifest."""
        if self.folder.filesystem is not None:
            self.folder.upload(MANIFEST, self.manifest)
            self.published = time.monotonic()

    def _fail_lost(self, out, received: set[int]) -> None:
        """Failed rows for the planned images whose rows never came back: their batch failed
        in Ray itself (an actor that died on it, past Ray's retries), not in our code."""
        import pyarrow.parquet as pq

        error = "worker failed: Ray lost this image's batch (an actor died on it; see Ray's log)"
        for part in self.plan_files:
            table = pq.read_table(part, columns=["input", "methods"], filesystem=self.folder.filesystem).to_pydict()
            for input, methods in zip(table["input"], table["methods"]):
                if hash(input) not in received:
                    self._append(out, [self._row(input, method, label, status="failed", error=error)
                                       for method in methods.split(",") for label in self.labels], report=True)

    # -- the run

    def execute(self, ray) -> int:
        started = time.perf_counter()
        inputs, finished = self._finished_pairs()
        if self.args.overwrite:
            finished = set()
        self._start_manifest(inputs, finished)
        del inputs
        interrupted = completed = False
        images = 0
        stop = StopFlag()
        try:
            with open(self.manifest, "a", encoding="utf-8") as out, stop:
                planned = self._write_plan(finished, out)
                del finished
                progress = tqdm(total=planned, unit="img", disable=self.args.quiet or not planned, file=sys.stderr,
                                dynamic_ncols=True)
                try:
                    if planned:
                        from . import ray_stages

                        received: set[int] = set()
                        for rows in ray_stages.explain_plan(ray, self.folder.path(self.plan_name),
                                                            self.folder.filesystem, self.args.with_absolute_paths(),
                                                            self.checked, self.resources):
                            self._append(out, rows, report=True)
                            count = len({row["input"] for row in rows})
                            received.update(hash(row["input"]) for row in rows)
                            images += count
                            progress.update(count)
                            if stop.set:
                                interrupted = True
                                break
                        if not interrupted:
                            self._fail_lost(out, received)
                    completed = not interrupted
                except KeyboardInterrupt:
                    interrupted = True
                finally:
                    progress.close()
        finally:
            self.folder.remove_folder(self.plan_name)
            self._publish()
            summary = self._summary(images, time.perf_counter() - started, not completed)
            metrics_text, metrics_html = self._metric_summary(ray) if completed and self.checked.metrics else ("", "")
            # On an object store every ok row's file was written or found by this run: asking
            # for each again would cost a request per image.
            exists = self.folder.is_file if self.folder.filesystem is None else (lambda output: True)
            rows = _index_rows(self.manifest, INDEX_LIMIT)
            self.folder.write("index.html", index_html(rows, summary, metrics_html, exists).encode("utf-8"))
            if self.folder.filesystem is not None:  # the working copy, uploaded above
                shutil.rmtree(self.manifest.parent, ignore_errors=True)
        if metrics_text:
            print(metrics_text)
        print(summary)
        return exit_code(self.stats["failed"], interrupted)

    def _metric_summary(self, ray) -> tuple[str, str]:
        """--metrics: the summary table (text and HTML) of the manifest's values, made in a Ray
        task (the metrics' directions live beside torch)."""
        from .ray_stages import remote_metric_summary

        # Absolute: Ray's workers do not share this process's working directory.
        return remote_metric_summary(ray, self.folder.location if self.folder.filesystem else self.folder.root)

    def _shown(self, name: str) -> str:
        location = str(self.folder)
        return f"{location.rstrip('/')}/{name}" if self.folder.filesystem else os.path.join(location, name)

    def _summary(self, images: int, elapsed: float, interrupted: bool) -> str:
        ok, skipped, failed = self.stats["ok"], self.stats["skipped"], self.stats["failed"]
        rate = images / elapsed if elapsed > 0 else 0.0
        text = (f"explain: {ok} ok, {skipped} skipped (already complete), {failed} failed; "
                f"{images} images in {elapsed:.1f} s ({rate:.2f} images/s) on Ray; "
                f"see {self._shown('index.html')} and {self._shown(MANIFEST)}")
        if len(self.listing) > INDEX_LIMIT:
            text += f" (index.html shows the first {INDEX_LIMIT:,} images)"
        return interrupted_summary(text) if interrupted else text


def _index_rows(path: Path, limit: int) -> list[dict]:
    """The manifest's rows of its first ``limit`` images, for index.html, read as a stream."""
    inputs: set[str] = set()
    rows = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for row in iter_json_records(lines):
            if row.get("input") not in inputs:
                if len(inputs) >= limit:
                    continue
                inputs.add(row.get("input"))
            rows.append(row)
    return rows
