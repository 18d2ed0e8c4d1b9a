"""``explain evaluate``: explain each image once per method, score every map, append the scores,
and rebuild the summary and plots. The images come from the batch jobs' one loader loop
(:func:`~explain.batch.loop.for_each_batch`); a group that runs out of device memory is scored
in halves (:func:`~explain.batch.loop.in_halves`)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import torch
from torch import Tensor

from ..errors import Option, UsageError, out_of_memory_reason
from ..evaluation import (
    Evaluation,
    evaluate,
    format_summary,
    plot_curves,
    plot_randomisation,
    plot_summary,
    read_regions,
    summary_table,
)
from ..evaluation import files as evaluation_files
from ..metrics.registry import METRICS
from ..models import LoadedModel, load_model, warn_if_random
from ..options import LOCALISATION_METRICS as LOCALISATION
from ..report import atomic_write
from .decoding import ModelInputs, default_workers, mask_geometry
from .explainers import (
    TargetSpec,
    estimated_costs,
    method_option_text,
    metric_options,
    parse_method_options,
    parse_target,
)
from .job import DatasetJob, GroupWorker
from .loop import LoopEnd, OutOfMemory, in_halves
from .manifest import safe_name
from .options import EvaluateOptions
from .outcome import report_failure
from .page import page_run, write_page
from .preparation import checked_explainers, without_concepts
from .progress import time_taken
from .storage import OutputFolder, device_errors


def _save_figure(path: Path, figure) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    atomic_write(path, buffer.getvalue())


@dataclass
class PreparedEvaluation:
    """What an evaluation needs besides its images, checked against the model (as
    :class:`~explain.batch.preparation.PreparedRun` is for a run)."""

    options: EvaluateOptions
    loaded: LoadedModel
    target: TargetSpec
    explainers: list
    layers: dict[str, str]  # method -> its layers, comma-separated
    #: method -> its --method-option settings, recorded with its scores
    method_settings: dict[str, str]
    #: method -> its estimated cost per image (a warning was printed where some cost far more)
    costs: dict[str, float]
    metrics: list[str]
    metric_options: dict
    regions: list[Tensor | None]  # each image's regions (None: none given, or none for it)


def prepare_evaluation(args: EvaluateOptions, sources: list, metrics: list[str]) -> PreparedEvaluation:
    """Load the model and check the options against it: a classifier, the target, the methods
    and their layers, the metrics' settings, the regions of ``sources``. Warns (unless quiet)
    where the weights are random and where some methods cost far more than the rest."""
    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    if loaded.task != "classify":
        raise UsageError(f"explain evaluate scores classifiers; {args.model} is a {loaded.task} model, which "
                         f"`explain run --task {loaded.task}` explains")
    options = metric_options(metrics, args.step, loaded.preprocess)
    if args.workers is None:
        args = args.replace(workers=default_workers(loaded.device))
    target = parse_target(args.target, loaded.class_names)
    method_options = parse_method_options(args.method_options)
    explainers, layers = checked_explainers(args, loaded, args.layer, target, method_options)
    scored, fix = ("explain evaluate scores the map of a target",), ("with `explain run` (no ", Option("metrics"), ")")
    explainers = without_concepts(args, explainers, scored, fix)
    settings = {cam.name: method_option_text(method_options.get(type(cam), {})) for cam in explainers}
    regions: list[Tensor | None] = [None] * len(sources)
    if args.regions is not None:
        try:
            size = (loaded.example.shape[-2], loaded.example.shape[-1])
            found = read_regions(args.regions, [s.path for s in sources], size, mask_geometry(loaded.preprocess))
        except ValueError as error:
            raise UsageError(Option("regions"), f": {error}") from None
        regions = list(found)
    warn_if_random(loaded, args.model)
    costs = estimated_costs(explainers, loaded.example, quiet=args.quiet)
    return PreparedEvaluation(args, loaded, target, explainers, layers, settings, costs, metrics, options, regions)


class EvaluationWorker(GroupWorker):
    """The evaluation's work on a group of images, where they are (this process, or a Ray
    actor, which loads the model and builds the explainers in :meth:`start`): each image's
    pending methods and metrics scored, images with the same work together; where a method or
    metric runs out of device memory on several images, each half again, down to single images
    (on one image, out of memory is that image's failure, with the reason)."""

    def __init__(self, prepared: PreparedEvaluation, pending: dict[int, dict[str, list[str]]]):
        self.options, self.metrics, self.pending = prepared.options, prepared.metrics, pending
        self.prepared: PreparedEvaluation | None = prepared
        # each pending image's regions (the plan failed the images a localisation metric has none for)
        self.regions: dict[int, Tensor] = {}
        for index in pending:
            region = prepared.regions[index]
            if region is not None:
                self.regions[index] = region

    def __getstate__(self) -> dict:  # pickled for the actors: without the model, paths absolute
        options = self.options.replace(regions=None, quiet=True).with_absolute_paths()
        return dict(self.__dict__, prepared=None, options=options)

    def start(self) -> None:
        if self.prepared is None:
            self.prepared = prepare_evaluation(self.options, [], self.metrics)

    def work(self, indices: list[int], images: Tensor) -> list[tuple[list[int], dict, Evaluation]]:
        prepared = self.prepared
        assert prepared is not None, "start() first"
        device = prepared.loaded.device
        model_input = ModelInputs(prepared.loaded.preprocess).model_input(images.to(device, non_blocking=True))
        alike: dict[tuple, list[int]] = {}
        for position, index in enumerate(indices):
            alike.setdefault(tuple((m, tuple(names)) for m, names in self.pending[index].items()), []).append(position)
        done = []
        for key, positions in alike.items():
            wanted = {method: list(names) for method, names in key}
            members = [indices[p] for p in positions]
            done += in_halves(partial(self._scored, wanted), members, model_input[positions], device)
        return done

    def _scored(self, wanted: dict, members: list[int], images: Tensor) -> tuple[list[int], dict, Evaluation]:
        prepared = cast(PreparedEvaluation, self.prepared)
        regions = None
        if any(name in LOCALISATION for names in wanted.values() for name in names):
            regions = torch.stack([self.regions[i] for i in members]).to(prepared.loaded.device)
        found = evaluate({cam.name: cam for cam in prepared.explainers}, images, wanted,
                         targets=prepared.target.targets, topk=prepared.target.topk, regions=regions,
                         options=prepared.metric_options)
        if len(members) > 1 and any(out_of_memory_reason(f["error"]) for f in found.failures):
            raise OutOfMemory
        return members, wanted, found


class EvaluationRun(DatasetJob):
    """One ``explain evaluate``: plans which (image, method, metric) scores are missing from
    scores.csv, computes them batch by batch, appends them, and rebuilds the summary."""

    def __init__(self, prepared: PreparedEvaluation, out_dir: Path, sources: list):
        self.prepared, self.out_dir, self.sources, self.loaded = prepared, out_dir, sources, prepared.loaded
        self.args = self.options = prepared.options  # what the job's loop reads (batch size, workers, --max-memory)
        self.target, self.metrics, self.regions = prepared.target, prepared.metrics, prepared.regions
        self.metric_options = prepared.metric_options
        self.explainers = {cam.name: cam for cam in prepared.explainers}
        self.method_settings, self.layers, self.costs = prepared.method_settings, prepared.layers, prepared.costs
        self.metric_of = {column: name for name, spec in METRICS.items() for column in spec.columns}
        self.inputs = ModelInputs(prepared.loaded.preprocess)
        self.scores_path, self.curves_path = out_dir / evaluation_files.SCORES, out_dir / evaluation_files.CURVES
        self.pending: dict[int, dict[str, list[str]]] = {}  # source index -> method -> metrics to compute
        self.failures: list[dict] = []
        self.reported: set[tuple[str, str]] = set()
        self.stats = {"computed": 0, "skipped": 0, "failed": 0}
        self.texts: list[tuple[str, str]] = []  # the batch's new lines of scores.csv and curves.jsonl

    def _settings(self, method: str, name: str) -> str:
        text = f"model={self.args.model} weights={self.args.weights or '-'} layer={self.layers[method]}"
        text += self.method_settings[method]
        if "step" in self.metric_options.get(name, {}):
            text += f" step={self.metric_options[name]['step']}"
        if name in LOCALISATION:
            text += f" regions={self.args.regions}"
        return text

    # -- files

    def _compact(self) -> list[dict]:
        """Rewrite scores.csv and curves.jsonl with the latest row of each key; returns the scores."""
        rows = evaluation_files.latest(evaluation_files.read_csv(self.scores_path),
                                       ("image", "method", "target", "metric"))
        evaluation_files.rewrite(self.scores_path,
                                 evaluation_files.csv_lines(rows, evaluation_files.SCORE_FIELDS, header=True))
        curves = evaluation_files.latest(evaluation_files.read_jsonl(self.curves_path),
                                         ("image", "method", "target", "metric", "curve"))
        evaluation_files.rewrite(self.curves_path, evaluation_files.jsonl_lines(curves))
        self.curves = curves
        return rows

    # -- planning

    def _make_plan(self, rows: list[dict]) -> None:
        done = {(r.get("image"), r.get("method"), r.get("target"), r.get("metric"), r.get("settings")) for r in rows}
        for index, source in enumerate(self.sources):
            for method in self.explainers:
                for name in self.metrics:
                    settings = self._settings(method, name)
                    complete = all((source.input, method, label, column, settings) in done
                                   for label in self.target.labels for column in METRICS[name].columns)
                    if source.error:
                        self._fail([index], method, [name], source.error, per_image=True)
                    elif name in LOCALISATION and self.regions[index] is None:
                        self._fail([index], method, [name], f"no region for this image in {self.args.regions}",
                                   per_image=True)
                    elif complete and not self.args.overwrite:
                        self.stats["skipped"] += 1
                    else:
                        self.pending.setdefault(index, {}).setdefault(method, []).append(name)

    # -- recording

    def _fail(self, indices: list[int], method: str, names: list[str], error: str, per_image: bool = False) -> None:
        for index in indices:
            for name in names:
                self.failures.append({"image": self.sources[index].input, "method": method, "metric": name,
                                      "error": error})
                self.stats["failed"] += 1
                self.out_of_memory += out_of_memory_reason(error)  # exit status 3
            where = self.sources[index].input if per_image else f"{method} {', '.join(names)}"
            if (where, error) not in self.reported:  # a method's or metric's error once, an image's once per image
                self.reported.add((where, error))
                report_failure(where, error)

    def _record(self, indices: list[int], wanted: dict[str, list[str]], found) -> tuple[str, str]:
        """Failures noted; the new rows of scores.csv and curves.jsonl as text."""
        for failure in found.failures:
            names = wanted[failure["method"]] if failure["metric"] is None else [failure["metric"]]
            self._fail(indices, failure["method"], names, failure["error"])
        names, labels = self.loaded.class_names, self.target.labels
        order = {name: i for i, name in enumerate(self.metrics)}
        methods = list(self.explainers)
        rows = []
        for row in found.rows:
            name = self.metric_of[row["metric"]]
            target_id = row["target_id"]
            rows.append({
                "image": self.sources[indices[row["image"]]].input, "method": row["method"],
                "target": labels[row["rank"]], "target_id": target_id,
                "target_name": names[target_id] if 0 <= target_id < len(names) else "",
                "metric": row["metric"], "value": row["value"], "layer": self.layers[row["method"]],
                "settings": self._settings(row["method"], name),
                "_order": (row["image"], methods.index(row["method"]), order[name]),
            })
        rows.sort(key=lambda r: r.pop("_order"))
        self.stats["computed"] += len({(r["image"], r["method"], self.metric_of[r["metric"]]) for r in rows})
        curves = [
            {"image": self.sources[indices[c["image"]]].input, "method": c["method"], "target": labels[c["rank"]],
             "target_id": c["target_id"], "metric": c["metric"], "curve": c["curve"],
             "settings": self._settings(c["method"], c["metric"]), "steps": c["steps"].tolist(),
             "values": c["values"].tolist(), "step_labels": list(c["step_labels"]) if c["step_labels"] else None}
            for c in found.curves
        ]
        return (evaluation_files.csv_lines(rows, evaluation_files.SCORE_FIELDS),
                evaluation_files.jsonl_lines(curves))

    # -- the job's steps (run by explain.batch.job.run_job)

    def plan(self) -> dict:
        with device_errors(self.out_dir):
            self._make_plan(self._compact())
        return self.pending

    def failed_input(self, index: int, error: str) -> None:
        for method, names in self.pending[index].items():
            self._fail([index], method, names, error, per_image=True)

    def worker(self) -> EvaluationWorker:
        return EvaluationWorker(self.prepared, self.pending)

    def take(self, indices: list[int], result: list[tuple[list[int], dict, Evaluation]]) -> None:
        """Record a group's scores (their lines appended to the files after the batch) and failures."""
        texts = [self._record(members, wanted, found) for members, wanted, found in result]
        self.texts.append(("".join(t[0] for t in texts), "".join(t[1] for t in texts)))

    def batch_done(self) -> None:
        texts, self.texts = self.texts, []
        with device_errors(self.out_dir):
            evaluation_files.append_lines(self.scores_path, "".join(t[0] for t in texts))
            evaluation_files.append_lines(self.curves_path, "".join(t[1] for t in texts))

    def finish(self, end: LoopEnd, completed: bool, summary: str) -> None:
        with device_errors(self.out_dir):
            scores = self._compact()
            write_reports(self.out_dir, scores, self.failures, self.curves)
            counts = {"ok": self.stats["computed"], "skipped": self.stats["skipped"], "failed": self.stats["failed"]}
            run = page_run("explain evaluate", summary, counts, end.elapsed, end.images,
                           "complete" if completed else "interrupted")
            table = summary_table(scores)
            write_page(OutputFolder(self.out_dir), page_rows(scores, self.failures), run,
                       format_summary(table, "html") if table else "")

    @property
    def failed(self) -> int:
        return self.stats["failed"]

    def summary(self, end: LoopEnd) -> str:
        return self._summary(end.images, end.elapsed)

    def _summary(self, images: int, elapsed: float) -> str:
        """The last line: scores computed now and skipped (each an image, method and metric), the
        images that failed, and this run's images and time."""
        failed_images = len({failure["image"] for failure in self.failures})
        failed = (f"{failed_images} image{'s' * (failed_images != 1)} failed ({self.stats['failed']} scores missing, "
                  f"see {self.out_dir / evaluation_files.FAILURES})" if failed_images else "0 images failed")
        return (f"explain: {self.stats['computed']} scored now, {self.stats['skipped']} skipped (already in "
                f"{evaluation_files.SCORES}), {failed}; {time_taken(images, elapsed, failed_images)}; "
                f"see {self.out_dir / 'index.html'}, {self.out_dir / 'summary.md'}, "
                f"{self.out_dir / evaluation_files.SCORES} and {self.out_dir / 'plots'}")


def write_reports(out: Path, rows: list[dict], failures: list[dict], curves: list[dict]) -> None:
    """Rewrite failures.csv and the summaries from every row, draw the plots, print the metric table."""
    evaluation_files.rewrite(out / evaluation_files.FAILURES,
                             evaluation_files.csv_lines(failures, evaluation_files.FAILURE_FIELDS, header=True))
    table = summary_table(rows)
    evaluation_files.rewrite(out / "summary.csv",
                             evaluation_files.csv_lines(table, evaluation_files.SUMMARY_FIELDS, header=True))
    legend = "mean ± std over images and targets; the arrow says which way is better; best per column marked"
    evaluation_files.rewrite(out / "summary.md", f"{format_summary(table, 'markdown')}\n\n{legend} in bold.\n"
                             if table else "No scores yet.\n")
    if table:
        plots = out / "plots"
        plots.mkdir(exist_ok=True)
        for name, figure in plot_curves(curves).items():
            _save_figure(plots / f"curves_{safe_name(name)}.png", figure)
        _save_figure(plots / "summary.png", plot_summary(table))
        randomisation = plot_randomisation(curves)
        if randomisation is not None:
            _save_figure(plots / "randomisation.png", randomisation)
        print(format_summary(table))
        print(legend + " with *.")


def page_rows(scores: list[dict], failures: list[dict]) -> list[dict]:
    """The rows of index.html for ``explain evaluate``: a row per image, method and target with
    its scores (``metrics``; no overlay), and a failed row per image and method that failed."""
    rows: dict[tuple, dict] = {}
    for score in scores:
        key = (score["image"], score["method"], score["target"])
        try:
            target_id = int(score["target_id"])
            value = float(score["value"])
        except (TypeError, ValueError):
            continue
        row = rows.setdefault(key, {"input": score["image"], "method": score["method"], "target": score["target"],
                                    "target_id": target_id, "target_name": score.get("target_name"),
                                    "status": "ok", "settings": score.get("settings"), "metrics": {}})
        row["metrics"][score["metric"]] = value
    for failure in failures:
        key = (failure["image"], failure["method"], None)
        error = f"{failure['metric']}: {failure['error']}"
        row = rows.setdefault(key, {"input": failure["image"], "method": failure["method"], "target": None,
                                    "status": "failed", "error": error})
        if error not in row["error"]:
            row["error"] += f"; {error}"
    return list(rows.values())
