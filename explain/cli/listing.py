"""``explain methods``, ``explain layers`` and ``explain samples``."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from ..batch.outcome import EXIT_OK
from ..options import SAMPLE_PHOTOS

METHOD_HEADER = ("method", "family", "layer", "cost per image and target", "description")
#: Spaces between the columns of a table.
GAP = 2


def methods_command(args) -> int:
    from .method_table import METHOD_ROWS

    width = shutil.get_terminal_size().columns  # COLUMNS where set, else the terminal's, else 80
    print(fit_table(METHOD_HEADER, METHOD_ROWS, width - 1, wrapped=(1, 3, 4)), end="")
    return EXIT_OK


def samples_command(args) -> int:
    """The folder of the sample photos (:func:`explain.data.sample_folder`), found without
    importing :mod:`explain.data`, whose other data may need torch."""
    print(Path(__file__).resolve().parents[1].joinpath(*SAMPLE_PHOTOS))
    return EXIT_OK


def method_rows() -> tuple[tuple[str, ...], ...]:
    """``explain methods``' rows, from the registry: method, family, whether it takes a layer,
    cost per image and target, description."""
    from ..catalogue import describe_methods

    return tuple(
        (name, str(info["family"]), "yes" if info["needs_layer"] else "-", str(info["cost"]), str(info["description"]))
        for name, info in describe_methods().items()
    )


def fit_table(header: tuple[str, ...], rows, width: int = 0, wrapped: tuple[int, ...] = ()) -> str:
    """An aligned table with a heading on every column, its lines at most ``width`` long where
    the longest words allow. The columns in ``wrapped`` share the room the others leave in
    proportion to their cells' mean length (so that their cells wrap onto about as many lines),
    each between its longest word and its longest cell, and wrap at spaces (textwrap).

    >>> print(fit_table(("name", "about"), [("ig", "a path from a baseline")], width=17, wrapped=(1,)), end="")
    name  about
    ig    a path from
          a baseline
    """
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    room = width - GAP * (len(header) - 1) - sum(widths[i] for i in range(len(header)) if i not in wrapped)
    if wrapped and sum(widths[i] for i in wrapped) > room:
        widths = _shared_widths(table, widths, list(wrapped), room)
    lines = []
    for row in table:
        cells = [
            textwrap.wrap(cell, widths[i], break_long_words=False, break_on_hyphens=False) or [""]
            for i, cell in enumerate(row)
        ]
        for depth in range(max(map(len, cells))):
            parts = [(cell[depth] if depth < len(cell) else "").ljust(widths[i]) for i, cell in enumerate(cells)]
            lines.append((" " * GAP).join(parts).rstrip())
    return "".join(line + "\n" for line in lines)


def _shared_widths(table, widths: list[int], wrapped: list[int], room: int) -> list[int]:
    """``widths`` with the ``wrapped`` columns' share of ``room``: in proportion to their mean
    cell length, none below its longest word nor above its longest cell."""
    widths = list(widths)
    floors = {i: max(len(word) for row in table for word in row[i].split() or [""]) for i in wrapped}
    weights = {i: sum(len(row[i]) for row in table) for i in wrapped}
    open_columns = list(wrapped)
    while open_columns:
        total = sum(weights[i] for i in open_columns) or 1
        share = {i: room * weights[i] // total for i in open_columns}
        clamped = [i for i in open_columns if not floors[i] <= share[i] <= widths[i]]
        if not clamped:
            for i in open_columns:
                widths[i] = share[i]
            break
        for i in clamped:
            widths[i] = min(max(share[i], floors[i]), widths[i])
            room -= widths[i]
            open_columns.remove(i)
    return widths


def write_method_table() -> None:
    """Regenerate :mod:`explain.cli.method_table` from the registry."""
    rows = "".join(f"    {row!r},\n" for row in method_rows())
    Path(__file__).with_name("method_table.py").write_text(
        '"""The rows ``explain methods`` prints, kept as text so that the command answers without\n'
        "importing torch and the methods (``tests/test_cli.py`` checks them against the registry).\n"
        "Generated from the registry by ``python -m explain.cli.listing``: run it after adding or\n"
        'changing a method."""\n\n'
        f"METHOD_ROWS = (\n{rows})\n",
        encoding="utf-8",
    )


KINDS = {"classify": "classifier", "segment": "segmentation model", "detect": "detection model"}
#: The most layers ``explain layers`` lists without --all (the automatic choice aside).
SHORT_LIST = 30


def layers_command(args) -> int:
    """A summary of the model (task, totals, the automatic target layer) and its main candidate
    target layers; with ``--all``, the per-layer table of :func:`explain.summary` (output shape,
    parameters, multiply-adds, '*' on the automatic target layer, totals), then every candidate
    target layer: those with a spatial (N, C, H, W) output, blocks included, in execution order."""
    from ..layers import candidate_layers
    from ..model_summary import summary
    from ..models import load_model

    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    auto = _automatic_layer(loaded)
    table = summary(loaded.model, tuple(loaded.example.shape), device=loaded.device, target_layer=auto)
    infos = candidate_layers(loaded.model, loaded.example)
    if args.all:
        print(table)
        print()
    else:
        print(f"{args.model}: {KINDS[loaded.task]}, {table.totals()[len('total: ') :]}")
        picked = next(
            (
                f"{auto} ({row.module_type}, output {'x'.join(map(str, row.output_shape[1:]))})"
                for row in table.rows
                if row.name == auto and row.output_shape
            ),
            auto,
        )
        print(f"automatic target layer (--layer auto): {picked or 'none found, pass --layer'}\n")
    if not infos:
        print(f"{args.model} has no layer with a spatial (N, C, H, W) output")
        return EXIT_OK
    shown = infos if args.all else main_layers(infos, auto)
    heading = "candidate target layers" if args.all else "main candidate target layers"
    print(f"{heading} (spatial outputs), in execution order; * marks the automatic choice:")
    rows = [
        ("*" if info.name == auto else " ", info.name, info.module_type, "x".join(map(str, info.shape[1:])))
        for info in shown
    ]
    print(fit_table(("", "layer", "type", "output shape"), rows), end="")
    if not args.all:
        print(
            f"\n{len(shown)} of {len(infos)} candidates shown; every layer, with its parameters and "
            f"multiply-adds: explain layers {args.model} --all"
        )
    return EXIT_OK


def _automatic_layer(loaded) -> str | None:
    """The layer ``--layer auto`` picks, None where none is found."""
    from ..layers import backbone_layer, find_target_layer

    try:
        if loaded.task == "classify":
            return find_target_layer(loaded.model, loaded.example)
        return backbone_layer(loaded.model, loaded.example)
    except ValueError:
        return None


def main_layers(infos: list, auto: str | None, limit: int = SHORT_LIST) -> list:
    """The candidate layers a person would pick from: those nested least deep (stages and
    blocks), down to the deepest level that keeps them at ``limit`` or fewer (the top level
    always), ``Identity`` modules aside; and the automatic choice, wherever it is.

    >>> from explain.layers import LayerInfo
    >>> infos = [LayerInfo(n, "Conv2d", (1, 8, 4, 4)) for n in ("a.0.conv", "a.0", "a.1.conv", "a.1", "a", "b")]
    >>> [info.name for info in main_layers(infos, "a.1.conv", limit=4)]
    ['a.0', 'a.1.conv', 'a.1', 'a', 'b']
    """
    kept = [info for info in infos if info.module_type != "Identity"]
    depth = 1
    while (
        any(info.name.count(".") >= depth for info in kept)
        and sum(info.name.count(".") <= depth for info in kept) <= limit
    ):
        depth += 1
    return [info for info in infos if (info in kept and info.name.count(".") < depth) or info.name == auto]


if __name__ == "__main__":
    write_method_table()
