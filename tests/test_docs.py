"""The documentation site builds with no warning (a broken docstring, a dead cross-reference or
a bad page fails it, as ``make docs`` does), its Methods page lists every registered method with
its paper, and its API reference has an entry for every public name."""

import doctest
import html
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import explain

ROOT = Path(__file__).resolve().parent.parent
#: The modules whose every public name (``__all__``) the API reference documents.
API_MODULES = ("explain", "explain.metrics", "explain.tasks", "explain.models", "explain.ray_data")

pytestmark = pytest.mark.xdist_group("docs")  # one build at a time, on one worker


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built as ``make docs`` builds it (warnings are errors), into a temporary folder."""
    if importlib.util.find_spec("sphinx") is None:
        pytest.fail("Sphinx is missing: install the docs extra (`pip install -e '.[docs]'`, which `make test` does)")
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
               "-d", str(out / "doctrees"), str(ROOT / "docs"), str(out / "html")]
    built = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, f"the docs build failed (run `make docs`):\n{built.stderr[-6000:]}"
    assert built.stderr.strip() == "", f"the docs build warned:\n{built.stderr[-6000:]}"
    return out / "html"


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _catalogue_module():
    """docs/_ext/methods_catalogue.py, the Sphinx extension that writes the Methods page."""
    spec = importlib.util.spec_from_file_location("methods_catalogue", ROOT / "docs" / "_ext" / "methods_catalogue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_citations_are_read_from_the_docstrings():
    assert doctest.testmod(_catalogue_module()).failed == 0


def test_methods_page_lists_every_registered_method_with_its_paper(site):
    catalogue, anchor = _catalogue_module().catalogue, _catalogue_module().anchor
    page = (site / "methods.html").read_text(encoding="utf-8")
    rows = catalogue()
    assert [row["name"] for row in rows] == explain.method_names()
    for row in rows:
        assert row["paper"], f"{row['name']}: no paper found in its docstring"
        section = re.search(rf'id="{re.escape(anchor(row["name"]))}"(.*?)</section>', page, re.S)
        assert section, f"{row['name']} has no section on the Methods page"
        text = html.unescape(re.sub(r"<[^>]+>", "", section[1]))
        for shown in (row["name"], row["paper"], row["cost"], row["family"]):
            assert shown in text, f"{row['name']}: {shown!r} missing from its section"


def _plain(text: str) -> str:
    """``text`` with its Markdown code marks and Sphinx's typographic quotes and dashes undone,
    on one line."""
    for curly, straight in (("\u2019", "'"), ("\u2018", "'"), ("\u201c", '"'), ("\u201d", '"'), ("\u2013", "--")):
        text = text.replace(curly, straight)
    return " ".join(text.replace("`", "").split())


def test_every_method_has_a_formula_and_what_runs_it():
    for name in explain.method_names():
        cls = explain.method_class(name)
        assert cls.formula and cls.runs_on, f"{name}: set its class's formula and runs_on (the guide's tables)"


def test_the_guides_tables_of_methods_come_from_the_registry(site):
    """The families guide's tables (the transformers guide's for the attention methods) have a
    row for every registered method, its formula written out from its defaults, its paper."""
    catalogue = _catalogue_module().catalogue()
    pages = {page: _plain(_text(site / "guide" / f"{page}.html")) for page in ("families", "transformers")}
    for row in catalogue:
        page = pages["transformers" if row["family"] == "transformer attention" else "families"]
        for shown in (row["name"], row["formula"], row["paper"]):
            assert _plain(str(shown)) in page, f"{row['name']}: {shown!r} missing from its guide's table"


@pytest.mark.parametrize("module", API_MODULES)
def test_api_reference_has_every_public_name(site, module):
    """Each name on its module's page; a submodule (``explain.metrics``) anywhere in the reference."""
    page = site / "api" / f"{module.split('.')[-1]}.html"
    ids = set(re.findall(r'id="([^"]+)"', page.read_text(encoding="utf-8")))
    every_id = set(re.findall(r'id="([^"]+)"', " ".join(p.read_text(encoding="utf-8") for p in (site / "api").glob("*.html"))))
    missing = [name for name in importlib.import_module(module).__all__
               if f"{module}.{name}" not in ids and f"module-{module}.{name}" not in every_id]
    assert not missing, f"{page.name} has no entry for {missing}"


def test_tutorials_render_from_their_committed_outputs(site):
    """The six notebooks are pages, with their figures (outputs are not re-executed)."""
    pages = sorted((site / "tutorials").glob("0*.html"))
    assert [page.stem for page in pages] == sorted(path.stem for path in (ROOT / "examples").glob("*.ipynb"))
    quickstart = (site / "tutorials" / "01_quickstart.html").read_text(encoding="utf-8")
    assert "espresso" in _text(site / "tutorials" / "01_quickstart.html")
    assert re.search(r'<img[^>]+src="[^"]*\.png"', quickstart), "the quickstart's figures are missing"
