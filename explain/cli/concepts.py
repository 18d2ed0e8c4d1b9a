"""``explain concepts atlas`` and ``explain concepts visualize``: the options that need no
model checked here (an empty or ``auto`` --layer, --max-memory, the inputs, the concepts'
form, --out), before torch loads; then the work handed to the batch layer
(:mod:`explain.batch.concept_atlas`, :mod:`explain.batch.feature_visuals`)."""

from __future__ import annotations

from ..batch.inputs import collect_inputs
from ..batch.options import AtlasOptions, VisualizeOptions, parse_channels, parse_concept
from ..batch.storage import OutputFolder, out_folder
from ..errors import UsageError
from .checks import check_engine_options, check_max_memory


def atlas_command(args) -> int:
    options = AtlasOptions.from_values(args)
    check_atlas_options(options)  # the mistakes that show without torch: answered at once
    out_dir = out_folder(options.out)
    sources = collect_inputs(options.inputs, out_dir)  # and those in the inputs, before torch loads
    OutputFolder(out_dir).create()  # and an --out that cannot be made or written to
    from ..batch.commands import run_atlas

    return run_atlas(options, sources)


def check_atlas_options(options: AtlasOptions) -> None:
    """``explain concepts atlas``'s options that need no model."""
    check_engine_options(options)
    if options.layer.auto or not options.layer.names:
        raise UsageError(
            f"--layer: name the layer(s) of the atlas, comma-separated, such as layer4 or block3; "
            f"see `explain layers {options.model}`"
        )
    check_max_memory(options.max_memory)
    if options.channels is not None:
        try:
            parse_channels(options.channels)
        except ValueError as error:
            raise UsageError(f"--channels {options.channels}: {error}") from None


def visualize_command(args) -> int:
    options = VisualizeOptions.from_values(args).replace(batch_size=args.batch_size or 0)
    for text in options.concepts:  # their form, answered at once
        try:
            parse_concept(text)
        except ValueError as error:
            raise UsageError(f"concept {text!r}: {error}") from None
    out_dir = out_folder(options.out)
    OutputFolder(out_dir).create()  # an --out that cannot be made or written to
    from ..batch.feature_visuals import run_visualize

    return run_visualize(options)
