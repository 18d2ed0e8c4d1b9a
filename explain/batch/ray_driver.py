"""``explain run --engine ray``: the same run on Ray Data, from one machine to a cluster.

The driver (this process) plans and reports, and never imports torch, so that planning a
list of millions of images stays in bounded memory: it streams the inputs
(:class:`~explain.batch.inputs.InputListing`), keeps the earlier manifest's finished outputs
(as ``skipped``) and writes the images still to explain to plan files under --out. Ray Data
then reads the plan, decodes and resizes the images in CPU tasks, explains them in a pool of
actors that each load the model once (:mod:`explain.ray_data`), and the actors write the
overlays; the driver appends the rows they return to ``manifest.jsonl`` as they come (the
local engine's rule: :class:`~explain.batch.manifest_file.ManifestFile`), and writes
``index.html`` at the end. A rerun after a crash or a killed driver starts from the
rows that reached the manifest: finished outputs are skipped, the rest is made again, each
row written once.

Where the model is checked, the layers fixed and the settings recorded is the same code as
the local engine's (:func:`~explain.batch.preparation.prepare_run`), run in a Ray task; the
actors explain with the local engine's :class:`~explain.batch.explaining.GroupExplainer`.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..report import iter_json_records, remove_temp_files
from ..viewer import PageRun
from .ground_truth import row_marker
from .guards import StopFlag, leased_run, sole_run
from .inputs import PLAN_PREFIX, InputListing
from .manifest import MANIFEST
from .manifest_file import ManifestFile, RowCounts
from .options import CheckedRun, RunOptions
from .outcome import exit_code, interrupted_summary, out_of_memory_note, report_failures, stopped_summary
from .page import OriginalCopies, atlas_links, colour_scales, page_run, write_page
from .planning import finished_pairs, skipped_rows
from .progress import label_summary, progress_bar, run_summary
from .ray_cluster import import_ray, ray_session
from .ray_files import ROWS_SUFFIX, PlanFiles
from .ray_stream import CLOSE_SECONDS, Stream, ask_actors_to_stop, kept_lines, kept_row_files, kept_rows, wait_for_calls
from .storage import OutputDeviceError, OutputFolder, out_folder

#: index.html shows at most this many images (the manifest has them all).
INDEX_LIMIT = 100_000
#: What the first Ctrl-C (or SIGTERM) does to a run on Ray, as its message says.
STOPPING = "the actors finish the batches they hold; what is finished is kept"


def run_on_ray(args: RunOptions) -> int:
    """``explain run --engine ray``: plan here, explain on Ray; returns the exit status."""
    folder = OutputFolder(args.out)
    local = folder.filesystem is None
    out_dir = out_folder(args.out) if local else Path(args.out)
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
        with ray_session(ray, args.address):
            from .ray_stages import actor_resources, remote_prepare

            checked = remote_prepare(ray, args)
            if checked.messages:
                print(checked.messages, end="", file=sys.stderr)
            run = RayRun(args, folder, listing, checked, actor_resources(ray, args, checked.device), leftovers)
            return run.execute(ray)


def earlier_lines(folder: OutputFolder, leftovers: list[str]) -> Iterator[str]:
    """The manifest's lines, then those of the rows that the actors of a run that did not end
    kept in its ``leftovers`` folders (their files written, the rows not yet received by its
    driver)."""
    yield from folder.lines(MANIFEST)
    for leftover in leftovers:
        if leftover.endswith(ROWS_SUFFIX):
            yield from kept_lines(folder, leftover)


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
    #: Whether the manifest holds every row the actors kept (their rows folder may go).
    kept_taken: bool = False
    #: Whether Ray Data's execution may still run (its actors may write rows yet: the rows
    #: folder, with its stop file, is left to the next run).
    executing: bool = False


class RayRun:
    """The driver's side of one ``explain run --engine ray``."""

    def __init__(self, args: RunOptions, folder: OutputFolder, listing: InputListing, checked: CheckedRun,
                 resources: dict, leftovers: Sequence[str] = ()):
        self.args, self.folder, self.listing, self.checked, self.resources = args, folder, listing, checked, resources
        #: Plan folders of runs that did not end: the rows their actors kept count as manifest rows.
        self.leftovers = list(leftovers)
        self.methods, self.labels, self.records = checked.methods, checked.labels, checked.records
        self.received_kept: set[str] = set()  # files of kept rows received but not removed
        self.received_inputs: set[int] = set()  # rows come back once: not from a killed actor's files too
        self.manifest = ManifestFile(folder, row_marker(args.labels, checked.task, listing, checked.class_names))
        self.counts = RowCounts()
        self.plan = PlanFiles(folder)
        self.atlas = atlas_links(args.atlas, str(args.out))  # --atlas: the concept pages crp's concepts link to

    # -- planning

    def _start_manifest(self, inputs: set[int], finished: set[int]) -> None:
        """Compact the manifest to the finished rows of this run's inputs, as skipped."""
        earlier = iter_json_records(earlier_lines(self.folder, self.leftovers))
        self.counts.stats["skipped"] += self.manifest.compact(skipped_rows(earlier, inputs, finished))

    def _append(self, rows: list[dict], report: bool = False) -> None:
        """Rows to the manifest, counted; with ``report``, their failures on stderr too."""
        self.manifest.append(rows)
        for row in rows:
            self.counts.count(row)
        if report:
            report_failures(rows)

    def _failed(self, input: str, methods: Sequence[str], error: str) -> list[dict]:
        return [record.row() for method in methods for record in self.records.failed(input, method, self.labels, error)]

    def _write_plan(self, finished: set[int], stop: StopFlag) -> int:
        """Plan files of the images to explain, with the methods still to run on each; failed
        rows for the inputs that are missing. Returns how many images are planned."""
        for source in self.listing:
            if stop.set:  # Ctrl-C while planning: nothing is explained
                break
            if source.error:
                self._append(self._failed(source.input, self.methods, source.error))
                continue
            pending = [m for m in self.methods if self.args.overwrite or hash((source.input, m)) not in finished]
            if pending:
                self.plan.add(source.input, source.path, source.folder, source.stem, ",".join(pending))
        self.plan.flush()
        return self.plan.count

    def _fail_lost(self, received: set[int]) -> None:
        """Failed rows for the planned images whose rows never came back: their batch failed
        in Ray itself (an actor that died on it, past Ray's retries), not in our code."""
        error = "worker failed: Ray lost this image's batch (an actor died on it; see Ray's log)"
        for input, methods in self.plan.entries():
            if hash(input) not in received:
                self._append(self._failed(input, methods.split(","), error), report=True)

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
            if end.kept_taken and not end.executing:  # else the next run reads them
                self.folder.remove_folder(self.plan.rows_name)
        if metrics_text:
            print(metrics_text)
        if end.refused is not None:
            print(f"explain: error: {end.refused}", file=sys.stderr)
            summary = stopped_summary(end.refused, counts)
        print(summary)
        if self.counts.out_of_memory:
            print(out_of_memory_note(self.counts.out_of_memory), file=sys.stderr)
        return exit_code(self.counts.stats["failed"], not end.completed, device_error=end.refused is not None,
                         out_of_memory=self.counts.out_of_memory > 0, terminated=end.terminated)

    def _execute(self, ray, end: DriverEnd) -> None:
        inputs, finished = finished_pairs(earlier_lines(self.folder, self.leftovers), self.listing.inputs(),
                                          self.checked, self.folder.is_file, self.args.save_maps)
        finished = set() if self.args.overwrite else finished
        self._start_manifest(inputs, finished)
        del inputs
        self.manifest.publish()
        for leftover in self.leftovers:  # their rows are in the manifest now
            self.folder.remove_folder(leftover)
        with StopFlag(STOPPING) as stop:
            progress = None
            try:
                planned = self._write_plan(finished, stop)
                del finished
                progress = progress_bar(planned, self.args.quiet)
                if planned and not stop.set:
                    self._explain(ray, stop, progress, end)
                end.completed = not stop.set
            except KeyboardInterrupt:  # a second Ctrl-C: at once, without waiting for the actors
                pass
            finally:
                if progress is not None:
                    progress.close()
                end.interrupted, end.terminated = not end.completed and end.refused is None, stop.terminated
                try:
                    self._take_kept_rows(end)
                finally:
                    self.manifest.close()

    def _explain(self, ray, stop: StopFlag, progress, end: DriverEnd) -> None:
        """The plan's images on Ray, their rows appended as they come; on Ctrl-C, the actors
        asked to stop and waited for (they write what they finished)."""
        from . import ray_stages

        received = self.received_inputs  # inputs whose rows came back
        stream = Stream(ray_stages.explain_plan(ray, self.folder.path(self.plan.name), self.folder.filesystem,
                                                self.args.with_absolute_paths(), self.checked, self.resources,
                                                rows_folder=self.plan.rows_name))
        wait = 0.0  # a second Ctrl-C or an error: Ray's execution is ended, not waited for
        try:
            while not stop.set:
                try:
                    self._receive(stream.get(), progress, end, received)
                except StopIteration:
                    self._fail_lost(received)
                    break
            else:
                ask_actors_to_stop(self.folder, self.plan.rows_name)
                wait_for_calls(self.folder, self.plan.rows_name,
                               lambda: self._receive(stream.get(), progress, end, received))
            wait = CLOSE_SECONDS
        except StopIteration:  # the stream ended while the actors stopped
            wait = CLOSE_SECONDS
        finally:
            stream.close(wait)
            end.executing = not stream.ended

    def _receive(self, item, progress, end: DriverEnd, received: set[int]) -> None:
        """Append one batch's rows (``item``: the rows and the files the actors kept them in,
        removed once the rows are in the manifest; None: nothing came)."""
        if item is None:
            return
        rows, kept = item
        refused = [row for row in rows if row.get("refused")]  # files the folder's device refused
        rows = [row for row in rows if not row.get("refused")]
        self._append(rows, report=True)
        for name in kept:
            try:
                self.folder.remove(name)
            except OSError:  # left: not to be read again by _take_kept_rows
                self.received_kept.add(name)
        count = len({row["input"] for row in rows})
        received.update(hash(row["input"]) for row in rows)
        end.images += count
        progress.update(count)
        if refused:
            raise OutputDeviceError(refused[0]["error"])

    def _take_kept_rows(self, end: DriverEnd) -> None:
        """Append the rows the actors kept whose inputs never came back (a stopped run's), then their files."""
        try:
            for name in set(kept_row_files(self.folder, self.plan.rows_name)) - self.received_kept:
                self._append(kept_rows(self.folder, name, self.received_inputs), report=True)
                self.folder.remove(name)
        except OutputDeviceError as error:  # the next run reads them
            end.refused = end.refused or error
            return
        except OSError:
            return
        end.kept_taken = True

    def _finish(self, ray, end: DriverEnd, summary: str, seconds: float) -> str:
        """Upload the manifest (a folder given by URI) and write index.html; the text of the
        metric summary (--metrics)."""
        metrics_text = ""
        try:
            self.manifest.publish()
            metrics_text, metrics_html = metric_summary(ray, self.folder) if end.completed and self.checked.metrics \
                else ("", "")
            run = page_run("explain run", summary, self.counts.stats, seconds, end.images,
                           "complete" if end.completed else "interrupted", self.checked.zoom,
                           colour_scales(self.checked.settings, self.args.cmap, self.args.signed_cmap), self.atlas)
            write_index(self.folder, self.manifest.path, run, metrics_html, self.args.copy_originals)
        except OutputDeviceError as error:
            end.refused = end.refused or error
        finally:
            if self.folder.filesystem is not None:  # the working copy, uploaded above
                shutil.rmtree(self.manifest.path.parent, ignore_errors=True)
        return metrics_text

    def _summary(self, images: int, elapsed: float) -> str:
        summary = run_summary(self.counts.stats, images, elapsed, self.counts.seconds, " on Ray")
        text = (f"{summary}{_verdicts(self)}; "
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


def _verdicts(run: RayRun) -> str:
    """With --labels, the summary line's count of the mistakes, read from the run's manifest."""
    if run.args.labels is None or not run.manifest.path.is_file():
        return ""
    with open(run.manifest.path, encoding="utf-8", errors="replace") as lines:
        return label_summary(iter_json_records(lines))


def write_index(folder: OutputFolder, manifest: Path, run: PageRun, metrics_html: str, copy: bool = False) -> None:
    """index.html of the manifest's first :data:`INDEX_LIMIT` images (``copy``: with thumbnails
    of the originals copied into the folder, --copy-originals)."""
    # On an object store every ok row's file was written or found by this run: asking for each
    # again would cost a request per image.
    exists = folder.is_file if folder.filesystem is None else (lambda output: True)
    write_page(folder, _index_rows(manifest, INDEX_LIMIT), run, metrics_html, exists,
               OriginalCopies(folder) if copy else None)


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
