"""The dataset-scale commands' entry points, above their jobs and the engines: ``explain run``
on this machine (:func:`run_locally`), ``explain evaluate`` (:func:`run_evaluation`) and
``explain concepts atlas`` (:func:`run_atlas`). Each checks what it can before the model loads,
then hands :func:`run_command` the making of its :class:`~explain.batch.job.DatasetJob`;
:func:`run_command` is what they share: the output folder made and held by one run at a time,
the job made (the model loaded, the options checked against it), the pixel limit, the
temporary files of a run that died removed, and the job run on its engine (``--engine``: the
local loop, or Ray Data's, :func:`~explain.batch.ray_jobs.run_job_on_ray`).
(``explain run --engine ray`` has its own driver, :mod:`~explain.batch.ray_driver`.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import Option, UsageError
from ..images import IMAGE_EXTENSIONS
from ..models import warn_if_random
from ..options import LOCALISATION_METRICS as LOCALISATION
from ..report import remove_temp_files
from .concept_atlas import AtlasJob, prepare_atlas
from .decoding import default_workers
from .evaluating import EvaluationRun, prepare_evaluation
from .explainers import max_memory_option, metric_options, parse_method_options, parse_metrics
from .guards import pixel_limit, sole_run
from .inputs import Source, collect_inputs, input_extensions
from .job import DatasetJob, run_job
from .kinds import file_kind
from .local_run import LocalRun
from .options import AtlasOptions, EvaluateOptions, ModelOptions, RunOptions
from .preparation import prepare_run
from .storage import out_folder


def run_command(options: ModelOptions, out_dir: Path, command: str, make_job: Callable[[], DatasetJob]) -> int:
    """Run the job ``make_job()`` makes (loading the model) into ``out_dir``, which a second
    run of ``command`` is refused (before the model loads); the exit status."""
    if options.engine == "ray":  # said before the model loads
        from .ray_cluster import import_ray

        import_ray()
    out_dir.mkdir(parents=True, exist_ok=True)
    with sole_run(out_dir, command):
        job = make_job()
        with pixel_limit(options.max_pixels):
            remove_temp_files(out_dir)
            if options.engine == "ray":
                from .ray_jobs import run_job_on_ray

                return run_job_on_ray(job)
            return run_job(job)


def run_locally(options: RunOptions, out_dir: Path, sources: list[Source] | None = None) -> int:
    """``explain run`` on this machine: check the options against the model, then make the
    outputs that are missing under ``out_dir`` (of ``sources``: by default the images that
    ``options.inputs`` name); returns the exit status."""
    if sources is None:
        sources = collect_inputs(options.inputs, out_dir, input_extensions(options.model))
    listed = sources

    def make_job() -> LocalRun:
        prepared = prepare_run(options)
        if options.workers is None:
            prepared.options = options.replace(workers=default_workers(prepared.loaded.device))
        warn_if_random(prepared.loaded, options.model)
        return LocalRun(prepared, out_dir, of_the_model_kind(listed, prepared.loaded.kind))

    return run_command(options, out_dir, "run", make_job)


def of_the_model_kind(sources: list[Source], kind_name: str) -> list[Source]:
    """The sources without the files found in folders that the model does not take (.npy
    arrays beside the images of an image model); files named on the command line stay, to
    fail with the reason, and so do the subfolders that could not be listed (a failed row
    each, with the reason)."""
    kind = file_kind(kind_name)
    accepts = (lambda path: Path(path).suffix.lower() in IMAGE_EXTENSIONS) if kind is None else kind.accepts
    return [source for source in sources if not source.listed or source.error or accepts(source.path)]


def run_evaluation(args: EvaluateOptions, sources: list | None = None) -> int:
    """``explain evaluate``: check the options against the model, then compute the scores that are
    missing under ``args.out`` (of ``sources``: by default the images that ``args.inputs``
    name); returns the exit status."""
    out_dir = out_folder(args.out)
    metrics = parse_metrics(args.metrics, with_regions=args.regions is not None)
    max_memory_option(args.max_memory)
    if args.regions is not None:
        if not args.regions.exists():
            raise UsageError(Option("regions"), f" {args.regions}: no such file or folder")
        if not any(name in LOCALISATION for name in metrics):
            raise UsageError(
                Option("regions"), f" is read only by {', '.join(LOCALISATION)}; add one of them to ", Option("metrics")
            )
    metric_options(metrics, args.step)  # --step checked before the model loads
    parse_method_options(args.method_options)  # and --method-option
    listed = collect_inputs(args.inputs, out_dir) if sources is None else sources
    return run_command(
        args, out_dir, "evaluate", lambda: EvaluationRun(prepare_evaluation(args, listed, metrics), out_dir, listed)
    )


def run_atlas(options: AtlasOptions, sources: list[Source] | None = None) -> int:
    """``explain concepts atlas``: the atlas of the images ``options.inputs`` name (or of
    ``sources``) under ``options.out``, going on with the atlas there; the exit status."""
    out_dir = out_folder(options.out)
    max_memory_option(options.max_memory)
    listed = collect_inputs(options.inputs, out_dir) if sources is None else sources
    return run_command(
        options, out_dir, "concepts atlas", lambda: AtlasJob(prepare_atlas(options, out_dir), out_dir, listed)
    )
