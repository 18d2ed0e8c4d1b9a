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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError, out_of_memory_reason
from ..report import TEMP_SUFFIX, iter_json_records, manifest_line, remove_temp_files
from ..viewer import PageRun
from .ground_truth import row_marker
from .guards import StopFlag, leased_run, sole_run, terminated_as_interrupt
from .inputs import PLAN_PREFIX, InputListing
from .manifest import MANIFEST, is_well_formed, manifest_row
from .options import CheckedRun, RunOptions
from .outcome import exit_code, interrupted_summary, out_of_memory_note, report_failure, stopped_summary
from .page import colour_scales, page_run, write_page
from .planning import finished_pairs
from .progress import progress_bar, run_summary
from .storage import OutputDeviceError, OutputFolder, append_whole, device_errors

#: Images per plan file: Ray Data reads the plan file by file, a decode task per file.
PLAN_CHUNK = 1_000
#: Ray Data's block size for the run: a decoded batch (16 images at 224 px: 2.4 MB) is passed
#: on at once instead of gathered with the rest of its file, so that rows reach the manifest
#: as images finish.
BLOCK_BYTES = 1 << 20
#: A folder given by URI gets the manifest's working copy at most this often (and at the end).
PUBLISH_SECONDS = 30
#: index.html shows at most this many images (the manifest has them all).
INDEX_LIMIT = 100_000
#: The end of the name of the folder beside a plan where its actors keep their batches' rows.
ROWS_SUFFIX = "-rows"


def import_ray():
    """The ``ray`` module, or a usage error that names the extra to install."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise UsageError(
            "--engine ray needs Ray Data: pip install 'explain-vision[ray]' (or pip install 'ray[data]')") from None
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
    folder.create()
    # One run per folder: a flock on a local one, a lease object on one given by URI.
    with sole_run(out_dir) if local else leased_run(folder) as taken_over:
        leftovers = []
        if local or taken_over:  # on an object store, only after a run that did not end (listing costs)
            if local:
                remove_temp_files(folder.root)
            leftovers = folder.names(PLAN_PREFIX)  # read for their rows, then removed (RayRun)
        started = connect(ray, args.address)
        # ray.init's SIGTERM handlers (sys.exit, and the core worker's, which prints a native
        # stack) give way to ours: SIGTERM stops the run as Ctrl-C does.
        with terminated_as_interrupt():
            try:
                from .ray_stages import actor_resources, remote_prepare

                checked = remote_prepare(ray, args)
                if checked.messages:
                    print(checked.messages, end="", file=sys.stderr)
                run = RayRun(args, folder, listing, checked, actor_resources(ray, args, checked), leftovers)
                return run.execute(ray)
            finally:
                if started:
                    ray.shutdown()


def earlier_lines(folder: OutputFolder, leftovers: list[str]) -> Iterator[str]:
    """The manifest's lines, then those of the rows that the actors of a run that did not end
    kept in its ``leftovers`` folders (their files written, the rows not yet received by its
    driver)."""
    yield from folder.lines(MANIFEST)
    for leftover in leftovers:
        if leftover.endswith(ROWS_SUFFIX):
            for name in folder.names("", under=leftover):
                yield from folder.lines(f"{leftover}/{name}")


@dataclass
class DriverEnd:
    """How the driver's run ended: images received, whether Ctrl-C stopped it, whether it ran
    to the end, and the output device's error that stopped it."""

    images: int = 0
    interrupted: bool = False
    completed: bool = False
    refused: OutputDeviceError | None = None
    #: Whether SIGTERM stopped it (exit status 143, not 130).
    terminated: bool = False


class PlanFiles:
    """The images a run explains with the methods still to run on each: parquet files in a
    folder under --out (``PLAN_PREFIX...``), :data:`PLAN_CHUNK` images a file, that Ray Data
    reads, a decode task per file. ``input`` and ``path`` are bytes (``os.fsencode``): a file
    name that is not UTF-8 has no place in a parquet string column."""

    COLUMNS = ("input", "path", "folder", "stem", "methods")
    NAMES = ("input", "path")

    def __init__(self, folder: OutputFolder):
        self.folder = folder
        self.name = f"{PLAN_PREFIX}{uuid.uuid4().hex[:8]}"  # read by the workers
        #: Where the actors keep each batch's rows (beside the plan: Ray Data reads all of its folder).
        self.rows_name = f"{self.name}{ROWS_SUFFIX}"
        self.files: list[str] = []
        self.count = 0
        self._chunk: dict[str, list] = {name: [] for name in self.COLUMNS}

    def add(self, *values: str) -> None:
        """One image: its ``input``, ``path``, ``folder``, ``stem`` and ``methods`` (comma-separated)."""
        for name, value in zip(self.COLUMNS, values, strict=True):
            self._chunk[name].append(os.fsencode(value) if name in self.NAMES else value)
        self.count += 1
        if len(self._chunk["input"]) >= PLAN_CHUNK:
            self.flush()

    def flush(self) -> None:
        """Write the images added since the last file as the next file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._chunk["input"]:
            return
        path = self.folder.path(f"{self.name}/part-{len(self.files):05d}.parquet")
        with device_errors(self.folder.location):
            if not self.files:
                if self.folder.filesystem is None:
                    os.makedirs(self.folder.path(self.name))
                else:
                    self.folder.filesystem.create_dir(self.folder.path(self.name), recursive=True)
            pq.write_table(pa.table(self._chunk), path, filesystem=self.folder.filesystem)
        self.files.append(path)
        for values in self._chunk.values():
            values.clear()

    def entries(self) -> Iterator[tuple[str, str]]:
        """The planned images' inputs and methods, read back file by file."""
        import pyarrow.parquet as pq

        for path in self.files:
            table = pq.read_table(path, columns=["input", "methods"], filesystem=self.folder.filesystem).to_pydict()
            yield from zip(map(os.fsdecode, table["input"]), table["methods"], strict=True)


class RayRun:
    """The driver's side of one ``explain run --engine ray``."""

    def __init__(self, args: RunOptions, folder: OutputFolder, listing: InputListing, checked: CheckedRun,
                 resources: dict, leftovers: Sequence[str] = ()):
        self.args, self.folder, self.listing, self.checked, self.resources = args, folder, listing, checked, resources
        #: Plan folders of runs that did not end: the rows their actors kept count as manifest rows.
        self.leftovers = list(leftovers)
        self.methods, self.labels = checked.methods, checked.labels
        self.stats = {"ok": 0, "skipped": 0, "failed": 0}
        self.out_of_memory = 0  # outputs failed for memory running out
        self.seconds: dict[str, float] = {}  # method -> its time in this run, on the actors
        # The manifest is appended to on this machine: in the folder itself, or for a folder
        # given by URI in a working copy that is uploaded now and then and at the end.
        if folder.filesystem is None:
            self.manifest = Path(folder.path(MANIFEST))
        else:
            self.manifest = Path(tempfile.mkdtemp(prefix="explain-ray-")) / MANIFEST
        self.plan = PlanFiles(folder)
        self.published = time.monotonic()
        self.marked = row_marker(args.labels, checked.task, listing, checked.class_names)  # --labels

    # -- planning

    def _finished_pairs(self) -> tuple[set[int], set[int]]:
        return finished_pairs(earlier_lines(self.folder, self.leftovers), self.listing.inputs(), self.checked,
                              self.folder.is_file, self.args.save_maps)

    def _start_manifest(self, inputs: set[int], finished: set[int]) -> None:
        """Rewrite the manifest with the finished rows of this run's inputs, as skipped."""
        temp = self.manifest.with_name(f".{MANIFEST}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            written: set[int] = set()  # a row kept by an actor may be in the manifest too
            with device_errors(self.manifest.parent), open(temp, "w", encoding="utf-8") as file:
                for row in filter(is_well_formed, iter_json_records(earlier_lines(self.folder, self.leftovers))):
                    key = hash((row.get("input"), row.get("method"), row.get("target")))
                    if hash(row.get("input")) in inputs and hash((row.get("input"), row.get("method"))) in finished \
                            and row.get("status") in ("ok", "skipped") and not self.args.overwrite \
                            and key not in written:
                        written.add(key)
                        file.write(manifest_line(self.marked(dict(row, status="skipped", error=None))) + "\n")
                        self.stats["skipped"] += 1
            os.replace(temp, self.manifest)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise

    def _write_plan(self, finished: set[int], out) -> int:
        """Plan files of the images to explain, with the methods still to run on each; failed
        rows for the inputs that are missing. Returns how many images are planned."""
        for source in self.listing:
            if source.error:
                self._append(out, [self._row(source.input, method, label, status="failed", error=source.error)
                                   for method in self.methods for label in self.labels])
                continue
            pending = [m for m in self.methods if self.args.overwrite or hash((source.input, m)) not in finished]
            if pending:
                self.plan.add(source.input, source.path, source.folder, source.stem, ",".join(pending))
        self.plan.flush()
        return self.plan.count

    def _row(self, input: str, method: str, label: str, **values) -> dict:
        checked = self.checked
        return manifest_row(input, method, label, checked.layers[method], checked.settings[method], checked.task,
                            **values)

    def _append(self, out, rows: list[dict], report: bool = False) -> None:
        """Rows to the manifest, whole lines in one write (a killed driver leaves at most a
        partial last line, which readers drop and the next run's rewrite removes; a full disk
        none); with ``report``, their failures on stderr too."""
        if not rows:
            return
        rows = [self.marked(row) for row in rows]
        with device_errors(self.manifest.parent):
            append_whole(out, "".join(manifest_line(row) + "\n" for row in rows).encode("utf-8"))
        if self.folder.filesystem is not None and time.monotonic() - self.published > PUBLISH_SECONDS:
            self._publish()
        reported = set()
        for row in rows:
            self.stats[row["status"]] += 1
            self.out_of_memory += row["status"] == "failed" and out_of_memory_reason(row.get("error") or "")
            if row.get("seconds") is not None:
                self.seconds[row["method"]] = self.seconds.get(row["method"], 0.0) + row["seconds"]
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
        error = "worker failed: Ray lost this image's batch (an actor died on it; see Ray's log)"
        for input, methods in self.plan.entries():
            if hash(input) not in received:
                self._append(out, [self._row(input, method, label, status="failed", error=error)
                                   for method in methods.split(",") for label in self.labels], report=True)

    # -- the run

    def execute(self, ray) -> int:
        started = time.perf_counter()
        end = DriverEnd()
        try:
            self._execute(ray, end)
        except OutputDeviceError as error:  # a full disk: the rows received so far are kept
            end.refused = error
        finally:
            self.folder.remove_folder(self.plan.name)
            counts = self._summary(end.images, time.perf_counter() - started)
            summary = counts if end.completed else interrupted_summary(counts)
            metrics_text = self._finish(ray, end, summary, time.perf_counter() - started)
            self.folder.remove_folder(self.plan.rows_name)  # only once the manifest holds them
        if metrics_text:
            print(metrics_text)
        if end.refused is not None:
            print(f"explain: error: {end.refused}", file=sys.stderr)
            summary = stopped_summary(end.refused, counts)
        print(summary)
        if self.out_of_memory:
            print(out_of_memory_note(self.out_of_memory), file=sys.stderr)
        return exit_code(self.stats["failed"], not end.completed, device_error=end.refused is not None,
                         out_of_memory=self.out_of_memory > 0, terminated=end.terminated)

    def _execute(self, ray, end: DriverEnd) -> None:
        inputs, finished = self._finished_pairs()
        if self.args.overwrite:
            finished = set()
        self._start_manifest(inputs, finished)
        del inputs
        self._publish()
        for leftover in self.leftovers:  # their rows are in the manifest now
            self.folder.remove_folder(leftover)
        # Unbuffered, so that a failed append is cut off whole (storage.append_whole).
        with open(self.manifest, "ab", buffering=0) as out, StopFlag("the current batch") as stop:
            planned = self._write_plan(finished, out)
            del finished
            progress = progress_bar(planned, self.args.quiet)
            try:
                if planned:
                    self._explain(ray, out, stop, progress, end)
                end.completed = not end.interrupted
            except KeyboardInterrupt:
                end.interrupted = True
            finally:
                progress.close()
                end.terminated = stop.terminated

    def _explain(self, ray, out, stop: StopFlag, progress, end: DriverEnd) -> None:
        """The plan's images on Ray, their rows appended as they come."""
        from . import ray_stages

        received: set[int] = set()
        for rows in ray_stages.explain_plan(ray, self.folder.path(self.plan.name), self.folder.filesystem,
                                            self.args.with_absolute_paths(), self.checked, self.resources,
                                            rows_folder=self.plan.rows_name):
            refused = [row for row in rows if row.get("refused")]  # files the folder's device refused
            rows = [row for row in rows if not row.get("refused")]
            self._append(out, rows, report=True)
            count = len({row["input"] for row in rows})
            received.update(hash(row["input"]) for row in rows)
            end.images += count
            progress.update(count)
            if refused:
                raise OutputDeviceError(refused[0]["error"])
            if stop.set:
                end.interrupted = True
                return
        self._fail_lost(out, received)

    def _finish(self, ray, end: DriverEnd, summary: str, seconds: float) -> str:
        """Upload the manifest (a folder given by URI) and write index.html; the text of the
        metric summary (--metrics)."""
        metrics_text = ""
        try:
            self._publish()
            metrics_text, metrics_html = metric_summary(ray, self.folder) if end.completed and self.checked.metrics \
                else ("", "")
            run = page_run("explain run", summary, self.stats, seconds, end.images,
                           "complete" if end.completed else "interrupted", self.checked.zoom,
                           colour_scales(self.checked.settings, self.args.cmap, self.args.signed_cmap))
            write_index(self.folder, self.manifest, run, metrics_html)
        except OutputDeviceError as error:
            end.refused = end.refused or error
        finally:
            if self.folder.filesystem is not None:  # the working copy, uploaded above
                shutil.rmtree(self.manifest.parent, ignore_errors=True)
        return metrics_text

    def _summary(self, images: int, elapsed: float) -> str:
        text = (f"{run_summary(self.stats, images, elapsed, self.seconds, ' on Ray')}; "
                f"see {self.folder.shown('index.html')} and {self.folder.shown(MANIFEST)}")
        if len(self.listing) > INDEX_LIMIT:
            text += f" (index.html shows the first {INDEX_LIMIT:,} images)"
        return text


def metric_summary(ray, folder: OutputFolder) -> tuple[str, str]:
    """--metrics: the summary table (text and HTML) of the values in the folder's manifest,
    made in a Ray task (the metrics' directions live beside torch)."""
    from .ray_stages import remote_metric_summary

    # Absolute: Ray's workers do not share this process's working directory.
    return remote_metric_summary(ray, folder.location if folder.filesystem else folder.root)


def write_index(folder: OutputFolder, manifest: Path, run: PageRun, metrics_html: str) -> None:
    """index.html of the manifest's first :data:`INDEX_LIMIT` images."""
    # On an object store every ok row's file was written or found by this run: asking for each
    # again would cost a request per image.
    exists = folder.is_file if folder.filesystem is None else (lambda output: True)
    write_page(folder, _index_rows(manifest, INDEX_LIMIT), run, metrics_html, exists)


def _index_rows(path: Path, limit: int) -> list[dict]:
    """The manifest's rows of its first ``limit`` images, for index.html, read as a stream."""
    inputs: set[str | None] = set()
    rows = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for row in iter_json_records(lines):
            if row.get("input") not in inputs:
                if len(inputs) >= limit:
                    continue
                inputs.add(row.get("input"))
            rows.append(row)
    return rows
