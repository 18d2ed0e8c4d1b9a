"""The tutorial notebooks in examples/: each runs top to bottom in a fresh kernel without an
error or a warning and draws its figures, and the committed copies carry outputs that match
what a fresh run gives (refresh them with ``examples/execute_notebooks.py``).

The fresh runs here take fewer or smaller inputs where a tutorial's code allows (``QUICK``):
the same code, cell by cell, in less time than the committed outputs took."""

import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
REFRESH = "refresh it with `.venv/bin/python examples/execute_notebooks.py {name}`"
#: What a test run changes in a tutorial (``execute_notebooks.with_parameters``: a name's first
#: assignment, set to this expression): one photo instead of two for every method of 02, one
#: noise sample per channel for SS-CAM and IS-CAM instead of two, 50 RISE masks instead of 300
#: and 20 Extremal Perturbations steps per area instead of 100 (the two costliest methods there:
#: 40 % of its passes at full size); in 04, 5 points per
#: deletion and insertion curve instead of 21, three of ROAD's nine removal percentages and
#: two checkpoints of the randomisation cascade instead of ten; in 07, 8 steps of feature
#: visualisation instead of 32; in 08, 96 images instead of 192 (24 triangles), 8 Sobol
#: designs instead of 16 and 10 random sets instead of 20.
QUICK = {
    "02_comparing_methods.ipynb": {"names": '["coffee"]', "SAMPLES": "1", "MASKS": "50", "STEPS": "20"},
    "04_is_the_map_faithful.ipynb": {
        "STEP": "0.25",
        "OPTIONS": '{"deletion": {"step": STEP}, "insertion": {"step": STEP}, "road": {"percentages": (30, 60, 90)}, '
                   '"randomisation": {"checkpoints": 2}}',
    },
    "07_concepts.ipynb": {"STEPS": "8"},
    "08_finding_shortcuts.ipynb": {"IMAGES": "96", "DESIGNS": "8", "RANDOM_SETS": "10"},
}


def _runner():
    """examples/execute_notebooks.py, which runs the notebooks as the maintainers refresh them."""
    spec = importlib.util.spec_from_file_location("execute_notebooks", EXAMPLES / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _kinds(cell) -> set[str]:
    """What a cell's outputs are, without their content: stream names and mime types."""
    kinds = set()
    for output in cell.outputs:
        if output.output_type == "stream":
            kinds.add(f"stream:{output.name}")
        elif output.output_type == "error":
            kinds.add("error")
        else:
            kinds.update(output.get("data", {}))
    return kinds


def _images(notebook) -> int:
    return sum("image/png" in output.get("data", {}) for cell in _code_cells(notebook) for output in cell.outputs)


def _errors(notebook) -> list[str]:
    return [f"{output.ename}: {output.evalue}" for cell in _code_cells(notebook) for output in cell.outputs
            if output.output_type == "error"]


def test_quick_runs_change_what_the_tutorials_assign():
    """Each of QUICK's names is assigned on a line of its own in its tutorial: a renamed
    variable fails here at once, not after a full-size run."""
    runner = _runner()
    for name, parameters in QUICK.items():
        quick = runner.with_parameters(nbformat.read(EXAMPLES / name, as_version=4), parameters)
        code = "\n" + "\n".join(cell.source for cell in _code_cells(quick))
        for variable, value in parameters.items():
            assert f"\n{variable} = {value}" in code, (name, variable)
    with pytest.raises(ValueError, match="assigns no nothing_here"):
        runner.with_parameters(nbformat.read(NOTEBOOKS[0], as_version=4), {"nothing_here": "1"})


def test_the_kernel_runs_this_python():
    # jupyter_client starts the python3 kernel with sys.executable; a kernelspec elsewhere
    # (~/.local/share/jupyter) that names another Python would test another install.
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys; print(sys.executable)")])
    _runner().execute(notebook)
    assert notebook.cells[0].outputs[0].text.strip() == sys.executable


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_committed_notebook_carries_its_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    refresh = REFRESH.format(name=path.name)
    counts = [cell.execution_count for cell in _code_cells(notebook)]
    assert None not in counts, f"{path.name} has cells that were not run; {refresh}"
    assert counts == list(range(1, len(counts) + 1)), f"{path.name} was not run top to bottom in one go; {refresh}"
    assert not _errors(notebook), f"{path.name} holds errors {_errors(notebook)}; {refresh}"
    assert _images(notebook) > 0, f"{path.name} holds no image/png output; {refresh}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_notebook_runs_in_a_fresh_kernel(path):
    committed = nbformat.read(path, as_version=4)
    # A copy (the file is not written), on as many threads as this test process uses
    # (conftest.py gives each of the pytest-xdist workers its share of the cores).
    runner = _runner()
    quick = runner.with_parameters(nbformat.read(path, as_version=4), QUICK.get(path.name, {}))
    fresh = runner.execute(quick, threads=torch.get_num_threads())
    assert _images(fresh) > 0, f"{path.name} drew no figure"
    for index, cell in enumerate(_code_cells(fresh), start=1):
        warnings = [output.text for output in cell.outputs if output.output_type == "stream"
                    and output.name == "stderr" and "Warning" in output.text]
        assert not warnings, f"{path.name}, code cell {index} warns: {warnings}"
    # Stale outputs: a cell that now draws, prints or shows something else than its committed copy.
    for index, (now, then) in enumerate(zip(_code_cells(fresh), _code_cells(committed)), start=1):
        assert _kinds(now) == _kinds(then), (
            f"{path.name}, code cell {index}: committed outputs {sorted(_kinds(then))}, a fresh run gives "
            f"{sorted(_kinds(now))}; {REFRESH.format(name=path.name)}")
