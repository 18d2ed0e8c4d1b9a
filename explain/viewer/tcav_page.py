"""TCAV's page: ``index.html`` of an ``explain concepts tcav`` folder, read from its
``tcav.json`` (:func:`explain.analysis.write_tcav` writes both): one row per concept x layer x
class, the TCAV score as a bar (its mean over the random sets, ± their standard deviation)
with the null's scores (random directions) as dots beside it, the p-value before and after
the correction, and the answer: significant or not, and which way.

Static HTML in the explorer's style (:func:`explain.viewer.pages.static_page`); no script, no
server, no network."""

from __future__ import annotations

from html import escape

from . import readable
from .pages import bar, number, static_page, table

__all__ = ["tcav_page"]

#: How each direction reads (tcav.json's ``direction``: the concept's mean score against the null's).
DIRECTIONS = {"+": "up", "-": "down", "0": "neither"}


def _answer(entry: dict) -> str:
    if not entry.get("significant"):
        return '<span class="answer no">not significant</span>'
    way = DIRECTIONS.get(str(entry.get("direction")), "")
    return f'<strong class="answer yes">significant{f" ({way})" if way else ""}</strong>'


def _row(entry: dict) -> str:
    mean, spread = entry.get("score_mean"), entry.get("score_std")
    shown = f"{number(mean)} ± {number(spread)}"
    nulls = [value for value in entry.get("null_scores") or [] if value is not None]
    title = f"score {shown}; null {number(entry.get('null_mean'))} (dots: its {len(nulls)} random directions)"
    name = readable(str(entry.get("class") if entry.get("class") is not None else entry.get("class_id")))
    return (
        f'<tr class="score" data-concept="{escape(str(entry.get("concept")))}" '
        f'data-class="{escape(name)}" data-significant="{str(bool(entry.get("significant"))).lower()}" '
        f'data-direction="{escape(str(entry.get("direction")))}" data-score="{number(mean, 6)}">'
        f"<td>{escape(readable(str(entry.get('concept'))))}</td><td>{escape(readable(str(entry.get('layer'))))}</td>"
        f"<td>{escape(name)}</td><td>{bar(mean, 1.0, spread=spread, dots=nulls, title=title)}</td>"
        f'<td class="number">{shown}</td><td class="number">{number(entry.get("null_mean"))}</td>'
        f'<td class="number">{number(entry.get("p_value"))}</td>'
        f'<td class="number">{number(entry.get("corrected_p"))}</td>'
        f'<td>{_answer(entry)}</td><td class="number">{number(entry.get("cav_accuracy"))}</td></tr>'
    )


def tcav_page(document: dict) -> str:
    """The TCAV folder's index.html from ``document`` (its ``tcav.json``)."""
    scores = list(document.get("scores") or [])
    classes = ", ".join(readable(str(c.get("name") or c.get("id"))) for c in document.get("classes") or [])
    layers = ", ".join(readable(str(layer)) for layer in document.get("layers") or [])
    title = f"TCAV · {classes or 'no class'} at {layers or 'no layer'}"
    sets = len(document.get("random_sets") or [])
    significant = sum(bool(entry.get("significant")) for entry in scores)
    counts = (
        f"{len(scores)} scores, {significant} significant · {sets} random sets · "
        f"{document.get('alternative', 'two-sided')} t-test at alpha {number(document.get('alpha'))}, "
        f"p-values times {int(document.get('tests') or 1)} (Bonferroni: concepts x layers) · "
        "Kim et al., ICML 2018"
    )
    headers = [
        "concept", "layer", "class", "TCAV score (bar: mean ± sd over the random sets; dots: random directions)",
        "score", "null mean", "p", "corrected p", "answer", "CAV accuracy",
    ]  # fmt: skip
    reading = (
        '<p class="muted">A TCAV score is the share of the class\'s images whose score grows along the '
        "concept's direction in the layer. A concept is significant where its scores over the random sets "
        "differ from those of random directions (the dots); up: the concept speaks for the class, down: "
        "against it. A CAV accuracy near 0.5 says the layer does not tell the concept from random images, "
        "so its score tests nothing.</p>"
    )
    body = f"<h2>Scores</h2>{reading}{table('scores', headers, [_row(entry) for entry in scores])}"
    return static_page(title, escape(counts), body, writer="explain/viewer/tcav_page.py")
