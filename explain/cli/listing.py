"""``explain methods`` and ``explain layers``."""

from __future__ import annotations

from ..base import describe_methods
from ..layers import candidate_layers, find_target_layer
from ..tasks import models as task_models
from .common import EXIT_OK
from .loading import load_model


def methods_command(args) -> int:
    described = describe_methods()
    rows = [("method", "family", "layer", "cost per image and target", "")]
    rows += [(name, info["family"], "yes" if info["needs_layer"] else "-", info["cost"], info["description"])
             for name, info in described.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4])
    return EXIT_OK


def layers_command(args) -> int:
    """The per-layer table of :func:`explain.summary` (output shape, parameters, multiply-adds,
    '*' on the automatic target layer, totals), then the candidate target layers: those with
    a spatial (N, C, H, W) output, blocks included, in execution order."""
    from ..model_summary import summary

    loaded = load_model(args.model, args.weights, args.trust_model_file, args.device)
    try:
        if loaded.task == "classify":
            auto = find_target_layer(loaded.model, loaded.example)
        else:
            auto = task_models.backbone_layer(loaded.model, loaded.example)
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
