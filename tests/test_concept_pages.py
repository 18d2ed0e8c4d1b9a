"""The explorer's concept pages, in headless Chromium as tests/test_viewer.py drives it: the
atlas's ``index.html`` (explain/viewer/concept_page.py: a card per concept with its RelMax and
ActMax patches, statistics, top classes and, where the folder has one, its feature
visualisation; each at its anchor LAYER:CHANNEL; search, layer and sort), and ``explain run
--method crp --atlas``'s detail view (an image's top concepts with their conditional maps and
relevances, each linking to its atlas page).

Cheap: the four-channel CNN of test_crp_cli.py on its three 24-pixel images; one atlas and
one run for the module."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image

from explain.cli import main
from explain.viewer import read_page
from test_crp_cli import folder  # noqa: F401  (the fixture: three images and the tiny CNN)
from test_viewer import _errors, _loaded, _open, _set, browser  # noqa: F401  (browser: the fixture)

pytestmark = pytest.mark.xdist_group("browser")


@pytest.fixture(scope="module")
def made(folder, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """The atlas of the three images at conv2 (with a feature visualisation of channel 1 only)
    and a run of gradcam and crp linked to it."""
    root = tmp_path_factory.mktemp("pages")
    model = ["--model", str(folder / "tiny.pt"), "--trust-model-file", "-j", "0", "-q"]
    atlas, out = root / "atlas", root / "out"
    assert main(["concepts", "atlas", str(folder / "in"), "--out", str(atlas), "--layer", "conv2", "-n", "2",
                 "-b", "2", *model]) == 0
    (atlas / "visualizations" / "conv2").mkdir(parents=True)
    Image.new("RGB", (32, 32), (200, 40, 40)).save(atlas / "visualizations" / "conv2" / "0001.png")
    assert main(["run", str(folder / "in"), "--out", str(out), "--method", "gradcam,crp", "-M", "crp:concepts=2",
                 "-M", "crp:layer=conv2", "--atlas", str(atlas), *model]) == 0
    return {"atlas": atlas, "out": out}


def _page_errors(browser) -> list[str]:  # noqa: F811
    """The console's errors, but the feature visualisations the atlas folder does not have."""
    return [error for error in _errors(browser) if "/visualizations/" not in error]


def test_the_atlas_page_shows_each_concept_with_its_patches_statistics_and_visualisation(browser, made):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    _open(browser, made["atlas"] / "index.html")
    cards = browser.find_elements(By.CSS_SELECTOR, "article.concept")
    assert [card.get_attribute("id") for card in cards] == ["conv2:0", "conv2:1", "conv2:2", "conv2:3"]
    assert browser.find_element(By.ID, "shown").text == "4 of 4 concepts shown"
    for card in cards:
        assert len(card.find_elements(By.CSS_SELECTOR, ".relmax img")) == 2
        assert len(card.find_elements(By.CSS_SELECTOR, ".actmax img")) == 2
        assert "mean activation" in card.text and "a top concept of" in card.text
    assert _loaded(browser, "article.concept .patches img") == 16  # every patch file is there
    assert "top classes: " in cards[0].text
    # the feature visualisation: shown where the folder has one (channel 1), hidden elsewhere
    WebDriverWait(browser, 10).until(lambda b: b.execute_script(
        "return [...document.querySelectorAll('figure.visual')].filter(f => f.hidden).length") == 3)
    visible = [card.get_attribute("id") for card in cards if card.find_element(By.CSS_SELECTOR, "figure.visual")
               .is_displayed()]
    assert visible == ["conv2:1"] and _loaded(browser, "#conv2\\:1 figure.visual img") == 1
    # search, sort
    _set(browser, "search", "conv2:2")
    assert [c.get_attribute("id") for c in cards if c.is_displayed()] == ["conv2:2"]
    _set(browser, "search", "")
    Select(browser.find_element(By.ID, "sort")).select_by_value("relevance")
    order = browser.execute_script("return [...document.querySelectorAll('article.concept')].map(c => c.id)")
    relevances = {c: float(browser.execute_script("return document.getElementById(arguments[0]).dataset.relevance", c))
                  for c in order}
    assert [relevances[c] for c in order] == sorted(relevances.values(), reverse=True)
    assert _page_errors(browser) == []
    # each concept its own anchor: a link to it shows it, marked
    browser.get((made["atlas"] / "index.html").as_uri() + "#conv2:3")
    assert browser.execute_script("return document.querySelector(':target').id") == "conv2:3"


def test_the_detail_view_shows_an_images_concepts_linked_to_the_atlas(browser, made):  # noqa: F811
    from selenium.webdriver.common.by import By

    _open(browser, made["out"] / "index.html")
    assert "conv2:" in browser.find_elements(By.CSS_SELECTOR, "#canvas .row .cap")[-1].text  # crp's first concept
    row = browser.find_elements(By.CSS_SELECTOR, "#canvas .row")[0]
    name = row.find_element(By.CSS_SELECTOR, ".file").text
    row.find_element(By.CSS_SELECTOR, "button.open").click()
    detail = browser.find_element(By.ID, "detail")
    assert detail.find_element(By.TAG_NAME, "h2").text == name
    section = detail.find_element(By.CSS_SELECTOR, "section.concepts-of")
    assert section.find_element(By.TAG_NAME, "h3").text.startswith("crp · top1: the concepts of ")
    captions = [f.text for f in section.find_elements(By.TAG_NAME, "figcaption")]
    page = read_page(made["out"] / "index.html")
    mine = [m for m in page["maps"] if page["images"][m["image"]]["name"] == name and m["concept"]]
    assert [c.split(" · ")[0] for c in captions] == [f"{m['concept_rank']}. {m['concept']}" for m in mine]
    shown = [float(c.split("relevance ")[1].split(" ")[0]) for c in captions]
    assert shown == pytest.approx([m["concept_relevance"] for m in mine], abs=1e-3)
    # the other methods' figures stay as they were, the concept maps are not among them
    others = detail.find_elements(By.CSS_SELECTOR, ".figures > figure:not(.concept-map) figcaption")
    assert [caption.text.split(" ·")[0] for caption in others] == ["original", "gradcam"]
    assert _loaded(browser, "section.concepts-of img") == 4  # the original under each of the 2 overlays
    links = section.find_elements(By.CSS_SELECTOR, "a.concept-link")
    assert [link.text for link in links] == [m["concept"] for m in mine]
    href = links[0].get_attribute("href")
    assert href.endswith(f"atlas/index.html#{mine[0]['concept']}")
    assert _errors(browser) == []
    browser.get(href)  # the concept's page in the atlas, the concept marked
    assert browser.execute_script("return document.querySelector(':target').id") == mine[0]["concept"]


def test_without_an_atlas_the_concepts_are_named_not_linked_and_a_bad_atlas_is_a_usage_error(
        browser, made, folder, tmp_path, capsys):  # noqa: F811
    from selenium.webdriver.common.by import By

    out = tmp_path / "out"
    shutil.copytree(made["out"], out)  # the same rows: a rerun without --atlas skips them all
    model = ["--model", str(folder / "tiny.pt"), "--trust-model-file", "-j", "0", "-q"]
    assert main(["run", str(folder / "in"), "--out", str(out), "--method", "crp", "-M", "crp:concepts=2",
                 "-M", "crp:layer=conv2", *model]) == 0
    _open(browser, out / "index.html")
    browser.find_elements(By.CSS_SELECTOR, "#canvas .row button.open")[0].click()
    section = browser.find_element(By.CSS_SELECTOR, "#detail section.concepts-of")
    assert len(section.find_elements(By.TAG_NAME, "figure")) == 2 and not section.find_elements(By.TAG_NAME, "a")
    capsys.readouterr()
    assert main(["run", str(folder / "in"), "--out", str(tmp_path / "bad"), "--method", "crp", "--atlas",
                 str(tmp_path), *model]) == 2
    assert "--atlas" in capsys.readouterr().err
