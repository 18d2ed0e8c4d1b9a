"""The pages of the dataset analyses: ``explain strategies``' clusters in the run's explorer
(explain/viewer/strategies_view.py, explorer.js, strategies.js: a cluster per row that the grid
filters, groups and colours by, a strategies view per class with the embedding and a card per
cluster), CRAFT's page (explain/viewer/craft_page.py) and TCAV's (explain/viewer/tcav_page.py),
read back in Python and shown in headless Chromium as tests/test_viewer.py drives it.

Cheap: 12 images of the shortcut set explained by Grad-CAM with the shortcut CNN (the run of
tests/test_strategies_cli.py, smaller), clustered into two; CRAFT's folder of
tests/test_craft_cli.py, TCAV's of tests/test_tcav_cli.py. One browser for the module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest
from PIL import Image
from test_craft_cli import craft
from test_craft_cli import folder as craft_folder  # noqa: F401  (the fixture: six triangles and the CNN)
from test_strategies_cli import explain_run, shortcut_folder
from test_tcav_cli import folder as tcav_folder  # noqa: F401  (the fixture: triangles, marks, random images)
from test_tcav_cli import tcav
from test_viewer import _errors, _loaded, _open, browser  # noqa: F401  (browser: the fixture)

from explain.cli import main
from explain.data import SHORTCUT_CLASS
from explain.viewer import PageRun, read_page
from explain.viewer.craft_page import craft_page
from explain.viewer.pages import bar
from explain.viewer.strategies_view import STRATEGIES_SCRIPT, include_script, read_strategies_script
from explain.viewer.tcav_page import tcav_page

pytestmark = pytest.mark.xdist_group("browser")
IMAGES = 12
RUN = ("--method", "gradcam", "--layer", "block3", "--target", str(SHORTCUT_CLASS), "--save-maps")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """``run``: an explain run of 12 images with labels, then explain strategies (2 clusters);
    ``rerun``: a copy of it run again with one image more, ``redone``: a copy run again with
    --overwrite (the strategies of both now stale)."""
    root = shortcut_folder(tmp_path_factory.mktemp("strategy-pages"), IMAGES)
    run = root / "run"
    assert explain_run(root, run, *RUN, "--labels", str(root / "labels.csv")) == 0
    assert main(["strategies", str(run), "--clusters", "2", "--seed", "0", "--embedding", "spectral"]) == 0
    rerun = root / "rerun"
    shutil.copytree(run, rerun)
    (root / "extra").mkdir()
    shutil.copy(root / "in" / "img00.png", root / "extra" / "new.png")
    model = ["--model", str(root / "shortcut.pt"), "--trust-model-file", "-j", "0", "-q", "--device", "cpu"]
    assert main(["run", str(root / "in"), str(root / "extra"), "--out", str(rerun), *RUN, *model]) == 0  # 1 new
    redone = root / "redone"
    shutil.copytree(run, redone)
    assert main(["run", str(root / "in"), "--out", str(redone), *RUN, *model, "--overwrite"]) == 0
    return {"root": root, "run": run, "rerun": rerun, "redone": redone}


@pytest.fixture(scope="module")
def crafted(craft_folder) -> Path:  # noqa: F811
    out = craft_folder / "pages-craft"
    assert craft(craft_folder, "--out", str(out), "--crops", "2") == 0
    return out


def _strategies(run: Path) -> dict:
    page = read_page(run / "index.html")
    return read_strategies_script(page["extras"][STRATEGIES_SCRIPT])


def _manifest(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "manifest.jsonl").read_text().splitlines()]


# -- the files the pages read, without a browser


def test_the_run_page_includes_the_strategies_joined_by_each_rows_key(made):
    data = _strategies(made["run"])
    summary = json.loads((made["run"] / "strategies" / "strategies.json").read_text())
    [name] = summary
    assert [entry["name"] for entry in data["classes"]] == [name] and data["folder"] == "strategies"
    clusters = data["classes"][0]["clusters"]
    assert [c["size"] for c in clusters] == [c["size"] for c in summary[name]["clusters"]] and len(clusters) == 2
    for cluster in clusters:  # prototypes linked from the run folder
        with Image.open(made["run"] / cluster["prototype"]) as picture:
            assert picture.size == (128, 128)
    items = data["items"]
    rows = {(r["input"], r["method"], r["target"]): r for r in _manifest(made["run"])}
    keys = list(zip(items["input"], items["method"], items["target"], strict=True))
    assert sorted(keys) == sorted(rows) and len(keys) == IMAGES
    assert items["seconds"] == [rows[key]["seconds"] for key in keys]
    assert sorted(items["cluster"]) == sorted(c for c in range(2) for _ in range(clusters[c]["size"]))
    assert all(x is not None for x in items["x"] + items["y"]) and set(items["class"]) == {0}


def test_a_rerun_of_explain_run_keeps_the_strategies_in_its_page(made):
    assert STRATEGIES_SCRIPT in read_page(made["rerun"] / "index.html")["extras"]
    assert _strategies(made["rerun"]) == _strategies(made["run"])  # what the page flags as stale: in the browser
    assert len(read_page(made["rerun"] / "index.html")["images"]) == IMAGES + 1


def test_either_engines_page_includes_the_strategies_once(tmp_path):
    from explain.batch.page import write_page
    from explain.batch.storage import OutputFolder

    rows = [{"input": "a.png", "method": "gradcam", "target": "top1", "status": "ok", "output": "a.png"}]
    write_page(OutputFolder(str(tmp_path)), rows, PageRun())  # what both engines call
    assert read_page(tmp_path / "index.html")["extras"] == {}
    (tmp_path / STRATEGIES_SCRIPT).write_bytes(b'explorerStrategies = JSON.parse("{}");\n')
    write_page(OutputFolder(str(tmp_path)), rows, PageRun())
    document = (tmp_path / "index.html").read_text()
    assert list(read_page(tmp_path / "index.html")["extras"]) == [STRATEGIES_SCRIPT]
    assert include_script(document, STRATEGIES_SCRIPT) == document  # once
    assert document.index(STRATEGIES_SCRIPT) < document.index("explorerSetup.times")


def test_craft_writes_its_page_and_the_maps_it_shows(crafted):
    summary = json.loads((crafted / "craft.json").read_text())
    assert [entry["image"] for entry in summary["maps"]] == summary["images"][:2]
    for entry in summary["maps"]:
        assert entry["files"] == [f"maps/{Path(entry['image']).with_suffix('').as_posix().replace('/', '__')}__c{j}.png"
                                  for j in range(3)]
        assert all((crafted / name).is_file() for name in entry["files"])
    assert "<h2>Concepts, most important first</h2>" in (crafted / "index.html").read_text()


def test_craft_page_ranks_the_concepts_and_bars_scale_to_the_most_important():
    document = {"class": "cat<", "layer": "l", "images": ["a.png"], "crops": 4, "error": 0.25, "concepts": [
        {"concept": 0, "importance": 0.1, "importance_sd": 0.05, "best_crops": []},
        {"concept": 1, "importance": 0.4, "importance_sd": None,
         "best_crops": [{"image": "a b.png", "file": "crops/c1_0.png", "coefficient": 2.0}]},
        {"concept": 2, "importance": None, "importance_sd": None, "best_crops": []}]}
    page = craft_page(document)
    assert page.index('id="concept-1"') < page.index('id="concept-0"') < page.index('id="concept-2"')
    assert "cat&lt;" in page and "cat<" not in page and 'src="crops/c1_0.png"' in page
    assert 'style="width:25.0%"' in page and 'style="width:100.0%"' in page  # 0.1 and 0.4 of 0.4
    assert bar(0.5, 1.0, spread=0.1, dots=[0.2, float("nan")]) == (
        '<div class="bar" title=""><span class="fill" style="width:50.0%"></span>'
        '<span class="spread" style="left:40.0%;width:20.0%"></span>'
        '<span class="dot" style="left:20.0%" title="0.2"></span></div>')
    assert 'class="bar none"' in bar(None, 1.0) and 'width:100.0%' in bar(3.0, 1.0)


# -- the pages in a browser


def _rows_shown(driver) -> list[str]:
    """The rows drawn (those in sight of the virtual grid: its first 7 or so)."""
    return driver.execute_script("return [...document.querySelectorAll('#canvas .row .file')].map(e => e.textContent)")


def _clusters_in_order(driver) -> list[str]:
    """The cluster of every row the filters keep, in the grid's order: the virtual grid
    scrolled through (its rows are drawn only where in sight)."""
    return driver.execute_script("""
        const grid = document.getElementById('grid'), seen = new Map();
        for (let top = 0; ; top += 200) {
          grid.scrollTop = top;
          window.dispatchEvent(new Event('resize'));  // draws the rows in sight now
          for (const row of document.querySelectorAll('#canvas .row')) {
            seen.set(parseFloat(row.style.top), row.querySelector('.cluster-chip').dataset.cluster);
          }
          if (grid.scrollTop + grid.clientHeight >= grid.scrollHeight) break;
        }
        grid.scrollTop = 0;
        return [...seen.entries()].sort((a, b) => a[0] - b[0]).map(e => e[1]);""")


def _count(driver) -> int:
    """How many rows the filters keep ("N of M images shown")."""
    return int(driver.execute_script("return document.getElementById('shown').textContent").split(" of ")[0])


def _choose(driver, element_id: str, value: str) -> None:
    driver.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                           "e.dispatchEvent(new Event('change', {bubbles: true}))", element_id, value)


def test_the_cluster_column_filters_groups_and_colours_the_rows(browser, made):  # noqa: F811
    from selenium.webdriver.common.by import By

    _open(browser, made["run"] / "index.html")
    sizes = [c["size"] for c in _strategies(made["run"])["classes"][0]["clusters"]]
    options = browser.find_elements(By.CSS_SELECTOR, "#cluster option")
    assert [o.get_attribute("value") for o in options] == ["", "-1", "0", "1"]
    assert browser.find_element(By.ID, "cluster-control").is_displayed()
    assert _count(browser) == IMAGES and sum(sizes) == IMAGES
    for k, size in enumerate(sizes):
        _choose(browser, "cluster", str(k))
        assert _count(browser) == size
        assert set(_clusters_in_order(browser)) == {str(k)} and len(_clusters_in_order(browser)) == size
    _choose(browser, "cluster", "-1")
    assert _count(browser) == 0 and _rows_shown(browser) == []
    _choose(browser, "cluster", "")
    assert sorted(_clusters_in_order(browser)) != _clusters_in_order(browser)  # by name, the clusters mixed
    _choose(browser, "sort", "cluster-asc")  # grouped: every row of cluster 0, then of cluster 1
    assert _clusters_in_order(browser) == ["0"] * sizes[0] + ["1"] * sizes[1]
    _choose(browser, "cluster", "1")
    colours = browser.execute_script("return [...document.querySelectorAll('#canvas .cluster-chip .swatch')]"
                                     ".map(e => getComputedStyle(e).backgroundColor)")
    _choose(browser, "cluster", "0")
    colours0 = browser.execute_script("return [...document.querySelectorAll('#canvas .cluster-chip .swatch')]"
                                      ".map(e => getComputedStyle(e).backgroundColor)")
    assert len(set(colours)) == 1 and len(set(colours0)) == 1 and set(colours) != set(colours0)
    assert not browser.find_element(By.ID, "strategies-note").is_displayed()  # not stale
    assert _errors(browser) == []


def test_the_strategies_view_shows_each_cluster_and_the_embedding(browser, made):  # noqa: F811
    from selenium.webdriver.common.by import By

    _open(browser, made["run"] / "index.html")
    data = _strategies(made["run"])
    [entry] = data["classes"]
    section = browser.find_element(By.CSS_SELECTOR, "#strategies .strategy-class")
    assert section.get_attribute("data-class") == entry["name"] and f"{IMAGES} items (maps)" in section.text
    cards = section.find_elements(By.CSS_SELECTOR, "article.cluster")
    assert len(cards) == 2
    assert _loaded(browser, "#strategies .prototype img") == 2
    for card, cluster in zip(cards, entry["clusters"], strict=True):
        assert card.find_element(By.CSS_SELECTOR, ".size").text == str(cluster["size"])
        members = card.find_elements(By.CSS_SELECTOR, ".members li")
        expected = [name for name, c in zip(data["items"]["input"], data["items"]["cluster"], strict=True)
                    if c == cluster["cluster"]]
        assert [li.get_attribute("textContent") for li in members] == expected
        assert "mean probability" in card.text and "mistakes" in card.text  # --labels was given
        assert len(card.find_elements(By.CSS_SELECTOR, ".near")) == len(cluster["nearest"]) > 0
    points = section.find_elements(By.CSS_SELECTOR, "svg circle")
    assert len(points) == IMAGES
    fills = {}
    for point in points:
        fills.setdefault(point.get_attribute("data-cluster"), set()).add(point.get_attribute("fill"))
    assert sorted(fills) == ["0", "1"] and all(len(f) == 1 for f in fills.values())
    assert len(set.union(*fills.values())) == 2
    swatch = browser.execute_script("return getComputedStyle(document.querySelector('article.cluster .swatch'))"
                                    ".backgroundColor")
    point = "document.querySelector('svg circle[data-cluster=\"0\"]')"
    assert browser.execute_script(f"return getComputedStyle({point}).fill") == swatch
    # a click on a point opens its image; "show in the grid" filters the rows to the cluster
    first = points[0]
    name = data["items"]["input"][int(first.get_attribute("data-item"))]
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))", first)
    assert section.find_element(By.CSS_SELECTOR, ".embedding .hovered").text == f"{name} · {entry['name']} · c" + \
        first.get_attribute("data-cluster")
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", first)
    assert browser.find_element(By.ID, "detail").is_displayed()
    assert browser.find_element(By.CSS_SELECTOR, "#detail-body h2").text == name
    browser.find_element(By.ID, "detail-close").click()
    cards[1].find_element(By.CSS_SELECTOR, "button.show-rows").click()
    assert _count(browser) == entry["clusters"][1]["size"]
    assert _errors(browser) == []


def test_after_a_rerun_the_page_keeps_the_clusters_and_says_they_are_stale(browser, made):  # noqa: F811
    from selenium.webdriver.common.by import By

    _open(browser, made["rerun"] / "index.html")
    note = browser.find_element(By.ID, "strategies-note")
    assert note.is_displayed() and "1 map has no cluster" in note.text and "Rerun `explain strategies`" in note.text
    _choose(browser, "cluster", "-1")
    assert _rows_shown(browser) == [str(made["root"] / "extra" / "new.png")]
    _choose(browser, "cluster", "")
    assert _count(browser) == IMAGES + 1
    _choose(browser, "sort", "cluster-asc")  # the image without a cluster last
    assert browser.find_elements(By.CSS_SELECTOR, "#canvas .cluster-chip")[0].get_attribute("data-cluster") == "0"
    assert _errors(browser) == []
    _open(browser, made["redone"] / "index.html")  # every map redone by --overwrite
    note = browser.find_element(By.ID, "strategies-note")
    assert note.is_displayed() and f"{IMAGES} clustered maps were redone" in note.text
    assert _errors(browser) == []


def test_craft_page_lists_the_concepts_by_importance_with_their_crops(browser, crafted):  # noqa: F811
    from selenium.webdriver.common.by import By

    _open_static(browser, crafted / "index.html")
    summary = json.loads((crafted / "craft.json").read_text())
    rows = browser.find_elements(By.CSS_SELECTOR, "#concepts tr.concept")
    importances = [float(row.get_attribute("data-importance")) for row in rows]
    assert importances == sorted(importances, reverse=True) and len(rows) == 3
    assert [row.get_attribute("id") for row in rows] == [f"concept-{c['concept']}" for c in summary["concepts"]]
    widths = [row.find_element(By.CSS_SELECTOR, ".bar .fill").size["width"] for row in rows]
    assert widths == sorted(widths, reverse=True) and widths[0] > 0
    assert _loaded(browser, "#concepts .thumbs img") == 3 * 4  # --best 4
    assert _loaded(browser, "#maps img.concept-map") == 2 * 3  # --maps 2
    assert _errors(browser) == []


def _open_static(driver, index: Path):
    driver.get(index.as_uri())
    assert driver.execute_script("return document.readyState") == "complete"
    return driver


def test_a_class_not_clustered_is_not_stale_and_concept_clusters_list_their_concepts(browser, tmp_path):  # noqa: F811
    """A page made by hand: cats and dogs explained, only the dogs clustered (on concepts, as
    a crp run's: no prototype PNG, the cluster's top concepts instead)."""
    from selenium.webdriver.common.by import By

    from explain.viewer import page_files
    from explain.viewer.strategies_view import write_run_strategies

    rows = [{"input": f"{kind}{i}.png", "method": "crp", "target": "top1", "target_id": k, "target_name": kind,
             "status": "ok", "seconds": 0.5 + i, "predicted_id": k, "predicted_name": kind}
            for k, kind in enumerate(("cat", "dog")) for i in range(5)]
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for name, data in page_files(rows).items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    out = tmp_path / "strategies"
    out.mkdir()
    clusters = [{"cluster": c, "size": size, "nearest": [f"dog{c}.png"], "mean_probability": 0.5,
                 "mistake_share": None, "concepts": {f"layer4:{c}": 0.9}} for c, size in ((0, 3), (1, 2))]
    (out / "strategies.json").write_text(json.dumps({"dog": {"features": "concepts", "embedding": "spectral",
                                                             "items": 5, "clusters": clusters}}))
    (out / "strategies.csv").write_text("input,method,target,class,cluster,x,y,distance\n" + "".join(
        f"dog{i}.png,crp,top1,dog,{int(i >= 3)},{i},{i % 2},0.1\n" for i in range(5)))
    write_run_strategies(tmp_path, out)
    _open(browser, tmp_path / "index.html")
    assert not browser.find_element(By.ID, "strategies-note").is_displayed()  # the cats: not asked for
    _choose(browser, "cluster", "-1")
    assert _count(browser) == 5 and all(name.startswith("cat") for name in _rows_shown(browser))
    cards = browser.find_elements(By.CSS_SELECTOR, "#strategies article.cluster")
    assert ["concepts: layer4:0 0.900" in cards[0].text, "concepts: layer4:1 0.900" in cards[1].text] == [True, True]
    assert browser.find_elements(By.CSS_SELECTOR, "#strategies .prototype") == []
    assert "mistakes" not in cards[0].text  # no labels
    assert len(browser.find_elements(By.CSS_SELECTOR, "#strategies svg circle")) == 5
    assert _errors(browser) == []
    # both classes clustered: one class shown at a time, picked from a list
    summary = json.loads((out / "strategies.json").read_text())
    summary["cat"] = dict(summary["dog"], features="maps", clusters=[dict(clusters[0], size=5, concepts=None)])
    (out / "strategies.json").write_text(json.dumps(summary))
    with (out / "strategies.csv").open("a") as table:
        table.write("".join(f"cat{i}.png,crp,top1,cat,0,{i},0,0.1\n" for i in range(5)))
    write_run_strategies(tmp_path, out)
    _open(browser, tmp_path / "index.html")
    assert [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#strategy-class option")] == [
        "dog · 5 items · 2 clusters", "cat · 5 items · 1 cluster"]
    _choose(browser, "strategy-class", "1")
    section = browser.find_element(By.CSS_SELECTOR, "#strategies .strategy-class")
    assert section.get_attribute("data-class") == "cat" and len(section.find_elements(By.CSS_SELECTOR, "circle")) == 5
    _choose(browser, "cluster", "-1")
    assert _count(browser) == 0  # every image has its cluster now
    assert not browser.find_element(By.ID, "strategies-note").is_displayed()
    # an item the page does not show (an image gone, or past a huge Ray run's page): said, not called stale
    with (out / "strategies.csv").open("a") as table:
        table.write("ghost.png,crp,top1,cat,0,9,0,0.1\n")
    write_run_strategies(tmp_path, out)
    _open(browser, tmp_path / "index.html")
    assert browser.find_element(By.ID, "strategies-note").text == "Note: 1 clustered item is not on this page."
    assert _errors(browser) == []


def test_strategies_written_elsewhere_are_linked_from_the_run(made, tmp_path):
    from explain.viewer.strategies_view import strategies_data

    elsewhere = tmp_path / "horse strategies"
    shutil.copytree(made["run"] / "strategies", elsewhere)
    data = strategies_data(made["run"], elsewhere)
    assert data["items"] == _strategies(made["run"])["items"]
    for cluster in data["classes"][0]["clusters"]:
        assert cluster["prototype"].startswith("../../") and "horse%20strategies/prototypes/" in cluster["prototype"]
        assert (made["run"] / unquote(cluster["prototype"])).is_file()


@pytest.fixture(scope="module")
def tcaved(tcav_folder) -> Path:  # noqa: F811
    out = tcav_folder / "pages-tcav"
    assert tcav(tcav_folder, "--out", str(out), "--layer", "block4,") == 0
    return out


def test_tcav_page_shows_each_score_against_its_random_directions_with_its_answer(browser, tcaved):  # noqa: F811
    from selenium.webdriver.common.by import By

    summary = json.loads((tcaved / "tcav.json").read_text())
    _open_static(browser, tcaved / "index.html")
    rows = browser.find_elements(By.CSS_SELECTOR, "#scores tr.score")
    assert len(rows) == len(summary["scores"]) == 2  # one concept, two layers, one class
    for row, entry in zip(rows, summary["scores"], strict=True):
        assert row.get_attribute("data-significant") == str(entry["significant"]).lower()
        assert row.get_attribute("data-direction") == entry["direction"]
        assert len(row.find_elements(By.CSS_SELECTOR, ".bar .dot")) == len(entry["null_scores"]) == 4
        fill = row.find_element(By.CSS_SELECTOR, ".bar .fill").size["width"]
        whole = row.find_element(By.CSS_SELECTOR, ".bar").size["width"]
        assert fill / whole == pytest.approx(entry["score_mean"], abs=0.02)
        answer = row.find_element(By.CSS_SELECTOR, ".answer").text
        assert answer.startswith("significant") if entry["significant"] else answer == "not significant"
    assert "2 scores" in browser.find_element(By.ID, "counts").text
    assert _errors(browser) == []


def test_tcav_page_says_which_way_and_escapes_names():
    entry = {"concept": "<b>mark</b>", "layer": "block3", "class": "triangle", "class_id": 2, "score_mean": 0.9,
             "score_std": 0.05, "null_mean": 0.4, "p_value": 1e-4, "corrected_p": 2e-4, "significant": True,
             "direction": "+", "cav_accuracy": 0.9, "null_scores": [0.3, 0.5]}
    down = {**entry, "concept": "stripes", "score_mean": 0.1, "direction": "-"}
    neither = {**entry, "concept": "dots", "significant": False, "direction": "0", "score_mean": None}
    page = tcav_page({"scores": [entry, down, neither], "classes": [{"id": 2, "name": "triangle"}],
                      "layers": ["block3"], "random_sets": ["draw 0", "draw 1"], "alpha": 0.05, "tests": 2})
    assert "<b>mark</b>" not in page and "&lt;b&gt;mark&lt;/b&gt;" in page
    assert page.count('class="answer yes">significant (up)') == 1
    assert page.count('class="answer yes">significant (down)') == 1
    assert page.count('class="answer no">not significant') == 1
    assert '<div class="bar none"' in page  # no score: no bar
    assert "3 scores, 2 significant · 2 random sets" in page and "times 2 (Bonferroni" in page
