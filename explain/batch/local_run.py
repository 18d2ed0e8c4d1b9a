"""``explain run`` in this process (the local engine): plan the missing outputs, explain them
batch by batch (:func:`~explain.batch.loop.for_each_batch`, :class:`~explain.batch.explaining.GroupExplainer`),
write the overlays from a thread pool, append each output's row to the manifest as it is
recorded (:class:`~explain.batch.manifest_file.ManifestFile`, the Ray driver's rule too) and
keep the index up to date."""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..evaluation import format_summary
from ..report import ManifestRecord
from .decoding import crop_zoom
from .explaining import GroupExplainer
from .ground_truth import row_marker
from .inputs import Source
from .job import DatasetJob
from .loop import LoopEnd
from .manifest import MANIFEST, metric_table
from .manifest_file import ManifestFile, RowCounts
from .options import RunOptions
from .outcome import report_failure
from .page import OriginalCopies, atlas_links, colour_scales, page_run, write_page
from .planning import RunPlan
from .preparation import PreparedRun
from .progress import label_summary, run_summary
from .storage import OutputDeviceError, OutputFolder, device_errors


class LocalRun(DatasetJob):
    """One ``explain run`` of the local engine (a :class:`~explain.batch.job.DatasetJob`): its
    plan, the rows it records, the files its writer threads write, and its reports."""

    options: RunOptions

    def __init__(self, prepared: PreparedRun, out_dir: Path, sources: list[Source]):
        self.prepared, self.options, self.out_dir, self.sources = prepared, prepared.options, out_dir, sources
        self.folder = OutputFolder(out_dir)
        self.explainer = GroupExplainer(prepared, report_failure)
        self.loaded, self.costs, self.inputs = prepared.loaded, prepared.costs, self.explainer.inputs
        self.run_plan = RunPlan(prepared, self.explainer.outputs, self.folder, out_dir / MANIFEST)
        workers = max(1, self.options.workers or 1)
        self.saver = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="explain-save")
        self.in_flight: deque[Future] = deque()  # the files being written
        self.in_flight_limit = 2 * (1 if prepared.loaded.fixed_batch else self.options.batch_size) * len(
            prepared.explainers)
        self.reports_written = 0.0
        self.reports_cost = 0.0
        #: the manifest: compacted at the start, each row appended as recorded, compacted at the end
        self.manifest = ManifestFile(self.folder)
        self.appending = False  # the rows recorded before the start are written by its compaction
        self.counts = RowCounts()
        #: --labels: each row marked with its image's label
        self.marked = row_marker(self.options.labels, prepared.task, sources, prepared.loaded.class_names)
        self.started = time.perf_counter()
        self.images = 0  # explained by this run
        # what index.html shows of the run's settings
        self.zoom = crop_zoom(prepared.loaded.preprocess)
        self.scales = colour_scales(prepared.settings, self.options.cmap, self.options.signed_cmap)
        #: --copy-originals: the thumbnails index.html shows (None: links to the inputs)
        self.originals = OriginalCopies(self.folder) if self.options.copy_originals else None
        #: --atlas: the concept pages --method crp's concepts link to
        self.atlas = atlas_links(self.options.atlas, str(self.options.out))

    def _record(self, records: list[ManifestRecord]) -> None:
        rows = [self.marked(record.row()) for record in records]
        for row in rows:
            self.run_plan.record(row)
            self.counts.count(row)
            if row["status"] == "failed" and row.get("output"):
                report_failure(row["input"], f"{row['method']}: {row['error']}")
        self.out_of_memory = self.counts.out_of_memory
        if self.appending:
            self.manifest.append(rows)

    def _save_page(self, summary: str = "", state: str = "in progress") -> None:
        """Rewrite index.html (the manifest's rows are appended as they come)."""
        start = time.monotonic()
        planned = self.run_plan.planned_rows()
        table = metric_table(planned) if self.prepared.metrics else []
        run = page_run("explain run", summary, self.counts.stats, time.perf_counter() - self.started, self.images,
                       state, self.zoom, self.scales, self.atlas)
        with device_errors(self.out_dir):
            write_page(self.folder, planned, run, format_summary(table, "html") if table else "",
                       original=self.originals)
        self.reports_written = time.monotonic()
        self.reports_cost = self.reports_written - start

    def _maybe_save_page(self) -> None:
        # Rewriting the page after every batch is cheap until it is large; this keeps it
        # under ~5 % of the run.
        if time.monotonic() - self.reports_written >= 20 * self.reports_cost:
            self._save_page()

    # -- the job's steps (run by explain.batch.job.run_job)

    def plan(self) -> dict:
        for source, method, error in self.run_plan.make(self.sources, self.options.overwrite):
            self._record(self.explainer.failed_records(source, method, error))
        for row in self.run_plan.recorded_rows():
            if row["status"] == "skipped":  # kept from the earlier manifest: marked by this run's --labels
                self.run_plan.record(self.marked(row))
                self.counts.count(row)
        return self.run_plan.pending

    def begin(self) -> None:
        self.started = time.perf_counter()
        self.manifest.compact(self.run_plan.recorded_rows())  # the finished outputs, and the inputs failed
        self.appending = True
        self._save_page()

    def failed_input(self, index: int, error: str) -> None:
        source = self.sources[index]
        report_failure(source.input, error)
        for cam in self.run_plan.pending[index]:
            self._record(self.explainer.failed_records(source, cam.name, error))

    def group(self, indices: list[int], images) -> None:
        self.images += len(indices)
        outcome = self.explainer.explain([(self.sources[i], self.run_plan.pending[i]) for i in indices], images)
        self._record(outcome.failed)
        self.in_flight.extend(self.saver.submit(job.write, self.folder) for job in outcome.jobs)

    def batch_done(self) -> None:
        while self.in_flight and (self.in_flight[0].done() or len(self.in_flight) > self.in_flight_limit):
            self._record(self.in_flight.popleft().result())

    def between_batches(self) -> None:
        self._maybe_save_page()

    def drain(self) -> None:
        while self.in_flight:
            self._record(self.in_flight.popleft().result())

    def stop(self) -> OutputDeviceError | None:
        self.saver.shutdown(wait=True, cancel_futures=True)
        return self._record_finished(self.in_flight)

    def finish(self, end: LoopEnd, completed: bool, summary: str) -> None:
        self.images = end.images
        try:
            if completed:  # the rows in the plan's order, each once
                self.manifest.compact(self.run_plan.planned_rows())
        finally:
            self.manifest.close()
        self._save_page(summary=summary, state="complete" if completed else "interrupted")

    def report(self) -> None:
        table = metric_table(self.run_plan.planned_rows()) if self.prepared.metrics else []
        if table:
            print(format_summary(table))

    @property
    def failed(self) -> int:
        return self.counts.stats["failed"]

    def summary(self, end: LoopEnd) -> str:
        return self._summary(end.images, time.perf_counter() - self.started)

    def _record_finished(self, in_flight: deque[Future]) -> OutputDeviceError | None:
        """Record the writes that finished before the run stopped; the device's error if one
        of them met it."""
        refused = None
        while in_flight:
            future = in_flight.popleft()
            if future.done() and not future.cancelled():
                try:
                    self._record(future.result())
                except OutputDeviceError as error:
                    refused = refused or error
        return refused

    def _summary(self, images: int, elapsed: float) -> str:
        verdicts = label_summary(self.run_plan.planned_rows()) if self.options.labels is not None else ""
        return (f"{run_summary(self.counts.stats, images, elapsed, self.counts.seconds)}{verdicts}; "
                f"see {self.out_dir / 'index.html'} and {self.out_dir / MANIFEST}")
