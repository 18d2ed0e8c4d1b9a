"""index.html, the explorer of a run (:mod:`explain.viewer`), as the batch jobs write it: what
its header says about the run, the colour scale of each method, its files written into the
output folder (on this machine or given by URI), and how it shows the original images: by a
relative link from the folder to each input (a run folder moved away from its inputs loses
them), or, with ``--copy-originals``, from thumbnails copied into the folder
(:class:`OriginalCopies`)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import Option, UsageError
from ..images import READABLE_EXTENSIONS, ImageError, load_rgb
from ..viewer import DATA_FOLDER, PageRun, colour_scale, link, original_link, page_files, stale_data_files
from ..viewer.concept_page import CONCEPTS_FILE, PAGE_FILE
from ..viewer.strategies_view import STRATEGIES_SCRIPT
from .storage import OutputFolder, is_uri

OUT = Option("out")
#: The folder under --out that holds the thumbnails of --copy-originals.
ORIGINALS_FOLDER = "originals"
#: The longer side of a thumbnail, in pixels: the explorer's detail view draws originals at 336.
THUMBNAIL_SIDE = 512


def colour_scales(settings: dict[str, str], cmap: str, signed_cmap: str) -> dict[str, dict]:
    """Each method's colour scale: signed (``signed_cmap``) where its settings keep the sign
    (``--reduction sum``), else unsigned (``cmap``)."""
    signed = {method: "signed_cmap=" in text for method, text in settings.items()}
    return {method: colour_scale(signed_cmap if signed[method] else cmap, signed[method]) for method in settings}


def page_run(
    command: str,
    summary: str,
    stats: dict[str, int],
    seconds: float,
    images: int,
    state: str = "complete",
    zoom: float | None = None,
    scales: dict | None = None,
    atlas: dict | None = None,
) -> PageRun:
    """The header of a run's page: ``stats`` counts its outputs done now (ok), done before
    (skipped) and failed; ``seconds`` and ``images`` are this run's time and images explained."""
    return PageRun(
        command=command,
        state=state,
        summary=summary,
        counts=dict(stats),
        seconds=round(seconds, 3),
        images=images,
        zoom=zoom,
        scales=scales or {},
        atlas=atlas,
    )


def atlas_links(atlas: Path | None, out: str) -> dict | None:
    """``--atlas``: the link from the output folder ``out`` to the atlas's page and the
    concepts (``LAYER:CHANNEL``) its ``concepts.json`` has pages for, which index.html links
    --method crp's concepts to (:attr:`~explain.viewer.PageRun.atlas`); None without --atlas.
    An atlas folder without ``concepts.json`` is a usage error."""
    if atlas is None:
        return None
    try:
        document = json.loads((atlas / CONCEPTS_FILE).read_text(encoding="utf-8"))
        layers = document["layers"]
        concepts = [f"{layer}:{entry['channel']}" for layer, found in layers.items() for entry in found["concepts"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise UsageError(
            Option("atlas"),
            f" {atlas}: not a finished `explain concepts atlas` folder (its {CONCEPTS_FILE}: "
            f"{type(error).__name__}: {error}); pass the ",
            OUT,
            " of a completed atlas run",
        ) from None
    base = out if is_uri(out) else os.path.abspath(out)
    page = os.path.relpath(os.path.abspath(atlas / PAGE_FILE), base) if not is_uri(out) else None
    if page is None:  # an output folder given by URI: the atlas's page by its absolute path
        return {"page": Path(os.path.abspath(atlas / PAGE_FILE)).as_uri(), "concepts": concepts}
    return {"page": link(Path(page).as_posix()), "concepts": concepts}


def write_page(
    folder: OutputFolder,
    rows: Sequence[dict],
    run: PageRun,
    metrics_html: str = "",
    exists: Callable[[str], bool] | None = None,
    original: Callable[[str], str | None] | None = None,
) -> None:
    """Write the explorer of manifest ``rows`` into ``folder``: its data files, then index.html,
    then remove an earlier page's data files (a page is whole at every moment). ``exists``
    says whether an output is there (by default: the folder is asked); ``original`` links an
    input image (by default: a relative link from a folder on this machine, none from one
    given by URI)."""
    if original is None:
        original = original_link(folder.root) if folder.filesystem is None else (lambda source: None)
    # explain strategies' clusters, which every later page includes (and flags where stale)
    extras = [STRATEGIES_SCRIPT] if folder.is_file(STRATEGIES_SCRIPT) else []
    files = page_files(rows, run, metrics_html, exists=exists or folder.is_file, original=original, extras=extras)
    for name, data in files.items():  # index.html last
        folder.write(name, data)
    for name in stale_data_files(folder.names("rows-", under=DATA_FOLDER), files):
        folder.remove(f"{DATA_FOLDER}/{name}")


class OriginalCopies:
    """``--copy-originals``: ``original(input)`` for :func:`write_page` that links a thumbnail of
    the input (at most :data:`THUMBNAIL_SIDE` pixels a side, JPEG) written into the output
    folder under :data:`ORIGINALS_FOLDER`, so that the run folder keeps its originals when it
    is moved or shared. Each thumbnail is made once (a resumed run finds it); an input that is
    not a readable image gets none (the explorer shows no original)."""

    def __init__(self, folder: OutputFolder):
        self.folder = folder
        self.links: dict[str, str | None] = {}

    def __call__(self, source: str) -> str | None:
        if source not in self.links:
            self.links[source] = self._copy(source)
        return self.links[source]

    def _copy(self, source: str) -> str | None:
        if "://" in source or Path(source).suffix.lower() not in READABLE_EXTENSIONS:
            return None
        name = f"{ORIGINALS_FOLDER}/{thumbnail_name(source)}"
        if not self.folder.is_file(name):
            try:
                picture = load_rgb(source)
            except (ImageError, OSError):
                return None
            picture.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
            encoded = io.BytesIO()
            picture.save(encoded, "JPEG", quality=85)
            self.folder.write(name, encoded.getvalue())
        return link(name)


def thumbnail_name(source: str) -> str:
    """The file name of an input's thumbnail: its stem (safe characters only) and a hash of its
    absolute path, so that inputs of one name in different folders get their own.

    >>> thumbnail_name("/photos/cats/Tom & Jerry.png")[:14]
    'Tom_Jerry-4d8c'
    """
    stem = re.sub(r"[^\w.+-]+", "_", Path(source).stem).strip("_")[:80] or "image"
    digest = hashlib.sha1(os.fsencode(os.path.abspath(source))).hexdigest()[:10]
    return f"{stem}-{digest}.jpg"
