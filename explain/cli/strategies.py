"""``explain strategies RUN_DIR``: the strategies of each class in a finished ``explain run
--save-maps`` folder (SpRAy, :func:`explain.analysis.strategies`), written by
:func:`explain.analysis.write_strategies` under RUN_DIR/strategies (or --out), and shown in the
run's ``index.html`` (:func:`explain.viewer.strategies_view.write_run_strategies`)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from ..errors import UsageError
from .common import check_out


def strategies_command(args) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "manifest.jsonl").is_file():
        raise UsageError(f"{run_dir} holds no manifest.jsonl: pass the --out folder of a finished `explain run`")
    clusters = _clusters(args.clusters)
    out = Path(args.out or run_dir / "strategies").absolute()
    if out == run_dir.absolute() or out in run_dir.absolute().parents:
        raise UsageError(
            f"--out {args.out}: the run's folder or a folder above it; give a folder of its own "
            f"(by default {run_dir / 'strategies'})"
        )
    classes = [name.strip() for name in args.classes.split(",") if name.strip()] if args.classes else None
    from ..analysis import strategies, write_strategies

    check_out(out)

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            found = strategies(
                run_dir,
                classes=classes,
                method=args.method,
                features=args.features,
                grid=args.grid,
                n_clusters=clusters,
                max_clusters=args.max_clusters,
                n_neighbors=args.neighbors,
                embedding=args.embedding,
                seed=args.seed,
            )
    except ValueError as error:
        raise UsageError(str(error)) from None
    for warning in caught:
        if str(warning.message).startswith("left out the classes"):
            print(f"explain: note: {warning.message}", file=sys.stderr)
    out = write_strategies(found, out)
    for name, result in found.items():
        sizes = ", ".join(str(cluster.size) for cluster in result.summaries)
        print(f"{name}: {len(result)} items ({result.features}), {result.n_clusters} clusters of {sizes}")
    print(f"wrote {out / 'strategies.csv'}, strategies.json and prototypes/")
    from ..viewer.strategies_view import write_run_strategies

    write_run_strategies(run_dir, out)  # the run's explorer: the cluster column and the strategies view
    print(f"see {run_dir / 'index.html'}: the strategies of each class and a cluster column in the grid")
    return 0


def _clusters(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"--clusters: 'auto' (the eigengap's) or a positive number of clusters, got {text!r}")
    return value
