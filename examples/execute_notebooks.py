"""Run the tutorial notebooks top to bottom and save them with their fresh outputs.

    .venv/bin/python examples/execute_notebooks.py                       # every examples/*.ipynb
    .venv/bin/python examples/execute_notebooks.py 01_quickstart.ipynb   # or the ones named

Each notebook runs in a fresh ``python3`` kernel of the Python that runs this script (the
venv's, so the kernel imports the same ``explain``), with ``examples/`` as the working
directory, as Jupyter opens it. A notebook whose cell raises is left unchanged on disk and
the script exits with status 1 after trying the others. Prints each notebook's time.
``tests/test_notebooks.py`` runs them the same way (through :func:`execute`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

EXAMPLES = Path(__file__).resolve().parent
#: Seconds one cell may run before the kernel is stopped (a hang, not a slow notebook).
CELL_TIMEOUT = 600


def execute(notebook: nbformat.NotebookNode, cwd: Path = EXAMPLES, timeout: int = CELL_TIMEOUT,
            threads: int | None = None) -> nbformat.NotebookNode:
    """Execute ``notebook`` in place in a fresh kernel; raises ``CellExecutionError`` at the
    first cell that raises. jupyter_client starts the ``python3`` kernel with
    ``sys.executable``, so the kernel runs the Python (and packages) of this process.

    ``threads`` caps the kernel's CPU threads (``OMP_NUM_THREADS``, which torch reads): the
    tests run beside other test processes, and on a CPU more busy threads than cores make
    torch many times slower, not a little.
    """
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    client = NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}},
        # The kernel logs a warning that it listens on TCP without encryption; it is a fresh
        # kernel on 127.0.0.1 for this notebook alone, and the line would repeat per notebook.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )
    client.execute(env=env)
    return notebook


def notebooks(names: list[str]) -> list[Path]:
    """The notebooks named (paths, or names in examples/), or all of examples/ when none are."""
    if not names:
        return sorted(EXAMPLES.glob("*.ipynb"))
    found = []
    for name in names:
        path = Path(name) if Path(name).is_file() else EXAMPLES / Path(name).name
        if not path.is_file() or path.suffix != ".ipynb":
            raise SystemExit(f"no notebook {name}; the tutorials are: {', '.join(p.name for p in notebooks([]))}")
        found.append(path.resolve())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks to run (default: every examples/*.ipynb)")
    args = parser.parse_args(argv)
    failed = []
    for path in notebooks(args.notebooks):
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        try:
            execute(notebook)
        except CellExecutionError as error:
            print(f"{path.name}: FAILED after {time.perf_counter() - start:.1f} s, left unchanged\n{error}", file=sys.stderr)
            failed.append(path.name)
            continue
        nbformat.write(notebook, path)
        print(f"{path.name}: {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
