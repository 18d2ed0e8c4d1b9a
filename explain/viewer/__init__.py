"""The explorer that a run's ``index.html`` is: the page and the data files it reads.

The page's code lives beside this module as package data: ``explorer.html`` (the template),
``explorer.js`` (the script, plain JavaScript with no library) and ``explorer.css``; they are
joined into one ``index.html``. The rows come from the manifest as *data files*:
``index-data/rows-<token>-<n>.js``, script files the page includes, since a browser refuses to
read a local JSON file by ``fetch`` from a file:// page. Each holds :data:`IMAGES_PER_FILE`
images, column by column (one array per field, the few distinct strings as indices into
shared tables), as ``explorerData.push(JSON.parse("..."))``: for large data a JSON string
parses faster than the same object written as JavaScript (V8's advice).

The data files of one write share a fresh token, and index.html names them; a page written
before is left whole until the new index.html replaces it (:func:`stale_data_files` are
removed after that).
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from urllib.parse import quote

__all__ = [
    "DATA_FOLDER",
    "IMAGES_PER_FILE",
    "PageRun",
    "asset",
    "colour_scale",
    "link",
    "original_link",
    "page_files",
    "read_data_file",
    "read_page",
    "readable",
    "stale_data_files",
]

#: The folder under --out that holds the page's data files.
DATA_FOLDER = "index-data"
#: Images per data file (with all their maps).
IMAGES_PER_FILE = 20_000
STATUSES = ("ok", "skipped", "failed")


@dataclass
class PageRun:
    """What the page's header says about the run that wrote it.

    ``counts``: outputs done by this run (ok), done before and reused (skipped) and failed;
    ``seconds`` and ``images``: this run's time and the images it explained; ``state``:
    complete, in progress or interrupted; ``summary``: the summary line the run printed;
    ``zoom``: how the model's crop frames the original image (the overlays are drawn on the
    crop): the original is scaled by this much around its centre after covering the square
    (``Resize(s)`` then ``CenterCrop(c)``: ``s / c``), 0 where the model takes the whole
    image, None where unknown.
    """

    command: str = "explain run"
    state: str = "complete"
    summary: str = ""
    counts: dict[str, int] | None = None
    seconds: float | None = None
    images: int | None = None
    zoom: float | None = None
    #: method -> its colour scale (see :func:`colour_scale`)
    scales: dict[str, dict] = field(default_factory=dict)
    #: ``explain run --atlas``: the concept atlas whose pages the concepts link to, as
    #: ``{"page": link to its index.html, "concepts": the keys LAYER:CHANNEL it has}``
    atlas: dict | None = None


def colour_scale(cmap: str, signed: bool) -> dict:
    """A map's colour scale for the legend: a CSS gradient of ``cmap`` and what its ends mean
    (unsigned maps: 0..1; signed: negative..positive, zero in the middle)."""
    import matplotlib

    colours = matplotlib.colormaps[cmap](_steps(11))
    stops = ", ".join(
        f"rgb({r * 255:.0f},{g * 255:.0f},{b * 255:.0f}) {i * 10}%" for i, (r, g, b, _) in enumerate(colours)
    )
    ends = ("negative", "0", "positive") if signed else ("0", "", "1")
    return {"cmap": cmap, "signed": signed, "gradient": f"linear-gradient(to right, {stops})", "ends": ends}


def _steps(count: int) -> list[float]:
    return [i / (count - 1) for i in range(count)]


def asset(name: str) -> str:
    """The text of one of the pages' files (a template, a script, a style sheet)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def _number(value) -> float | None:
    """A finite number, else None (JSON has no NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def readable(text: str) -> str:
    """``text`` with the bytes of a file name that are not UTF-8 shown as ``\\xNN``.

    >>> readable(os.fsdecode(b"caf\\xe9.png"))
    'caf\\\\xe9.png'
    """
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that no file name makes (a hand-edited manifest)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def link(path: str) -> str:
    """A relative link to a file: its bytes quoted, ``/`` kept.

    >>> link("cats/a b.png"), link(os.fsdecode(b"caf\\xe9.png"))
    ('cats/a%20b.png', 'caf%E9.png')
    """
    return quote(os.fsencode(path))


def original_link(out_dir: str | os.PathLike) -> Callable[[str], str | None]:
    """``link_to(input)``: the link from the folder ``out_dir`` to an input image (an input as
    the manifest names it: relative to the working directory); None where there is none (on
    another drive, or a URI other than http(s))."""
    base = os.path.abspath(out_dir)

    def link_to(source: str) -> str | None:
        if "://" in source:
            return source if source.startswith(("http://", "https://")) else None
        try:
            return link(PurePosixPath(*Path(os.path.relpath(os.path.abspath(source), base)).parts).as_posix())
        except ValueError:  # another drive
            return None

    return link_to


class Tables:
    """The strings that many rows share, each stored once: rows hold their index."""

    def __init__(self):
        self.values: dict[str, dict] = {"method": {}, "target": {}, "metric": {}}
        self.classes: dict[int, str] = {}
        self.settings: dict[str, str] = {}

    def index(self, kind: str, value) -> int:
        return self.values[kind].setdefault(value, len(self.values[kind]))

    def note_class(self, class_id, name) -> int | None:
        if isinstance(class_id, bool) or not isinstance(class_id, int):
            return None
        if name is not None and class_id not in self.classes:
            self.classes[class_id] = readable(str(name))
        return class_id

    def as_json(self) -> dict:
        return {kind: [readable(str(v)) for v in values] for kind, values in self.values.items()} | {
            "classes": [[class_id, name] for class_id, name in sorted(self.classes.items())],
            "settings": self.settings,
        }


def _grouped(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """Rows by image, images in the order of their first row."""
    images: dict[str, list[dict]] = {}
    for row in rows:
        images.setdefault(str(row.get("input")), []).append(row)
    return images


def _image_columns(name: str, rows: list[dict], tables: Tables, original: Callable[[str], str | None]) -> dict:
    """One image's fields: from its first row with a prediction (and a label, with --labels)."""
    first = next((row for row in rows if row.get("predicted_id") is not None), rows[0])
    labelled = next((row for row in rows if row.get("label_id") is not None), {})
    correct = labelled.get("correct")
    return {
        "name": readable(name),
        "original": original(name),
        "predicted": tables.note_class(first.get("predicted_id"), first.get("predicted_name")),
        "probability": _number(first.get("predicted_probability")),
        "label": tables.note_class(labelled.get("label_id"), labelled.get("label_name")),
        "correct": None if correct is None else int(bool(correct)),
    }


def _map_columns(image: int, row: dict, tables: Tables, exists: Callable[[str], bool]) -> dict:
    status = row.get("status") if row.get("status") in STATUSES else "failed"
    output, error = row.get("output"), row.get("error")
    if status != "failed" and output is not None and not (isinstance(output, str) and exists(output)):
        output, error = None, "output file missing"  # (explain evaluate's rows have none)
    method = str(row.get("method"))
    if isinstance(row.get("settings"), str):
        tables.settings.setdefault(method, row["settings"])
    metrics = row["metrics"] if isinstance(row.get("metrics"), dict) else {}
    return {
        "image": image,
        "method": tables.index("method", method),
        "target": tables.index("target", row.get("target")),
        "target_id": tables.note_class(row.get("target_id"), row.get("target_name")),
        "probability": _number(row.get("target_probability")),
        "status": STATUSES.index(status),
        "output": link(output) if isinstance(output, str) and status != "failed" else None,
        "error": None if error is None else readable(str(error)),
        "seconds": _number(row.get("seconds")),
        "metrics": {tables.index("metric", column): _number(value) for column, value in metrics.items()},
        # a concept method's row (--method crp): its concept, rank and relevance
        "concept": readable(row["concept"]) if isinstance(row.get("concept"), str) else None,
        "concept_rank": row.get("concept_rank") if type(row.get("concept_rank")) is int else None,
        "concept_relevance": _number(row.get("concept_relevance")),
    }


#: A data file's columns of maps (besides their metric values).
MAP_COLUMNS = (
    "image",
    "method",
    "target",
    "target_id",
    "probability",
    "status",
    "output",
    "error",
    "seconds",
    "concept",
    "concept_rank",
    "concept_relevance",
)


def _columns(records: list[dict], names: Sequence[str]) -> dict[str, list]:
    return {name: [record[name] for record in records] for name in names}


def _chunk(images: list[tuple[str, list[dict]]], first_rank: list[int], tables: Tables, exists, original) -> dict:
    """One data file's images and maps, column by column; ``first_rank``: each image's place
    in name order."""
    image_records: list[dict] = []
    map_records: list[dict] = []
    for position, (name, rows) in enumerate(images):
        image_records.append(_image_columns(name, rows, tables, original))
        map_records.extend(_map_columns(position, row, tables, exists) for row in rows)
    maps = _columns(map_records, MAP_COLUMNS)
    # metric values as [map, metric, value] triples: most runs score few maps, or none
    maps["metrics"] = [
        [m, column, value] for m, record in enumerate(map_records) for column, value in record["metrics"].items()
    ]
    columns = _columns(image_records, ("name", "original", "predicted", "probability", "label", "correct"))
    columns["rank"] = first_rank
    return {"images": columns, "maps": maps}


def data_script(chunk: dict) -> bytes:
    """A data file's text: the chunk as a JSON string the page parses.

    >>> data_script({"images": {"name": ["a"]}})
    b'explorerData.push(JSON.parse("{\\\\"images\\\\":{\\\\"name\\\\":[\\\\"a\\\\"]}}"));\\n'
    """
    text = json.dumps(chunk, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return f"explorerData.push(JSON.parse({json.dumps(text, ensure_ascii=False)}));\n".encode()


def read_data_file(data: bytes) -> dict:
    """The chunk a data file holds (the inverse of :func:`data_script`)."""
    text = data.decode("utf-8").strip()
    prefix, suffix = "explorerData.push(JSON.parse(", "));"
    if not (text.startswith(prefix) and text.endswith(suffix)):
        raise ValueError("not an explorer data file")
    return json.loads(json.loads(text[len(prefix) : -len(suffix)]))


def read_page(index: str | os.PathLike) -> dict:
    """What a written ``index.html`` shows, read back: ``run`` and ``tables`` (see
    :func:`page_files`), ``images`` and ``maps`` as lists of records (a map's ``image`` is
    its image's position in ``images``), and ``extras``: the other data files it includes, by
    name (the strategies': read them with
    :func:`~explain.viewer.strategies_view.read_strategies_script`)."""
    import re
    from urllib.parse import unquote_to_bytes

    index = Path(index)
    document = index.read_text(encoding="utf-8")
    found = re.search(r"^var explorerSetup = (.*);$", document, re.MULTILINE)
    if found is None:
        raise ValueError(f"{index} is not an explorer page written by explain (it sets no explorerSetup)")
    setup = json.loads(found.group(1))
    images: list[dict] = []
    maps: list[dict] = []
    extras: dict[str, bytes] = {}
    for name in re.findall(r'<script src="([^"]+)"></script>', document):
        data = (index.parent / os.fsdecode(unquote_to_bytes(name))).read_bytes()
        if not PurePosixPath(name).name.startswith("rows-"):  # another data file (the strategies')
            extras[os.fsdecode(unquote_to_bytes(name))] = data
            continue
        chunk = read_data_file(data)
        first = len(images)
        columns, map_columns = chunk["images"], chunk["maps"]
        images += [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=False)]
        metrics = map_columns.pop("metrics")
        start = len(maps)
        maps += [dict(zip(map_columns, values, strict=True)) for values in zip(*map_columns.values(), strict=False)]
        for record in maps[start:]:
            record["image"] += first
            record["metrics"] = {}
        for position, column, value in metrics:
            maps[start + position]["metrics"][setup["tables"]["metric"][column]] = value
    return {**setup, "images": images, "maps": maps, "extras": extras}


def page_files(
    rows: Sequence[dict],
    run: PageRun | None = None,
    metrics_html: str = "",
    exists: Callable[[str], bool] = lambda output: True,
    original: Callable[[str], str | None] = lambda input: None,
    extras: Sequence[str] = (),
) -> dict[str, bytes]:
    """The files of the explorer for manifest ``rows``: ``index.html`` and its data files, by
    name under the output folder (write the data files first, index.html last).

    ``exists(output)`` says whether an overlay is there (an ok row without one shows why);
    ``original(input)`` gives the link to an input image from the output folder (None: not
    shown); ``metrics_html`` is the table of metric summaries (``--metrics``); ``extras``
    names more data files already in the folder that the page includes after the rows' (the
    strategies': :data:`explain.viewer.strategies_view.STRATEGIES_SCRIPT`).
    """
    run = run or PageRun()
    images = list(_grouped(rows).items())
    order = sorted(range(len(images)), key=lambda i: (images[i][0].casefold(), images[i][0]))
    rank = [0] * len(images)
    for place, i in enumerate(order):
        rank[i] = place
    tables, token = Tables(), uuid.uuid4().hex[:8]
    files: dict[str, bytes] = {}
    for start in range(0, len(images), IMAGES_PER_FILE):
        part = images[start : start + IMAGES_PER_FILE]
        chunk = _chunk(part, rank[start : start + IMAGES_PER_FILE], tables, exists, original)
        files[f"{DATA_FOLDER}/rows-{token}-{start // IMAGES_PER_FILE:05d}.js"] = data_script(chunk)
    files["index.html"] = index_document([*files, *extras], tables, run, metrics_html).encode("utf-8")
    return files


def _script_json(value) -> str:
    r"""JSON that can sit inside a <script> element: ``<``, ``>`` and ``&`` as ``\u003c``,
    ``\u003e`` and ``\u0026``, which JavaScript reads as the same characters, so that no string
    (``</script>``, ``<!--<script>``, which would put the HTML parser in its double-escaped
    script state and leave the page blank) can change how the page is parsed.

    >>> _script_json({"name": "<!--<script>&"})
    '{"name": "\\u003c!--\\u003cscript\\u003e\\u0026"}'
    """
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def index_document(data_files: list[str], tables: Tables, run: PageRun, metrics_html: str) -> str:
    """index.html: the template with the style, the run, the shared tables, the data files'
    script elements and the script filled in."""
    scripts = "\n".join(f'<script src="{link(name)}"></script>' for name in data_files)
    setup = {"run": asdict(run), "tables": tables.as_json()}
    replacements = {
        "/*STYLE*/": asset("explorer.css"),
        "/*SETUP*/": f"var explorerSetup = {_script_json(setup)};\nvar explorerData = [];",
        "<!--DATA-->": scripts,
        "/*SCRIPT*/": asset("explorer.js") + "\n" + asset("strategies.js"),
        "<!--METRICS-->": metrics_html,
    }
    document = asset("explorer.html")
    for marker, text in replacements.items():
        document = document.replace(marker, text, 1)
    return document


def stale_data_files(names: Iterable[str], files: dict[str, bytes]) -> list[str]:
    """The names of data files in the data folder (``names``, relative to it) that the page
    ``files`` does not use: an earlier write's, to remove once index.html is replaced."""
    used = {PurePosixPath(name).name for name in files if name.startswith(DATA_FOLDER + "/")}
    return [name for name in names if name.startswith("rows-") and name.endswith(".js") and name not in used]
