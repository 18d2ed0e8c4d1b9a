"""What the static pages of an analysis folder share (the concept atlas's, CRAFT's, and any
later one, such as TCAV's): the document around a page's body, in the explorer's style
(``explorer.css`` and ``pages.css``, with a page kind's own style sheet), and the small pieces
they draw: numbers, and bars with their spread and the values they are compared with.

A page kind is one module of :mod:`explain.viewer` with one public function from its folder's
JSON document to the page's text (:func:`explain.viewer.concept_page.concept_page`,
:func:`explain.viewer.craft_page.craft_page`); the writer of the folder calls it and writes
``index.html``. The pages need no server and no network: they are read from file://.

A new page kind (TCAV's scores, say) is: a module ``explain/viewer/KIND_page.py`` with
``KIND_page(document) -> str`` that makes its rows (``<tr>`` elements, numbers by
:func:`number`, a score by :func:`bar` with its ``spread`` and ``dots``) and returns
:func:`static_page` of a :func:`table` of them; its own style sheet beside it only where
``pages.css`` does not do; one line in the folder's writer (``explain/analysis/*_files.py``:
``(temp / "index.html").write_text(KIND_page(summary))``, and ``"index.html"`` in its
``WRITTEN``); and a browser test as ``tests/test_strategy_pages.py``'s CRAFT test."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from . import asset

__all__ = ["bar", "number", "static_page", "table"]


def number(value, digits: int = 3) -> str:
    """A number as a page shows it: ``digits`` significant digits, ``-`` where there is none.

    >>> number(0.123456), number(None), number(float("nan")), number(12, 2)
    ('0.123', '-', '-', '12')
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}"


def _share(value: float, low: float, high: float) -> float:
    """Where ``value`` lies between ``low`` and ``high``, in percent (clipped to 0..100)."""
    if not math.isfinite(value) or high <= low:
        return 0.0
    return round(100 * min(max((value - low) / (high - low), 0.0), 1.0), 2)


def bar(
    value: float | None,
    high: float,
    *,
    low: float = 0.0,
    spread: float | None = None,
    dots: Sequence[float] = (),
    title: str = "",
) -> str:
    """A horizontal bar of ``value`` on the scale ``low``..``high``: with ``spread``, a whisker
    of ± that much around its end (a standard deviation); with ``dots``, one dot per value it
    is compared with (a TCAV score's random sets). Values off the scale are drawn at its ends.

    >>> bar(0.5, 1.0)
    '<div class="bar" title=""><span class="fill" style="width:50.0%"></span></div>'
    """
    if value is None or not math.isfinite(value):
        return f'<div class="bar none" title="{escape(title)}"></div>'
    parts = [f'<span class="fill" style="width:{_share(value, low, high)}%"></span>']
    if spread is not None and math.isfinite(spread) and spread > 0:
        left, right = _share(value - spread, low, high), _share(value + spread, low, high)
        parts.append(f'<span class="spread" style="left:{left}%;width:{round(right - left, 2)}%"></span>')
    parts.extend(
        f'<span class="dot" style="left:{_share(dot, low, high)}%" title="{number(dot)}"></span>'
        for dot in dots
        if dot is not None and math.isfinite(dot)
    )
    return f'<div class="bar" title="{escape(title)}">{"".join(parts)}</div>'


def table(table_id: str, headers: Sequence[str], rows: Sequence[str]) -> str:
    """A table of results (``class="results"``) with the column ``headers`` (plain text) and
    the ``rows``: each a ``<tr>`` element's HTML (a page kind makes them, with the data
    attributes its tests and scripts read).

    >>> table("t", ["a"], ["<tr><td>1</td></tr>"])
    '<table class="results" id="t"><thead><tr><th>a</th></tr></thead><tbody><tr><td>1</td></tr></tbody></table>'
    """
    head = "".join(f"<th>{escape(text)}</th>" for text in headers)
    return (
        f'<table class="results" id="{escape(table_id)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def static_page(title: str, counts: str, body: str, *, style: str = "", script: str = "", writer: str = "") -> str:
    """A page's whole document: ``title`` (plain text), the header line ``counts`` (HTML), the
    ``body`` (HTML), the page kind's own ``style`` sheet and ``script`` (asset names beside
    this module, or empty); ``writer`` names the module that wrote it."""
    styles = "\n".join(asset(name) for name in ("explorer.css", "pages.css", style) if name)
    code = f"<script>\n{asset(script)}\n</script>\n" if script else ""
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n"
        f"<!-- Written by explain ({escape(writer)}): this page needs no server and no network. -->\n"
        f"<style>\n{styles}\n</style>\n</head>\n<body>\n"
        f'<header id="run"><h1 id="title">{escape(title)}</h1><p id="counts">{counts}</p></header>\n'
        f"{body}\n{code}</body>\n</html>\n"
    )
