"""``explain run`` for classifiers: plan the missing outputs, explain batch by batch, write
overlays from a thread pool, keep the manifest and index up to date."""

from __future__ import annotations

import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from ..methods import BaseCAM, explain_together
from ..heap import ReusedHeap
from ..evaluation import format_summary, score, summary_table
from ..metrics.registry import METRICS
from ..drawing import overlay
from ..report import encode_npz, encode_png, read_manifest, write_index, write_manifest
from .common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, MANIFEST, StopFlag, _safe, is_complete, manifest_row
from .decoding import _Decode, _Inputs, _collate, _init_worker
from .inputs import Source
from .storage import OutputFolder


class _OutOfMemory(Exception):
    """A group of images ran out of device memory: the caller explains it in halves."""


def _free_device_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _write_outputs(folder: OutputFolder, picture: np.ndarray, maps: np.ndarray, rows: list[dict],
                   npz: dict | None, cmap: str, alpha: float, signed: bool = False,
                   marks: list[dict] | None = None) -> list[dict]:
    """Overlay and save one image's maps for one method (one map per target); runs in a thread.
    ``marks`` are per map what :func:`overlay` draws on top (``boxes`` and ``labels``, ``outline``)."""
    try:
        for k, (heat, row) in enumerate(zip(maps, rows)):
            drawn = overlay(picture, heat, cmap=cmap, alpha=alpha, signed=signed, **(marks[k] if marks else {}))
            folder.write(row["output"], encode_png(drawn))
        if npz is not None:
            folder.write(rows[0]["maps"], encode_npz(**npz))
    except Exception as error:
        return [dict(row, status="failed", error=f"cannot write output: {error}") for row in rows]
    return [dict(row, status="ok") for row in rows]


def metric_table(rows) -> list[dict]:
    """The summary (mean ± std per method and column) of the metric values in manifest rows."""
    return summary_table({"method": row["method"], "metric": column, "value": value}
                         for row in rows if row.get("status") in ("ok", "skipped")
                         for column, value in (row.get("metrics") or {}).items())


class _Run:
    """One ``explain run``: plans which outputs are missing, makes them, and reports."""

    #: What the model does; the manifest's ``task``.
    task = "classify"

    def __init__(self, args, out_dir, sources, loaded, target, explainers, layers, settings,
                 metrics=(), metric_options=None):
        self.args, self.out_dir, self.sources, self.loaded = args, out_dir, sources, loaded
        self.folder = OutputFolder(out_dir)
        self.target, self.explainers, self.layers, self.settings = target, explainers, layers, settings
        self.metrics, self.metric_options = list(metrics), metric_options or {}
        self.metric_columns = [column for name in self.metrics for column in METRICS[name].columns]
        self.reported: set[str] = set()
        self.inputs = _Inputs(loaded.preprocess)
        self.rows: dict[tuple, dict] = {}  # the manifest's rows by (input, method, target), once planned
        self.plan: list[tuple] = []  # every output of this run, in manifest order
        self.pending: dict[int, list] = {}  # source index -> explainers still to run
        self.stats = {"ok": 0, "skipped": 0, "failed": 0}
        self.reports_written = 0.0
        self.reports_cost = 0.0

    # -- planning

    def _keys(self, source: Source, method: str) -> list[tuple]:
        return [(source.input, method, label) for label in self.target.labels]

    def _complete(self, key: tuple) -> bool:
        return is_complete(self.rows.get(key), self.folder.is_file, self.settings.get(key[1]), self.layers.get(key[1]),
                           self.args.save_maps, self.metric_columns)

    def _read_manifest(self) -> None:
        for row in read_manifest(self.out_dir / MANIFEST):
            self.rows[(row.get("input"), row.get("method"), row.get("target"))] = row

    def _make_plan(self) -> None:
        self._read_manifest()
        for index, source in enumerate(self.sources):
            for cam in self.explainers:
                keys = self._keys(source, cam.name)
                self.plan.extend(keys)
                if source.error:
                    self._fail(source, cam.name, source.error)
                elif not self.args.overwrite and all(self._complete(key) for key in keys):
                    for key in keys:
                        self.rows[key] = dict(self.rows[key], status="skipped", error=None)
                        self.stats["skipped"] += 1
                else:
                    self.pending.setdefault(index, []).append(cam)

    # -- rows

    def _row(self, source: Source, method: str, label: str, **values) -> dict:
        return manifest_row(source.input, method, label, self.layers[method], self.settings[method], self.task,
                            **values)

    def _record(self, rows: list[dict]) -> None:
        for row in rows:
            self.rows[(row["input"], row["method"], row["target"])] = row
            self.stats[row["status"]] += 1
            if row["status"] == "failed" and row.get("output"):
                self._report_error(row["input"], f"{row['method']}: {row['error']}")

    def _fail(self, source: Source, method: str, error: str) -> None:
        self._record([self._row(source, method, label, status="failed", error=error)
                      for label in self.target.labels])

    def _report_error(self, where: str, error: str) -> None:
        tqdm.write(f"explain: failed: {where}: {error}", file=sys.stderr)

    def _save_reports(self, final: bool = False, summary: str = "") -> None:
        """Rewrite manifest.jsonl and index.html. Until the run completes, the manifest also
        keeps the earlier rows of outputs not redone yet, so that a killed run loses nothing."""
        start = time.monotonic()
        planned = [self.rows[key] for key in self.plan if key in self.rows]
        write_manifest(self.out_dir / MANIFEST, planned if final else list(self.rows.values()))
        table = self._metric_table(planned)
        write_index(self.out_dir, planned, summary or "in progress", format_summary(table, "html") if table else "")
        self.reports_written = time.monotonic()
        self.reports_cost = self.reports_written - start

    def _metric_table(self, rows: list[dict]) -> list[dict]:
        """The summary of the metric values of ``rows`` (mean ± std per method and column)."""
        return metric_table(rows) if self.metrics else []

    def _scores(self, cam, images: Tensor, result) -> dict[tuple[int, int], dict]:
        """--metrics for one method's explanation of a batch: {(image, target rank): {column: value}};
        a metric that fails is reported and left out."""
        found = score(cam, images, result, self.metrics, options=self.metric_options, method=cam.name)
        for failure in found.failures:
            message = f"{cam.name} {failure['metric']}: {failure['error']}"
            if message not in self.reported:
                self.reported.add(message)
                self._report_error("--metrics", message)
        values: dict[tuple[int, int], dict] = {}
        for row in found.rows:
            values.setdefault((row["image"], row["rank"]), {})[row["metric"]] = round(row["value"], 6)
        return values

    def _maybe_save_reports(self) -> None:
        # Rewriting both files after every batch is cheap until they are large; this keeps
        # it under ~5 % of the run, and a kill loses at most the rows since the last write.
        if time.monotonic() - self.reports_written >= 20 * self.reports_cost:
            self._save_reports()

    # -- the loop

    def execute(self) -> int:
        self._make_plan()
        work = sorted(self.pending)
        args = self.args
        batch_size = 1 if self.loaded.fixed_batch else args.batch_size
        example = self.loaded.example
        loader = torch.utils.data.DataLoader(
            _Decode([self.sources[i].path for i in work], self.inputs.in_workers, 2 * max(example.shape[-2:])),
            batch_size=batch_size,
            num_workers=args.workers,
            collate_fn=_collate,
            pin_memory=self.loaded.device.type == "cuda",
            worker_init_fn=partial(_init_worker, args.max_pixels),
        )
        progress = tqdm(total=len(work), unit="img", disable=args.quiet or not work, file=sys.stderr, dynamic_ncols=True)
        saver = ThreadPoolExecutor(max_workers=max(1, args.workers), thread_name_prefix="explain-save")
        in_flight: deque[Future] = deque()
        stop = StopFlag()
        started = time.perf_counter()
        done = 0
        interrupted = completed = False
        try:
            with stop, ReusedHeap() as heap:
                self._save_reports()
                for batch in loader:
                    for index, error in batch.failures:
                        source = self.sources[work[index]]
                        self._report_error(source.input, error)
                        for cam in self.pending[work[index]]:
                            self._fail(source, cam.name, error)
                    for indices, images in batch.groups:
                        self._explain_in_halves([work[i] for i in indices], images, saver, in_flight)
                    while in_flight and (in_flight[0].done() or len(in_flight) > 2 * batch_size * len(self.explainers)):
                        self._record(in_flight.popleft().result())
                    count = len(batch.failures) + sum(len(i) for i, _ in batch.groups)
                    done += count
                    progress.update(count)
                    self._maybe_save_reports()
                    heap.after_batch()
                    if stop.set:
                        interrupted = True
                        break
                while in_flight:
                    self._record(in_flight.popleft().result())
                completed = not interrupted
        except KeyboardInterrupt:
            interrupted = True
        finally:
            saver.shutdown(wait=True, cancel_futures=True)
            while in_flight:
                future = in_flight.popleft()
                if future.done() and not future.cancelled():
                    self._record(future.result())
            progress.close()
            summary = self._summary(done, time.perf_counter() - started, not completed)
            self._save_reports(final=completed, summary=summary)
        table = self._metric_table([self.rows[key] for key in self.plan if key in self.rows])
        if table:
            print(format_summary(table))
        print(summary)
        if interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if self.stats["failed"] else EXIT_OK

    def _explain_in_halves(self, source_indices: list[int], images: Tensor, saver, in_flight: deque) -> None:
        """:meth:`_explain`, and where a group of images runs out of device memory, each half
        of it again, down to single images (an image that alone does not fit fails with the
        reason); nothing of the group that ran out is written twice."""
        try:
            self._explain(source_indices, images, saver, in_flight)
        except _OutOfMemory:
            _free_device_memory(self.loaded.device)
            half = len(source_indices) // 2
            for part in (slice(0, half), slice(half, None)):
                self._explain_in_halves(source_indices[part], images[part], saver, in_flight)

    def _explain(self, source_indices: list[int], images: Tensor, saver, in_flight: deque) -> None:
        model_input = self.inputs.model_input(images.to(self.loaded.device, non_blocking=True))
        pictures = self.inputs.pictures(images, model_input)
        cams = [cam for cam in self.explainers if any(cam in self.pending[i] for i in source_indices)]
        # One bad batch must not end the run, nor one method fail the others. The CAMs share
        # one forward and backward pass; the other methods run, and may fail, on their own.
        targets, topk = self.target.targets, self.target.topk
        shared = [cam for cam in cams if isinstance(cam, BaseCAM)]
        outcome: dict = {}
        try:
            outcome.update(zip(shared, explain_together(shared, model_input, targets, topk=topk)))
        except Exception:
            pass  # each CAM on its own, below, so that the error lands on the one that fails
        for cam in cams:
            if cam not in outcome:
                try:
                    outcome[cam] = cam(model_input, targets, topk=topk)
                except Exception as error:
                    outcome[cam] = error
        results = [outcome[cam] for cam in cams]
        if len(source_indices) > 1 and any(isinstance(result, torch.OutOfMemoryError) for result in results):
            raise _OutOfMemory
        for cam, result in zip(cams, results):
            if isinstance(result, Exception):
                for i in source_indices:
                    if cam in self.pending[i]:
                        self._report_error(self.sources[i].input, f"{cam.name}: {result}")
                        self._fail(self.sources[i], cam.name, f"{type(result).__name__}: {result}")
        done = [(cam, result) for cam, result in zip(cams, results) if not isinstance(result, Exception)]
        if not done:
            return
        best_probability, best_id = done[0][1].logits.float().softmax(dim=1).max(dim=1)
        best_probability, best_id = best_probability.cpu().tolist(), best_id.cpu().tolist()
        names = self.loaded.class_names
        for cam, result in done:
            scores = self._scores(cam, model_input, result) if self.metrics else {}
            maps, ids, probabilities = result.maps, result.targets, result.probabilities
            if maps.dim() == 3:
                maps, ids, probabilities = maps[:, None], ids[:, None], probabilities[:, None]
            maps, ids, probabilities = maps.cpu().numpy(), ids.cpu().tolist(), probabilities.cpu().tolist()
            one_target = result.targets.dim() == 1  # raw then lacks the targets' axis
            raw = {name: (r[:, None] if one_target else r).cpu().numpy() for name, r in result.raw_layers.items()}
            for j, i in enumerate(source_indices):
                if cam not in self.pending[i]:
                    continue
                source = self.sources[i]
                prefix = f"{source.folder}/{source.stem}" if source.folder else source.stem
                rows = [
                    self._row(
                        source, cam.name, label,
                        target_id=class_id, target_name=names[class_id],
                        target_probability=round(probability, 6),
                        predicted_id=best_id[j], predicted_name=names[best_id[j]],
                        predicted_probability=round(best_probability[j], 6),
                        output=f"{prefix}__{_safe(cam.name)}__{class_id}-{_safe(names[class_id])}.png",
                        maps=f"{prefix}__{_safe(cam.name)}.npz" if self.args.save_maps else None,
                        metrics=scores.get((j, rank)),
                    )
                    for rank, (label, class_id, probability) in enumerate(zip(self.target.labels, ids[j], probabilities[j]))
                ]
                npz = None
                if self.args.save_maps:
                    npz = {"maps": maps[j], "targets": np.asarray(ids[j])}
                    npz.update({f"raw_{name}": r[j] for name, r in raw.items()})
                in_flight.append(saver.submit(
                    _write_outputs, self.folder, pictures[j], maps[j], rows, npz,
                    self.args.signed_cmap if result.signed else self.args.cmap, self.args.alpha, result.signed,
                ))

    def _summary(self, images: int, elapsed: float, interrupted: bool) -> str:
        ok, skipped, failed = self.stats["ok"], self.stats["skipped"], self.stats["failed"]
        rate = images / elapsed if elapsed > 0 else 0.0
        text = (
            f"explain: {ok} ok, {skipped} skipped (already complete), {failed} failed; "
            f"{images} images in {elapsed:.1f} s ({rate:.2f} images/s); "
            f"see {self.out_dir / 'index.html'} and {self.out_dir / MANIFEST}"
        )
        if interrupted:
            text = "explain: interrupted, run the same command again to finish. " + text[len("explain: "):]
        return text


def _rounded(value: float | None) -> float | None:
    return None if value is None or value != value else round(float(value), 6)
