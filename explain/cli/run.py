"""``explain run``: checks the options against the model and starts the pipeline for its task,
here (the local engine) or on Ray Data (``--engine ray``, :mod:`~explain.cli.ray_engine`)."""

from __future__ import annotations

from pathlib import Path

from ..report import remove_temp_files
from .common import UsageError, _pixel_limit, _sole_run
from .inputs import collect_inputs
from .storage import is_uri


def run_command(args) -> int:
    check_display_options(args)
    if args.engine == "ray":
        from .ray_engine import run_on_ray

        return run_on_ray(args)
    for flag, value in (("--address", args.address), ("--actors", args.actors)):
        if value is not None:
            raise UsageError(f"{flag} applies to --engine ray; add --engine ray or leave {flag} out")
    if is_uri(args.out):
        raise UsageError(f"--out {args.out}: the local engine writes to a folder on this machine; folders given by "
                         "URI take --engine ray")
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file; pass a folder")
    sources = collect_inputs(args.inputs, out_dir)
    from .decoding import default_workers
    from ..models import warn_if_random as _warn_if_random
    from .preparation import prepare_run

    prepared = prepare_run(args)
    if args.workers is None:
        args.workers = default_workers(prepared.loaded.device)
    _warn_if_random(prepared.loaded, args.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _sole_run(out_dir), _pixel_limit(args.max_pixels):
        remove_temp_files(out_dir)
        return prepared.run_class(args, out_dir, sources, *prepared.run_arguments()).execute()


def check_display_options(args) -> None:
    """The options that need no model: --alpha and the colormaps."""
    if not 0.0 <= args.alpha <= 1.0:
        raise UsageError(f"--alpha must lie in 0..1, got {args.alpha}")
    import matplotlib

    if args.cmap not in matplotlib.colormaps:
        raise UsageError(f"unknown --cmap {args.cmap!r}; use a matplotlib colormap such as jet, turbo, viridis")
    if args.signed_cmap not in matplotlib.colormaps:
        raise UsageError(f"unknown --signed-cmap {args.signed_cmap!r}; use a diverging matplotlib colormap such as "
                         "RdBu_r, bwr, coolwarm")
