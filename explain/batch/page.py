"""index.html, the explorer of a run (:mod:`explain.viewer`), as the batch jobs write it: what
its header says about the run, the colour scale of each method, and its files written into
the output folder (on this machine or given by URI)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..viewer import DATA_FOLDER, PageRun, colour_scale, original_link, page_files, stale_data_files
from .storage import OutputFolder


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
    )


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
    files = page_files(rows, run, metrics_html, exists=exists or folder.is_file, original=original)
    for name, data in files.items():  # index.html last
        folder.write(name, data)
    for name in stale_data_files(folder.names("rows-", under=DATA_FOLDER), files):
        folder.remove(f"{DATA_FOLDER}/{name}")
