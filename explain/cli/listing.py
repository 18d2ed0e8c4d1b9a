"""``explain methods`` and ``explain layers``."""

from __future__ import annotations

from pathlib import Path

from ..batch.outcome import EXIT_OK


def methods_command(args) -> int:
    from .method_table import METHOD_TABLE

    print(METHOD_TABLE, end="")
    return EXIT_OK


def method_table() -> str:
    """``explain methods``' table, from the registry: method, family, whether it takes a layer,
    cost per image and target, description."""
    from ..catalogue import describe_methods

    rows = [("method", "family", "layer", "cost per image and target", "")]
    rows += [(name, info["family"], "yes" if info["needs_layer"] else "-", info["cost"], info["description"])
             for name, info in describe_methods().items()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "".join("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] + "\n"
                   for row in rows)


def write_method_table() -> None:
    """Regenerate :mod:`explain.cli.method_table` from the registry."""
    text = method_table()
    assert '"""' not in text and "\\" not in text
    Path(__file__).with_name("method_table.py").write_text(
        '"""The table ``explain methods`` prints, kept as text so that the command answers without\n'
        "importing torch and the methods (``tests/test_cli.py`` checks it against the registry).\n"
        "Regenerate it after adding or changing a method: ``python -m explain.cli.listing``.\"\"\"\n\n"
        f'METHOD_TABLE = """\\\n{text}"""\n', encoding="utf-8")


def layers_command(args) -> int:
    """The per-layer table of :func:`explain.summary` (output shape, parameters, multiply-adds,
    '*' on the automatic target layer, totals), then the candidate target layers: those with
    a spatial (N, C, H, W) output, blocks included, in execution order."""
    from ..layers import backbone_layer, candidate_layers, find_target_layer
    from ..model_summary import summary
    from ..models import load_model

    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    try:
        if loaded.task == "classify":
            auto = find_target_layer(loaded.model, loaded.example)
        else:
            auto = backbone_layer(loaded.model, loaded.example)
    except ValueError:
        auto = None
    print(summary(loaded.model, tuple(loaded.example.shape), device=loaded.device, target_layer=auto))
    print()
    infos = candidate_layers(loaded.model, loaded.example)
    if not infos:
        print(f"{args.model} has no layer with a spatial (N, C, H, W) output")
        return EXIT_OK
    print("candidate target layers (spatial outputs), in execution order:")
    name_width = max(len(info.name) for info in infos)
    type_width = max(len(info.module_type) for info in infos)
    print(f"  {'layer':<{name_width}}  {'type':<{type_width}}  output shape")
    for info in infos:
        mark = "*" if info.name == auto else " "
        shape = "x".join(map(str, info.shape[1:]))
        suffix = "  <- auto" if info.name == auto else ""
        print(f"{mark} {info.name:<{name_width}}  {info.module_type:<{type_width}}  {shape}{suffix}")
    return EXIT_OK


if __name__ == "__main__":
    write_method_table()
