"""Run the tutorial notebooks top to bottom and save them with their fresh outputs.

    .venv/bin/python examples/execute_notebooks.py                       # every examples/*.ipynb
    .venv/bin/python examples/execute_notebooks.py 01_quickstart.ipynb   # or the ones named
    .venv/bin/python examples/execute_notebooks.py --timeout 3000 --set TIMEOUT=2400 06_batch_cli.ipynb
                                                                         # on a busy machine

Each notebook runs in a fresh ``python3`` kernel of the Python that runs this script (the
venv's, so the kernel imports the same ``explain``), with ``examples/`` as the working
directory, as Jupyter opens it. A notebook whose cell raises is left unchanged on disk and
the script exits with status 1 after trying the others. Prints each notebook's time.
``tests/test_notebooks.py`` runs them the same way (through :func:`execute`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

EXAMPLES = Path(__file__).resolve().parent
#: Seconds one cell may run before the kernel is stopped (a hang, not a slow notebook).
CELL_TIMEOUT = 600


def with_parameters(notebook: nbformat.NotebookNode, parameters: dict[str, str]) -> nbformat.NotebookNode:
    """``notebook`` with the first top-level assignment of each name in ``parameters`` set to
    the Python expression given (``{"names": '["coffee"]'}``), its comment kept; a name the
    notebook never assigns is a ``ValueError``. The tests run the tutorials on fewer or
    smaller inputs this way, as far as their code allows, without a copy of them."""
    for name, value in parameters.items():
        pattern = re.compile(rf"^{re.escape(name)} = [^\n#]*?(?=\s*(#|$))", re.MULTILINE)
        cell = next((c for c in notebook.cells if c.cell_type == "code" and pattern.search(c.source)), None)
        if cell is None:
            raise ValueError(f"the notebook assigns no {name} on a line of its own")
        assignment = f"{name} = {value}"
        cell.source = pattern.sub(lambda _found, text=assignment: text, cell.source, count=1)
    return notebook


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
    # No progress bars in the outputs (tqdm reads TQDM_DISABLE): a long call's bar shows once it
    # has run a second, so the outputs would depend on the machine's speed. In Jupyter the
    # tutorials' readers see them.
    env.setdefault("TQDM_DISABLE", "1")
    # libgomp's threads spin while they wait by default, which slows torch several times over
    # where other processes share the cores (the test suite's workers); sleeping threads do not.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT,
                        help=f"seconds a cell may run (default: {CELL_TIMEOUT}; more on a busy machine)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=EXPRESSION",
                        help="run with a name's first assignment set to EXPRESSION (such as TIMEOUT=1200 for "
                        "06_batch_cli.ipynb on a busy machine); the notebook keeps its own code, with the outputs")
    args = parser.parse_args(argv)
    parameters = dict(entry.split("=", 1) for entry in args.set)
    failed = []
    for path in notebooks(args.notebooks):
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        try:
            ran = execute(with_parameters(nbformat.read(path, as_version=4), parameters), timeout=args.timeout)
            # the outputs, under the notebook's own code
            for cell, run in zip(notebook.cells, ran.cells, strict=True):
                if cell.cell_type == "code":
                    cell.outputs, cell.execution_count = run.outputs, run.execution_count
                    cell.metadata = run.metadata
        except CellExecutionError as error:
            print(f"{path.name}: FAILED after {time.perf_counter() - start:.1f} s, left unchanged\n{error}", file=sys.stderr)
            failed.append(path.name)
            continue
        nbformat.write(notebook, path)
        print(f"{path.name}: {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
