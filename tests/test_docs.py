"""The documentation site builds with no warning (a broken docstring, a dead cross-reference or
a bad page fails it, as ``make docs`` does), its Methods page lists every registered method with
its paper, and its API reference has an entry for every public name."""

import doctest
import html
import importlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import explain

ROOT = Path(__file__).resolve().parent.parent
#: The modules whose every public name (``__all__``) the API reference documents.
API_MODULES = ("explain", "explain.metrics", "explain.tasks", "explain.models", "explain.ray_data", "explain.analysis")

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
    """Each name has an entry in the reference (explain's on the pages of its families), and
    each page opens with a summary table that links its names."""
    every_id = set(re.findall(r'id="([^"]+)"', " ".join(p.read_text(encoding="utf-8") for p in (site / "api").glob("*.html"))))
    missing = [name for name in importlib.import_module(module).__all__
               if f"{module}.{name}" not in every_id and f"module-{module}.{name}" not in every_id]
    assert not missing, f"the API reference has no entry for {missing} of {module}"
    page = site / "api" / f"{module.split('.')[-1]}.html"
    assert re.search(r'<table class="[^"]*api-summary', page.read_text(encoding="utf-8")), f"{page.name}: no summary table"


def test_api_index_documents_the_call_and_pages_of_a_size_to_scan(site):
    """The API index says how an explainer is called and what it returns; explain's names are
    spread over pages by family, none of them the one page of 340 signatures it was."""
    index = _text(site / "api" / "index.html")
    call = index[index.index("Calling an explainer"):]
    for argument in ("images", "targets", "topk", "max_memory", "progress", "maps", "raw_layers", "probabilities"):
        assert argument in call, f"the API index does not document {argument!r}"
    assert "explainer(images, targets=None, *, topk=None, max_memory=None, progress=None)" in call
    for page, names in (("cams", ("explain.GradCAM", "explain.ScoreCAM")), ("attributions", ("explain.Lime", "explain.LRP")),
                        ("attention", ("explain.LeGrad",)), ("explain", ("explain.Explanation", "explain.overlay"))):
        ids = set(re.findall(r'id="([^"]+)"', (site / "api" / f"{page}.html").read_text(encoding="utf-8")))
        assert set(names) <= ids, f"api/{page}.html lacks {set(names) - ids}"
    explainer = (site / "api" / "explain.html").read_text(encoding="utf-8")
    assert 'id="explain.Explainer.__call__"' in explainer  # the call, with its parameters
    assert explainer.count('class="sig sig-object py"') < 150  # was 340 on one page


#: A Markdown table's delimiter row, two cells or more: what a page shows where a table did
#: not render. Sphinx's smart quotes make each cell's "---" an em dash ("|—|—|—:|").
RAW_TABLE = re.compile("(?:\\|\\s*:?[-\u2014\u2013]+:?\\s*){2,}\\|")


def test_no_page_shows_a_raw_markdown_table(site):
    """Every Markdown table renders as a table, the notebooks' text/markdown outputs (the
    result tables of tutorials 02 and 04) included: a delimiter row like |---|---| left in
    a page's text (outside code) is a table that did not render."""
    raw = []
    for page in sorted(site.rglob("*.html")):
        document = page.read_text(encoding="utf-8")
        prose = re.sub(r"<(pre|code|script|style)\b.*?</\1>", "", document, flags=re.S)
        if RAW_TABLE.search(html.unescape(re.sub(r"<[^>]+>", "", prose))):
            raw.append(str(page.relative_to(site)))
    assert not raw, f"raw Markdown tables in {raw}"
    for tutorial in ("02_comparing_methods", "04_is_the_map_faithful"):
        assert "<table" in (site / "tutorials" / f"{tutorial}.html").read_text(encoding="utf-8")


#: The width the site's code fits in furo's column at 1,400 pixels (about 90 characters).
CODE_WIDTH = 85


def _code_lines(path: Path):
    """(line number, line) of the code a Markdown page or a notebook shows: fenced blocks
    (not directives such as figures) and code cells."""
    if path.suffix == ".ipynb":
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                yield from enumerate("".join(cell["source"]).splitlines(), start=1)
        return
    fence = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opening = re.match(r"\s*(```+|~~~+)\s*(\S*)", line)
        if opening and fence is None:
            fence = opening[2] or "text"
        elif opening and line.strip() == opening[1]:
            fence = None
        elif fence is not None and not (fence.startswith("{") and fence not in ("{code-block}", "{code-cell}")):
            yield number, line


def test_code_on_the_site_fits_the_column():
    """Code examples fit furo's column without a scrollbar: the pages' fenced blocks, the
    README and the tutorials' code cells stay within CODE_WIDTH characters. (What programs
    print, and the API pages' doctests, wrap at the column's edge: docs/_static/custom.css.)"""
    sources = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md",
               *sorted((ROOT / "examples").glob("*.ipynb"))]
    wide = [f"{path.relative_to(ROOT)}:{number}: {len(line)} characters" for path in sources
            if "_build" not in path.parts and path.name != "changelog.md"
            for number, line in _code_lines(path) if len(line) > CODE_WIDTH]
    assert not wide, "code wider than the site's column:\n" + "\n".join(wide)
    css = (ROOT / "docs" / "_static" / "custom.css").read_text(encoding="utf-8")
    assert "div.cell_output pre" in css and "white-space: pre-wrap" in css


def test_tutorials_render_from_their_committed_outputs(site):
    """The six notebooks are pages, with their figures (outputs are not re-executed)."""
    pages = sorted((site / "tutorials").glob("0*.html"))
    assert [page.stem for page in pages] == sorted(path.stem for path in (ROOT / "examples").glob("*.ipynb"))
    quickstart = (site / "tutorials" / "01_quickstart.html").read_text(encoding="utf-8")
    assert "espresso" in _text(site / "tutorials" / "01_quickstart.html")
    assert re.search(r'<img[^>]+src="[^"]*\.png"', quickstart), "the quickstart's figures are missing"


def _pages_to_open(site: Path) -> list[str]:
    """Every page of the site, and of the module sources ([source] links: 60 pages of one
    template, code written to 120 characters) the one with the longest lines (143)."""
    pages = [str(page.relative_to(site)) for page in sorted(site.rglob("*.html"))
             if not {"_modules", "_static", "_sources"} & set(page.relative_to(site).parts)]
    return [*pages, "_modules/explain/explanation.html"]


def test_pages_read_without_a_horizontal_scrollbar(site):
    """At 1,400 pixels no page scrolls sideways, and nothing in one does but a table too wide
    for the column, in its own box (headless Chromium through the Debian chromedriver): the
    page itself, code, doctests and printed outputs (which wrap) included."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        scrolling = {}
        pages = _pages_to_open(site)
        assert len(pages) > 40 and "api/index.html" in pages and "tutorials/02_comparing_methods.html" in pages
        for page in pages:
            driver.get((site / page).as_uri())
            scrolling[page] = driver.execute_script(
                "const box = document.documentElement;"
                "const wide = box.scrollWidth > box.clientWidth ? ['the page'] : [];"
                "for (const e of document.querySelectorAll('article *')) {"
                "  const style = getComputedStyle(e);"
                "  if (['auto', 'scroll'].includes(style.overflowX) && e.scrollWidth > e.clientWidth + 1"
                "      && !e.classList.contains('table-wrapper'))"
                "    wide.push(e.tagName + ': ' + e.textContent.trim().slice(0, 60));"
                "}"
                "return wide;")
    finally:
        driver.quit()
    wide = {page: found for page, found in scrolling.items() if found}
    assert not wide, f"sideways scrolling at 1,400 px: {wide}"
