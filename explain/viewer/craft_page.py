"""CRAFT's page: ``index.html`` of an ``explain concepts craft`` folder, read from its
``craft.json`` (:func:`explain.analysis.write_craft` writes both): the class's concepts ranked
by importance (the total Sobol index as a bar and a number, ± its spread over the images), each
with its best crops, then the concept maps of the first images, one column per concept.

Static HTML in the explorer's style (:func:`explain.viewer.pages.static_page`, ``craft.css``);
no script, no server, no network."""

from __future__ import annotations

from html import escape

from . import link, readable
from .pages import bar, number, static_page, table

__all__ = ["craft_page"]


def _crops(entry: dict) -> str:
    """A concept's best crops, best first, each titled with its image and coefficient."""
    figures = []
    for rank, crop in enumerate(entry.get("best_crops") or []):
        image = readable(str(crop.get("image")))
        tip = f"{rank + 1}. {image} · coefficient {number(crop.get('coefficient'))}"
        figures.append(
            f'<figure><img src="{escape(link(str(crop.get("file"))))}" alt="concept {int(entry["concept"])} '
            f'crop {rank + 1}" title="{escape(tip)}"><figcaption>{escape(image)}</figcaption></figure>'
        )
    return f'<div class="thumbs">{"".join(figures)}</div>' if figures else '<span class="empty">no crops</span>'


def _ranked(concepts: list[dict]) -> list[dict]:
    """The concepts, most important first (craft.json's order already; a hand-edited file's
    missing importances last)."""
    return sorted(concepts, key=lambda c: (c.get("importance") is None, -(c.get("importance") or 0.0)))


def _concept_rows(concepts: list[dict]) -> str:
    high = max([c.get("importance") or 0.0 for c in concepts] + [1e-12])
    rows = []
    for rank, entry in enumerate(concepts):
        importance, spread = entry.get("importance"), entry.get("importance_sd")
        shown = number(importance) + (f" ± {number(spread)}" if spread is not None else "")
        rows.append(
            f'<tr class="concept" id="concept-{int(entry["concept"])}" data-importance="{number(importance, 6)}">'
            f'<td class="number">{rank + 1}</td><td>concept {int(entry["concept"])}</td>'
            f"<td>{bar(importance, high, spread=spread, title=shown)}</td>"
            f'<td class="number importance">{shown}</td><td>{_crops(entry)}</td></tr>'
        )
    headers = ["rank", "concept", "importance (total Sobol index)", "value ± sd over the images", "best crops"]
    return table("concepts", headers, rows)


def _maps(document: dict, order: list[int]) -> str:
    """The concept maps of the images craft.json lists under ``maps``, concepts in ``order``."""
    images = document.get("maps") or []
    if not images:
        return ""
    rows = []
    for entry in images:
        files = entry.get("files") or []
        cells = "".join(
            f'<td><img class="concept-map" src="{escape(link(files[j]))}" alt="concept {j} on '
            f'{escape(readable(str(entry.get("image"))))}"></td>'
            if j < len(files)
            else "<td></td>"
            for j in order
        )
        rows.append(f"<tr><th>{escape(readable(str(entry.get('image'))))}</th>{cells}</tr>")
    return (
        '<h2>Concept maps</h2><p class="muted">where each concept lies in an image: its activations '
        "projected on the concept bank, drawn over the image as the model saw it</p>"
        + table("maps", ["image", *(f"concept {j}" for j in order)], rows)
    )


def craft_page(document: dict) -> str:
    """The CRAFT folder's index.html from ``document`` (its ``craft.json``); the links to the
    crops and maps are relative to the folder."""
    concepts = _ranked(list(document.get("concepts") or []))
    target = document.get("class") or f"class {document.get('class_id')}"
    title = f"CRAFT · {readable(str(target))} at {readable(str(document.get('layer')))}"
    images = document.get("images") or []
    counts = (
        f"{len(concepts)} concepts from {int(document.get('crops') or 0):,} crops of {len(images):,} images · "
        f"NMF relative error {number(document.get('error'))} · importance: the total Sobol index of the "
        "concept for the class's score (Fel et al., CVPR 2023), the bar's whisker ± its spread over the images"
    )
    body = f"<h2>Concepts, most important first</h2>{_concept_rows(concepts)}{_maps(document, _order(concepts))}"
    return static_page(title, escape(counts), body, style="craft.css", writer="explain/viewer/craft_page.py")


def _order(concepts: list[dict]) -> list[int]:
    return [int(entry["concept"]) for entry in concepts]
