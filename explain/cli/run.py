"""``explain run``: the options that need no model checked here, then the run handed to the
batch layer, on this machine (:mod:`explain.batch.local_run`) or on Ray Data (``--engine ray``,
:mod:`explain.batch.ray_driver`)."""

from __future__ import annotations

from ..batch.options import RunOptions
from ..batch.storage import OutputFolder, is_uri, out_folder
from ..errors import UsageError
from .checks import check_engine_options, check_run_options


def run_command(args) -> int:
    options = RunOptions.from_values(args)
    check_run_options(options)  # the mistakes that show without torch: answered at once
    check_display_options(options)
    if options.engine == "ray":
        from ..batch.ray_driver import run_on_ray

        return run_on_ray(options)
    check_engine_options(options)
    if is_uri(options.out):
        raise UsageError(
            f"--out {options.out}: the local engine writes to a folder on this machine; folders given by "
            "URI take --engine ray"
        )
    out_dir = out_folder(options.out)
    from ..batch.inputs import collect_inputs, input_extensions  # numpy and PIL: after the checks above

    # mistakes in the inputs answer before torch loads
    sources = collect_inputs(options.inputs, out_dir, input_extensions(options.model))
    OutputFolder(out_dir).create()  # and an --out that cannot be made or written to
    from ..batch.commands import run_locally

    return run_locally(options, out_dir, sources)


def check_display_options(options: RunOptions) -> None:
    """The options that need no model: --alpha and the colormaps."""
    if not 0.0 <= options.alpha <= 1.0:
        raise UsageError(f"--alpha must lie in 0..1, got {options.alpha}")
    import matplotlib

    if options.cmap not in matplotlib.colormaps:
        raise UsageError(f"unknown --cmap {options.cmap!r}; use a matplotlib colormap such as jet, turbo, viridis")
    if options.signed_cmap not in matplotlib.colormaps:
        raise UsageError(
            f"unknown --signed-cmap {options.signed_cmap!r}; use a diverging matplotlib colormap such as "
            "RdBu_r, bwr, coolwarm"
        )
