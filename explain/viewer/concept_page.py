"""The concept atlas's page: ``index.html`` of an ``explain concepts atlas`` folder, a grid of
its concepts (per layer and channel: the RelMax and ActMax reference patches, the channel's
statistics and top classes, and its feature visualisation where the folder has one), read from
the atlas's ``concepts.json``.

Each concept has its own anchor, its key ``LAYER:CHANNEL`` (``index.html#layer4:42``), the
``concept`` column of ``explain run --method crp``'s manifest, which the run's explorer links
to (``explain run --atlas``). The page is static HTML in the explorer's style
(``explorer.css``, with ``concepts.css``), with a small script (``concepts.js``) for its search,
layer and sort controls; it needs no server and no network."""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape
from urllib.parse import quote

from . import link, readable
from .pages import static_page

__all__ = ["CONCEPTS_FILE", "PAGE_FILE", "concept_anchor", "concept_page"]

#: The atlas's description, per layer and channel (written by :mod:`explain.batch.concept_files`).
CONCEPTS_FILE = "concepts.json"
#: The atlas's page: a grid of its concepts, each at its anchor ``LAYER:CHANNEL``.
PAGE_FILE = "index.html"


def concept_anchor(key: str) -> str:
    """The fragment of a concept's anchor on the atlas's page, as a link writes it.

    >>> concept_anchor("layer4:42"), concept_anchor("features.6 x:3")
    ('layer4:42', 'features.6%20x:3')
    """
    return quote(key, safe=":.-_~")


def _number(value) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.3g}"


def _class(ref: dict) -> str:
    name, class_id = ref.get("class_name"), ref.get("class")
    if name is not None:
        return readable(str(name))
    return "" if class_id is None or class_id < 0 else f"class {class_id}"


def _patches(refs: list[dict], kind: str, title: str) -> str:
    """One kind of reference patches (RelMax, ActMax) of a concept, most first."""
    pictures = []
    for rank, ref in enumerate(refs):
        if not ref.get("patch"):
            continue
        tip = f"{rank + 1}. {readable(str(ref.get('image')))} · {_number(ref.get('value'))} · {_class(ref)}"
        pictures.append(
            f'<img src="{escape(link(ref["patch"]))}" alt="{kind} {rank + 1}" title="{escape(tip)}" loading="lazy">'
        )
    body = "".join(pictures) or '<span class="empty">no patches</span>'
    return f'<div class="refs {kind}"><h4>{title}</h4><div class="patches">{body}</div></div>'


def _concept(layer: str, entry: dict, visual: Callable[[str, int], str]) -> str:
    """One concept's card."""
    channel = int(entry["channel"])
    key = f"{layer}:{channel}"
    stats = entry.get("statistics", {})
    classes = stats.get("top_classes") or []
    named = ", ".join(f"{escape(_class(c))} ({int(c.get('count', 0))})" for c in classes)
    search = " ".join([key, *(_class(c) for c in classes)]).lower()
    figure = (
        f'<figure class="visual"><img src="{escape(visual(layer, channel))}" alt="feature visualisation" '
        'loading="lazy" onerror="this.parentNode.hidden = true"><figcaption>feature visualisation</figcaption></figure>'
    )
    return (
        f'<article class="concept" id="{escape(key)}" data-channel="{channel}" '
        f'data-top="{int(stats.get("top_count", 0))}" data-relevance="{_sortable(stats.get("mean_relevance"))}" '
        f'data-search="{escape(search)}">'
        f'<h3><a href="#{escape(concept_anchor(key))}">{escape(readable(key))}</a></h3>'
        f'<p class="stats">mean activation {_number(stats.get("mean_activation"))} · mean relevance '
        f"{_number(stats.get('mean_relevance'))} · a top concept of {int(stats.get('top_count', 0))} images</p>"
        f'<p class="classes">{("top classes: " + named) if named else "a top concept of no image"}</p>'
        f"{figure}{_patches(entry.get('relmax', []), 'relmax', 'RelMax: most relevant in')}"
        f"{_patches(entry.get('actmax', []), 'actmax', 'ActMax: most active in')}</article>"
    )


def concept_page(document: dict, visual: Callable[[str, int], str]) -> str:
    """The atlas's index.html from ``document`` (its ``concepts.json``): ``visual(layer,
    channel)`` is the link, from the atlas folder, to where a concept's feature visualisation
    would be (the card hides the figure where there is no such file)."""
    layers = document.get("layers", {})
    sections, options = [], []
    for layer, entry in layers.items():
        cards = "".join(_concept(layer, concept, visual) for concept in entry.get("concepts", []))
        name = escape(readable(layer))
        options.append(f'<option value="{escape(layer)}">{name}</option>')
        sections.append(
            f'<section class="layer" data-layer="{escape(layer)}"><h2>{name} · {int(entry.get("channels", 0))} '
            f'channels, {len(entry.get("concepts", []))} shown</h2><div class="concepts">{cards}</div></section>'
        )
    model = readable(str(document.get("model") or "the bundled model"))
    images = int(document.get("images") or 0)  # how many images the atlas has seen
    counts = (
        f"{images:,} images · the {int(document.get('top_n', 0))} most relevant (RelMax) and most active "
        f"(ActMax) per channel · layers: {', '.join(escape(readable(layer)) for layer in layers)}"
    )
    body = (
        '<form id="controls" autocomplete="off" onsubmit="return false">'
        '<label>search <input id="search" type="search" placeholder="channel or class…" size="18"></label>'
        f'<label>layer <select id="layer"><option value="">all</option>{"".join(options)}</select></label>'
        '<label>sort <select id="sort"><option value="channel">channel</option>'
        '<option value="top">most often a top concept</option>'
        '<option value="relevance">mean relevance, high first</option></select></label></form>\n'
        f'<p id="shown" class="muted"></p>\n{"".join(sections)}'
    )
    return static_page(
        f"Concept atlas · {model}", counts, body, style="concepts.css", script="concepts.js",
        writer="explain/viewer/concept_page.py",
    )  # fmt: skip


def _sortable(value) -> str:
    """A number for a data attribute the page sorts by (0 where it is none, or not finite)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "0"
    return repr(number) if math.isfinite(number) else "0"
