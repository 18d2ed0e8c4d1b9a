"""``explain run`` in this process (the local engine): plan the missing outputs, explain them
batch by batch (:func:`~explain.batch.loop.for_each_batch`, :class:`~explain.batch.explaining.GroupExplainer`),
write the overlays from a thread pool, keep the manifest and index up to date."""

from __future__ import annotations

import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..errors import out_of_memory_reason
from ..evaluation import format_summary
from ..images import IMAGE_EXTENSIONS
from ..models import warn_if_random
from ..report import ManifestRecord, remove_temp_files, write_manifest
from .decoding import DecodedBatch, crop_zoom, default_workers
from .explaining import GroupExplainer
from .ground_truth import row_marker
from .guards import pixel_limit, sole_run
from .inputs import Source, collect_inputs, input_extensions
from .kinds import file_kind
from .loop import for_each_batch
from .manifest import MANIFEST, metric_table
from .options import RunOptions
from .outcome import exit_code, interrupted_summary, out_of_memory_note, report_failure, stopped_summary
from .page import OriginalCopies, colour_scales, page_run, write_page
from .planning import RunPlan
from .preparation import PreparedRun, prepare_run
from .progress import label_summary, run_summary
from .storage import OutputDeviceError, OutputFolder, device_errors


def run_locally(options: RunOptions, out_dir: Path, sources: list[Source] | None = None) -> int:
    """``explain run`` on this machine: check the options against the model, then make the
    outputs that are missing under ``out_dir`` (of ``sources``: by default the images that
    ``options.inputs`` name); returns the exit status."""
    if sources is None:
        sources = collect_inputs(options.inputs, out_dir, input_extensions(options.model))
    out_dir.mkdir(parents=True, exist_ok=True)
    with sole_run(out_dir):  # a second run on the folder is refused before the model loads
        prepared = prepare_run(options)
        sources = _of_the_model_kind(sources, prepared.loaded.kind)
        if options.workers is None:
            options = options.replace(workers=default_workers(prepared.loaded.device))
            prepared.options = options
        warn_if_random(prepared.loaded, options.model)
        with pixel_limit(options.max_pixels):
            remove_temp_files(out_dir)
            return LocalRun(prepared, out_dir, sources).execute()


def _of_the_model_kind(sources: list[Source], kind_name: str) -> list[Source]:
    """The sources without the files found in folders that the model does not take (.npy
    arrays beside the images of an image model); files named on the command line stay, to
    fail with the reason, and so do the subfolders that could not be listed (a failed row
    each, with the reason)."""
    kind = file_kind(kind_name)
    accepts = (lambda path: Path(path).suffix.lower() in IMAGE_EXTENSIONS) if kind is None else kind.accepts
    return [source for source in sources if not source.listed or source.error or accepts(source.path)]


class LocalRun:
    """One ``explain run`` of the local engine: its plan, the rows it records, and its reports."""

    def __init__(self, prepared: PreparedRun, out_dir: Path, sources: list[Source]):
        self.prepared, self.options, self.out_dir, self.sources = prepared, prepared.options, out_dir, sources
        self.folder = OutputFolder(out_dir)
        self.explainer = GroupExplainer(prepared, report_failure)
        self.plan = RunPlan(prepared, self.explainer.outputs, self.folder, out_dir / MANIFEST)
        self.reports_written = 0.0
        self.reports_cost = 0.0
        self.seconds: dict[str, float] = {}  # method -> its time in this run
        #: --labels: each row marked with its image's label
        self.marked = row_marker(self.options.labels, prepared.task, sources, prepared.loaded.class_names)
        self.started = time.perf_counter()
        self.images = 0  # explained by this run
        self.out_of_memory = 0  # outputs failed for memory running out
        # what index.html shows of the run's settings
        self.zoom = crop_zoom(prepared.loaded.preprocess)
        self.scales = colour_scales(prepared.settings, self.options.cmap, self.options.signed_cmap)
        #: --copy-originals: the thumbnails index.html shows (None: links to the inputs)
        self.originals = OriginalCopies(self.folder) if self.options.copy_originals else None

    def _record(self, records: list[ManifestRecord]) -> None:
        for record in records:
            row = self.marked(record.row())
            self.plan.record(row)
            if row["status"] != "skipped" and row.get("seconds") is not None:
                self.seconds[row["method"]] = self.seconds.get(row["method"], 0.0) + row["seconds"]
            if row["status"] == "failed" and row.get("output"):
                report_failure(row["input"], f"{row['method']}: {row['error']}")
            self.out_of_memory += row["status"] == "failed" and out_of_memory_reason(row.get("error") or "")

    def _save_reports(self, final: bool = False, summary: str = "", state: str = "in progress") -> None:
        """Rewrite manifest.jsonl and index.html. Until the run completes, the manifest also
        keeps the earlier rows of outputs not redone yet, so that a killed run loses nothing."""
        start = time.monotonic()
        planned = self.plan.planned_rows()
        table = metric_table(planned) if self.prepared.metrics else []
        run = page_run("explain run", summary, self.plan.stats, time.perf_counter() - self.started, self.images, state,
                       self.zoom, self.scales)
        with device_errors(self.out_dir):
            write_manifest(self.out_dir / MANIFEST, planned if final else self.plan.all_rows())
            write_page(self.folder, planned, run, format_summary(table, "html") if table else "",
                       original=self.originals)
        self.reports_written = time.monotonic()
        self.reports_cost = self.reports_written - start

    def _maybe_save_reports(self) -> None:
        # Rewriting both files after every batch is cheap until they are large; this keeps
        # it under ~5 % of the run, and a kill loses at most the rows since the last write.
        if time.monotonic() - self.reports_written >= 20 * self.reports_cost:
            self._save_reports()

    def execute(self) -> int:
        for source, method, error in self.plan.make(self.sources, self.options.overwrite):
            self._record(self.explainer.failed_records(source, method, error))
        work = sorted(self.plan.pending)
        saver = ThreadPoolExecutor(max_workers=max(1, self.options.workers or 1), thread_name_prefix="explain-save")
        in_flight: deque[Future] = deque()
        limit = 2 * (1 if self.prepared.loaded.fixed_batch else self.options.batch_size) * len(self.prepared.explainers)

        def handle(batch: DecodedBatch) -> None:
            for position, error in batch.failures:
                source = self.sources[work[position]]
                report_failure(source.input, error)
                for cam in self.plan.pending[work[position]]:
                    self._record(self.explainer.failed_records(source, cam.name, error))
            for positions, images in batch.groups:
                self.images += len(positions)
                group = [(self.sources[work[p]], self.plan.pending[work[p]]) for p in positions]
                outcome = self.explainer.explain(group, images)
                self._record(outcome.failed)
                in_flight.extend(saver.submit(job.write, self.folder) for job in outcome.jobs)
            while in_flight and (in_flight[0].done() or len(in_flight) > limit):
                self._record(in_flight.popleft().result())

        self.started = time.perf_counter()
        end, completed, refused = None, False, None
        try:
            self._save_reports()
            end = for_each_batch([self.sources[i].path for i in work], self.explainer.inputs, self.prepared.loaded,
                                 self.options, handle, self._maybe_save_reports, self.prepared.costs)
            while in_flight and not end.forced:
                self._record(in_flight.popleft().result())
            completed = not end.interrupted
        except KeyboardInterrupt:
            completed = False
        except OutputDeviceError as error:  # a full disk: the outputs written so far are kept
            refused = error
        finally:
            saver.shutdown(wait=True, cancel_futures=True)
            refused = self._record_finished(in_flight) or refused
            completed = completed and refused is None
            self.images = end.images if end else 0
            counts = self._summary(self.images, time.perf_counter() - self.started)
            summary = counts if completed else interrupted_summary(counts)
            try:
                self._save_reports(final=completed, summary=summary, state="complete" if completed else "interrupted")
            except OutputDeviceError as error:  # the manifest keeps its last whole version
                refused = refused or error
        table = metric_table(self.plan.planned_rows()) if self.prepared.metrics else []
        if table:
            print(format_summary(table))
        if refused is not None:
            print(f"explain: error: {refused}", file=sys.stderr)
            summary = stopped_summary(refused, counts)
        print(summary)
        if self.out_of_memory:
            print(out_of_memory_note(self.out_of_memory), file=sys.stderr)
        return exit_code(self.plan.stats["failed"], not completed, device_error=refused is not None,
                         out_of_memory=self.out_of_memory > 0, terminated=bool(end and end.terminated))

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
        verdicts = label_summary(self.plan.planned_rows()) if self.options.labels is not None else ""
        return (f"{run_summary(self.plan.stats, images, elapsed, self.seconds)}{verdicts}; "
                f"see {self.out_dir / 'index.html'} and {self.out_dir / MANIFEST}")
