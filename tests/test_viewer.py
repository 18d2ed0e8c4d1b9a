"""index.html, the explorer (explain/viewer/): its data files read back, ``--labels``, and the
page itself in a real browser (headless Chromium driven by Selenium through the Debian
chromedriver; no download). Without Chromium the browser tests are skipped: on Debian or
Ubuntu, ``apt-get install chromium chromium-driver`` (CI's ``.ci/run`` does).

One browser serves the module, and the module's tests run in one xdist group. The runs are
made in-process with a tiny model exported to a ``.pt2`` file, on small noise images."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from explain.batch.ground_truth import labels_of, mark, read_labels
from explain.batch.inputs import collect_inputs
from explain.cli import main
from explain.errors import UsageError
from explain.viewer import DATA_FOLDER, PageRun, link, page_files, read_data_file, read_page, stale_data_files

pytestmark = pytest.mark.xdist_group("browser")

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)
NO_BROWSER = ("no Chromium and chromedriver on this machine: install them (Debian, Ubuntu: "
              "apt-get install chromium chromium-driver) to run the explorer's browser tests")
IMAGES = 6  # noise images, and one broken file


def _noise(seed: int, size=(48, 40)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A folder of images, a tiny model and labels; an explain run on them (``first``: its page
    copied away) and the same run again (``out``, every output done before)."""
    root = tmp_path_factory.mktemp("viewer")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)).eval()
    dims = ({0: torch.export.Dim("batch", min=1, max=64)},)
    torch.export.save(torch.export.export(model, (torch.rand(2, 3, 64, 64),), dynamic_shapes=dims), root / "tiny.pt2")
    photos = root / "photos"
    photos.mkdir()
    for i in range(IMAGES):
        _noise(i, (48 + 8 * i, 40)).save(photos / f"p{i}.png")
    (photos / "broken.png").write_bytes(b"not a png")
    # labels by id, relative to the CSV's folder; one image left without
    (root / "labels.csv").write_text("path,label\n" + "".join(f"photos/p{i}.png,{i % 5}\n" for i in range(IMAGES - 1)))
    command = ["run", str(photos), "--out", str(root / "out"), "--model", str(root / "tiny.pt2"),
               "--method", "gradcam,saliency", "--workers", "0", "-q", "--labels", str(root / "labels.csv")]
    assert main(command) == 1  # the broken file fails
    shutil.copytree(root / "out", root / "first")
    assert main(command) == 1
    return {"root": root, "first": root / "first", "out": root / "out"}


def _manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


# -- the data files, without a browser


def test_data_files_round_trip_every_field():
    rows = [
        {"input": "b.png", "method": "gradcam", "target": "top1", "target_id": 3, "target_name": "cat",
         "target_probability": 0.5, "predicted_id": 3, "predicted_name": "cat", "predicted_probability": 0.5,
         "output": "b__gradcam.png", "status": "ok", "settings": "cmap=jet", "seconds": 0.25,
         "metrics": {"deletion": 0.125, "sparseness": float("nan")}, "label_id": 2, "label_name": "dog",
         "correct": False},
        {"input": "b.png", "method": "saliency", "target": "top1", "status": "failed", "error": "out of memory"},
        {"input": os.fsdecode(b"A\xe9.png"), "method": "gradcam", "target": "top1", "target_id": 2,
         "target_name": "dog", "output": "gone.png", "status": "skipped"},
    ]
    files = page_files(rows, PageRun(counts={"ok": 1, "skipped": 1, "failed": 1}, seconds=1.5),
                       exists=lambda output: output != "gone.png", original=lambda source: "../" + link(source))
    assert list(files)[-1] == "index.html" and len(files) == 2
    chunk = read_data_file(files[next(iter(files))])
    assert chunk["images"] == {"name": ["b.png", "A\\xe9.png"], "original": ["../b.png", "../A%E9.png"],
                               "predicted": [3, None], "probability": [0.5, None], "label": [2, None],
                               "correct": [0, None], "rank": [1, 0]}
    maps = chunk["maps"]
    assert maps["image"] == [0, 0, 1] and maps["status"] == [0, 2, 1] and maps["method"] == [0, 1, 0]
    assert maps["output"] == ["b__gradcam.png", None, None]
    assert maps["error"] == [None, "out of memory", "output file missing"]
    assert maps["metrics"] == [[0, 0, 0.125], [0, 1, None]] and maps["seconds"] == [0.25, None, None]


def test_read_page_gives_back_the_rows_and_a_rewrite_leaves_no_stale_data(tmp_path, monkeypatch):
    import explain.viewer

    monkeypatch.setattr(explain.viewer, "IMAGES_PER_FILE", 2)
    rows = [{"input": f"{name}.png", "method": "gradcam", "target": "top1", "target_id": 1, "target_name": "x",
             "output": f"{name}.png", "status": "ok", "metrics": {"deletion": i / 10}}
            for i, name in enumerate("edcba")]
    files = page_files(rows, PageRun(summary="</script><b>"))
    assert len(files) == 4  # 3 data files of at most 2 images
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    page = read_page(tmp_path / "index.html")
    assert page["run"]["summary"] == "</script><b>" and "</script><b>" not in files["index.html"].decode()
    assert [image["name"] for image in page["images"]] == [row["input"] for row in rows]
    assert [image["rank"] for image in page["images"]] == [4, 3, 2, 1, 0]
    assert [m["metrics"] for m in page["maps"]] == [{"deletion": i / 10} for i in range(5)]
    assert [page["images"][m["image"]]["name"] for m in page["maps"]] == [row["input"] for row in rows]
    again = page_files(rows)
    written = [Path(name).name for name in files if name.startswith(DATA_FOLDER)]
    assert sorted(stale_data_files([*written, "notes.txt"], again)) == sorted(written)


def test_labels_by_id_or_name_matched_by_path(tmp_path):
    (tmp_path / "in").mkdir()
    for name in ("a.png", "b.png", "c.png"):
        _noise(0).save(tmp_path / "in" / name)
    (tmp_path / "labels.csv").write_text("in/a.png,Cat\n" + f"{tmp_path / 'in' / 'b.png'},2\n" + "other.png,dog\n")
    labels = read_labels(tmp_path / "labels.csv", ["bird", "cat", "dog"])
    sources = collect_inputs([str(tmp_path / "in")], tmp_path / "out")
    found = labels_of(sources, labels)
    by_name = {Path(k).name: v for k, v in found.items()}
    assert by_name == {"a.png": 1, "b.png": 2}  # c.png has none; other.png is no input
    row = {"input": sources[0].input, "predicted_id": 1}
    assert mark(row, found, ["bird", "cat", "dog"]) == dict(row, label_id=1, label_name="cat", correct=True)
    assert mark({"input": sources[2].input, "predicted_id": 1}, found, ["bird", "cat", "dog"])["correct"] is None


@pytest.mark.parametrize("text, message", [
    ("a.png,cat\nb.png,zebra\n", "line 2: 'zebra' is neither a class id (0..2) nor a class name"),
    ("a.png,7\n", "line 1: '7' is neither a class id (0..2)"),
    ("a.png,Catt\n", "line 1: 'Catt' is neither a class id (0..2) nor a class name of the model; did you mean: 'cat'?"),
    ("a.png\n", "line 1: expected `path,label`"),
])
def test_a_bad_labels_line_is_a_usage_error_naming_it(tmp_path, text, message):
    (tmp_path / "labels.csv").write_text(text)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_labels(tmp_path / "labels.csv", ["bird", "cat", "dog"])


def test_runs_record_the_labels_and_a_resume_the_truth(runs):
    rows = _manifest(runs["out"])
    verdicts = {(Path(r["input"]).name, r["method"]): (r["label_id"], r["correct"]) for r in rows}
    for r in rows:
        if r["status"] != "failed" and Path(r["input"]).name != "p5.png":
            assert r["label_id"] == int(Path(r["input"]).stem[1]) % 5
            assert r["correct"] == (r["predicted_id"] == r["label_id"])
    assert verdicts[("p5.png", "gradcam")] == (None, None)
    run = read_page(runs["out"] / "index.html")["run"]
    assert run["counts"] == {"ok": 0, "skipped": 12, "failed": 2} and run["state"] == "complete"
    wrong = len({r["input"] for r in rows if r["correct"] is False})
    assert f"; labels: {wrong} of {IMAGES - 1} labelled images predicted wrong (index.html filters them); see " \
        in run["summary"]  # the summary line, as printed
    assert read_page(runs["first"] / "index.html")["run"]["counts"] == {"ok": 12, "skipped": 0, "failed": 2}


# -- the page in a browser


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip(NO_BROWSER)
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (the test extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,900",
                     "--disable-gpu", "--no-first-run"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # a path: no Selenium Manager
    yield driver
    driver.quit()


def _open(browser, index: Path):
    browser.get(index.as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1"
    return browser


def _errors(browser) -> list[str]:
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def _shown(browser) -> list[str]:
    """The file names of the rows drawn, in order."""
    return [Path(name).name for name in browser.execute_script(
        "return [...document.querySelectorAll('#canvas .row .file')].map(e => e.textContent)")]


def _loaded(browser, selector: str) -> int:
    """How many of the images ``selector`` finds load (their decoding fails where they do not)."""
    return browser.execute_script("return Promise.all([...document.querySelectorAll(arguments[0])].map("
                                  "i => i.decode().then(() => i.naturalWidth > 0 ? 1 : 0, () => 0)))"
                                  ".then(found => found.reduce((a, b) => a + b, 0))", selector)


def _set(browser, element_id: str, value: str) -> None:
    """Set a control as a user would, its input event included."""
    browser.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                           "e.dispatchEvent(new Event('input', {bubbles: true}))", element_id, value)


def test_the_page_loads_without_errors_with_the_failures_first(browser, runs):
    _open(browser, runs["first"] / "index.html")
    assert _errors(browser) == []
    from selenium.webdriver.common.by import By

    failures = browser.find_element(By.ID, "failures")
    assert failures.is_displayed()
    assert browser.execute_script("return document.getElementById('failures').compareDocumentPosition("
                                  "document.getElementById('grid')) & Node.DOCUMENT_POSITION_FOLLOWING")
    reason = next(r["error"] for r in _manifest(runs["first"]) if r["status"] == "failed")
    items = [item.text for item in failures.find_elements(By.CSS_SELECTOR, "li")]
    assert len(items) == 2 and all("broken.png" in item and reason in item for item in items)
    assert _shown(browser) == sorted(["broken.png"] + [f"p{i}.png" for i in range(IMAGES)])
    counts = browser.find_element(By.ID, "counts").text
    assert counts.startswith("done now 12 · done before 0 (skipped) · failed 2 · this run: ")
    # the overlays and originals in sight load (p0.png's row: the second)
    assert _loaded(browser, "#canvas .row:nth-child(2) img") == 5  # the original; each overlay over it


def test_the_header_tells_the_truth_after_a_resume(browser, runs):
    _open(browser, runs["out"] / "index.html")
    from selenium.webdriver.common.by import By

    counts = browser.find_element(By.ID, "counts").text
    assert counts.startswith("done now 0 · done before 12 (skipped) · failed 2 · this run: ")
    assert "1 image explained" in counts  # the broken file, tried again
    assert _errors(browser) == []


def test_search_status_methods_and_sort(browser, runs):
    _open(browser, runs["first"] / "index.html")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.find_element(By.ID, "search").send_keys("p3")
    assert _shown(browser) == ["p3.png"] and browser.find_element(By.ID, "shown").text.startswith("1 of 7")
    browser.find_element(By.ID, "search").clear()
    _set(browser, "search", "")
    Select(browser.find_element(By.ID, "status")).select_by_visible_text("failed")
    assert _shown(browser) == ["broken.png"]
    assert "not an image" in browser.find_element(By.CSS_SELECTOR, "#canvas .cell.failed").text
    Select(browser.find_element(By.ID, "status")).select_by_visible_text("any")

    rows = [r for r in _manifest(runs["first"]) if r["method"] == "gradcam" and r["status"] == "ok"]
    Select(browser.find_element(By.ID, "sort")).select_by_visible_text("probability, high first")
    expected = [Path(r["input"]).name for r in sorted(rows, key=lambda r: (-r["predicted_probability"], r["input"]))]
    assert _shown(browser) == expected + ["broken.png"]  # no probability: last
    Select(browser.find_element(By.ID, "sort")).select_by_visible_text("name")

    _set(browser, "prob-min", str(sorted(r["predicted_probability"] for r in rows)[-2]))
    assert _shown(browser) == sorted(expected[:2])
    _set(browser, "prob-min", "")
    predicted = rows[0]["predicted_id"]
    Select(browser.find_element(By.ID, "predicted-class")).select_by_value(str(predicted))
    assert _shown(browser) == sorted(Path(r["input"]).name for r in rows if r["predicted_id"] == predicted)
    Select(browser.find_element(By.ID, "predicted-class")).select_by_value("")

    header = lambda: browser.execute_script("return [...document.querySelectorAll('#head > div')].map(e => e.firstChild.textContent)")
    assert header() == ["image", "original", "gradcam", "saliency"]
    browser.find_element(By.CSS_SELECTOR, "#methods input[value='0']").click()
    assert header() == ["image", "original", "saliency"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#canvas .row:first-child > div")) == 3
    browser.find_element(By.CSS_SELECTOR, "#methods input[value='0']").click()
    assert _errors(browser) == []


def test_opacity_overlay_switch_and_detail_view(browser, runs):
    _open(browser, runs["first"] / "index.html")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    overlay = browser.find_element(By.CSS_SELECTOR, "#canvas .row img.overlay")
    assert overlay.value_of_css_property("opacity") == "1"
    _set(browser, "opacity", "30")
    assert overlay.value_of_css_property("opacity") == "0.3"
    browser.find_element(By.ID, "overlay-on").click()
    assert not overlay.is_displayed()
    browser.find_element(By.ID, "overlay-on").click()
    assert overlay.is_displayed()
    # each map has its colour scale: unsigned, 0 to 1
    assert browser.find_element(By.CSS_SELECTOR, "#head .ends").text.split() == ["0", "1"]

    second = browser.find_elements(By.CSS_SELECTOR, "#canvas .row")[1]
    name = second.find_element(By.CSS_SELECTOR, ".file").text
    second.find_element(By.CSS_SELECTOR, "button.open").click()
    detail = browser.find_element(By.ID, "detail")
    assert detail.is_displayed() and detail.find_element(By.TAG_NAME, "h2").text == name
    captions = [c.text for c in detail.find_elements(By.TAG_NAME, "figcaption")]
    assert captions[0] == "original" and [c.split(" ·")[0] for c in captions[1:]] == ["gradcam", "saliency"]
    assert "top predictions" in detail.text and ("✗ wrong" in detail.text or "✓ right" in detail.text)
    assert _loaded(browser, "#detail img") == 5  # the original, and each overlay over it
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    assert not detail.is_displayed()
    assert _errors(browser) == []


def test_labels_mark_right_and_wrong_and_the_mistakes_filter(browser, runs):
    _open(browser, runs["first"] / "index.html")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    rows = [r for r in _manifest(runs["first"]) if r["method"] == "gradcam"]
    wrong = sorted(Path(r["input"]).name for r in rows if r["correct"] is False)
    right = sorted(Path(r["input"]).name for r in rows if r["correct"] is True)
    assert wrong and len(wrong) + len(right) == IMAGES - 1
    assert browser.find_element(By.ID, "mistakes").text == f"mistakes {len(wrong)} of {IMAGES - 1} labelled images"
    Select(browser.find_element(By.ID, "correct")).select_by_visible_text("mistakes")
    assert _shown(browser) == wrong
    assert all("✗ wrong" in row.text for row in browser.find_elements(By.CSS_SELECTOR, "#canvas .row"))
    Select(browser.find_element(By.ID, "correct")).select_by_visible_text("right")
    assert _shown(browser) == right
    Select(browser.find_element(By.ID, "correct")).select_by_visible_text("no label")
    assert _shown(browser) == ["broken.png", "p5.png"]


def test_copied_originals_travel_with_the_run_folder_and_lost_links_say_why(browser, runs, tmp_path):
    """A run folder moved away from its inputs: with --copy-originals its page still shows
    the originals (thumbnails inside it, made once); without, the original column says they
    are not found, and why."""
    root = runs["root"]
    command = ["run", str(root / "photos"), "--model", str(root / "tiny.pt2"), "--method", "gradcam",
               "--workers", "0", "-q", "--out", str(root / "copied"), "--copy-originals"]
    assert main(command) == 1  # the broken file fails
    thumbnails = sorted((root / "copied" / "originals").iterdir())
    assert len(thumbnails) == IMAGES and all(path.suffix == ".jpg" for path in thumbnails)
    made = {path.name: path.stat().st_mtime_ns for path in thumbnails}
    assert main(command) == 1  # a resumed run finds them
    assert {path.name: path.stat().st_mtime_ns for path in (root / "copied" / "originals").iterdir()} == made
    originals = [image["original"] for image in read_page(root / "copied" / "index.html")["images"]]
    assert sum(bool(o) for o in originals) == IMAGES and all(o.startswith("originals/") for o in originals if o)
    shutil.copytree(root / "copied", tmp_path / "moved" / "copied")
    shutil.copytree(runs["first"], tmp_path / "moved" / "linked")
    from selenium.webdriver.common.by import By

    _open(browser, tmp_path / "moved" / "copied" / "index.html")
    assert _loaded(browser, "#canvas .original img") == len(browser.find_elements(By.CSS_SELECTOR,
                                                                                 "#canvas .original img")) > 0
    _open(browser, tmp_path / "moved" / "linked" / "index.html")
    browser.execute_script("return Promise.all([...document.querySelectorAll('#canvas img')].map("
                           "i => i.decode().catch(() => 0)))")
    missing = browser.find_elements(By.CSS_SELECTOR, "#canvas .missing-original")
    assert missing and missing[0].text == "original not found"
    assert "--copy-originals" in missing[0].get_attribute("title")
    assert all("ERR_FILE_NOT_FOUND" in error for error in _errors(browser))  # the lost originals, and only them


def test_metric_columns_sort_and_filter_over_a_virtual_grid(browser, tmp_path):
    """A page of 300 images, each with two targets and a metric: rows are drawn only in sight,
    and sorting and filtering by the metric of one method's map work."""
    _noise(0, (16, 16)).save(tmp_path / "o.png")
    rows = []
    for i in range(300):
        for rank, label in enumerate(("top1", "top2")):
            rows.append({"input": f"img{i:03d}.png", "method": "gradcam", "target": label, "target_id": rank,
                         "target_name": f"c{rank}", "target_probability": 0.6 - 0.2 * rank, "predicted_id": 0,
                         "predicted_name": "c0", "predicted_probability": 0.6, "output": "o.png", "status": "ok",
                         "metrics": {"deletion": ((i * 37) % 300) / 300 + rank}})
    files = page_files(rows, PageRun(), original=lambda source: "o.png")
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    _open(browser, tmp_path / "index.html")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    drawn = len(browser.find_elements(By.CSS_SELECTOR, "#canvas .row"))
    assert 3 < drawn < 20  # in sight only
    browser.execute_script("const g = document.getElementById('grid'); g.scrollTop = 150 * 206;"
                           "g.dispatchEvent(new Event('scroll'))")
    browser.execute_script("return new Promise(r => requestAnimationFrame(() => r()))")
    assert "img150.png" in _shown(browser) or "img149.png" in _shown(browser)

    Select(browser.find_element(By.ID, "sort")).select_by_visible_text("gradcam · deletion, low first")
    order = sorted(range(300), key=lambda i: (i * 37) % 300)
    assert _shown(browser)[:4] == [f"img{i:03d}.png" for i in order[:4]]
    Select(browser.find_element(By.ID, "metric")).select_by_visible_text("gradcam · deletion")
    _set(browser, "metric-max", "0.005")  # the top1 maps' values: 0, 1/300, ..., 299/300
    assert browser.find_element(By.ID, "shown").text.startswith("2 of 300")
    Select(browser.find_element(By.ID, "target")).select_by_visible_text("top2")  # values 1..2
    assert browser.find_element(By.ID, "shown").text.startswith("0 of 300")
    assert _errors(browser) == []


def test_markup_in_any_string_of_the_inline_setup_leaves_the_page_whole(browser, tmp_path):
    # `<!--<script>` in a folder, class or target name once put the HTML parser in its
    # double-escaped script state: the page stayed blank (nothing ran, but nothing showed).
    markup = "<!--<script>"
    out = tmp_path / markup  # the --out folder, named in the summary line
    out.mkdir()
    _noise(0, (16, 16)).save(out / "o.png")
    rows = [{"input": f"{markup}/p{i}.png", "method": "gradcam", "target": markup, "target_id": 0,
             "target_name": markup, "target_probability": 0.5, "predicted_id": 0, "predicted_name": markup,
             "predicted_probability": 0.5, "output": "o.png", "status": "ok"} for i in range(2)]
    run = PageRun(summary=f"explain: 2 done now; see {out / 'index.html'} and {out / 'manifest.jsonl'}",
                  counts={"ok": 2, "skipped": 0, "failed": 0})
    for name, data in page_files(rows, run, original=lambda source: "o.png").items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(data)
    assert markup not in (out / "index.html").read_text()
    assert read_page(out / "index.html")["run"]["summary"] == run.summary  # read back as written
    _open(browser, out / "index.html")
    assert _shown(browser) == ["p0.png", "p1.png"]
    from selenium.webdriver.support.ui import Select
    from selenium.webdriver.common.by import By

    targets = Select(browser.find_element(By.ID, "target")).options  # hidden: one target
    assert markup in [option.get_attribute("textContent") for option in targets]
    assert _errors(browser) == []
