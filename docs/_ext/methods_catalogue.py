"""The Methods page, generated from explain's registry when the site is built.

``.. explain-methods::`` writes a summary table of every registered method (name, family, cost in
passes, target layer, paper), then a section per family and one per method with its class, what
it applies to, and its docstring (formula and paper; the doctests are left to the API reference).
A method registered later appears with no change here.
"""

from __future__ import annotations

import inspect
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: The families in the order the page shows them, with what each one's methods apply to.
FAMILIES = {
    "gradient CAM": "CNNs and vision transformers, through a target layer (a spatial or token output); "
                    "classifiers, and segmentation and detection models with their targets.",
    "gradient-free CAM": "CNNs and vision transformers, through a target layer; no gradients.",
    "perturbation CAM": "CNNs and vision transformers, through a target layer; one forward pass per channel.",
    "gradient attribution": "Any differentiable model (CNNs and vision transformers): a value per input pixel "
                            "and colour channel.",
    "perturbation attribution": "Any model, differentiable or not: a value per input pixel, from the score of "
                                "perturbed copies.",
    "transformer attention": "Vision transformers with global self-attention (ViT, DeiT, Hugging Face ViT); "
                             "not Swin's windowed attention, not CNNs.",
    "relevance": "CNNs made of convolutions, dense layers, pools, norms and element-wise activations, and "
                 "the residual blocks and gates the canonizers turn into modules, through a target layer; "
                 "models with attention, or with a step no rule covers, are refused.",
}
HEADINGS = {"gradient CAM": "Gradient CAMs", "gradient-free CAM": "Gradient-free CAMs",
            "perturbation CAM": "Perturbation CAMs", "gradient attribution": "Gradient attributions",
            "perturbation attribution": "Perturbation attributions",
            "transformer attention": "Transformer attention", "relevance": "Relevance propagation"}
#: Where a method applies to less (or other) than its family.
APPLIES_TO = {
    "cam": "Models that end in global average pooling and one linear layer over the target layer "
           "(most CNNs at their last block); not vision transformers.",
    "fullgrad": "CNNs and vision transformers; no target layer: it reads the biases of every "
                "convolution and batch norm.",
    "lrp": "CNNs; models with attention layers are refused (no rule here conserves relevance "
           "through attention).",
    "guidedgradcam": "CNNs and vision transformers, through a target layer (for its Grad-CAM part).",
    "drise": "Detectors only (torchvision's, Ultralytics YOLO, Hugging Face DETR): a detected box, from the "
             "detector's proposals on randomly masked copies; not classifiers.",
}

_QUOTED = re.compile(r'([A-Z][^.,"]*(?: et al\.)?),\s+"[^"]+",\s+(?:in\s+)?([^;]*?\d{4})(?!\.?\d)')
_SHORT = re.compile(r"\(([A-Z]\w+(?: et al\.| and [A-Z]\w+| & [A-Z]\w+)?),? (\d{4})")


def paper(doc: str) -> str:
    """A short citation of the paper a method's docstring cites ("Selvaraju et al., ICCV 2017"),
    from its paragraphs after the first; "pytorch-grad-cam" for the variants that have no paper.

    >>> paper('Grad-CAM.\\n\\nSelvaraju et al., "Grad-CAM: Visual", ICCV 2017, eq. 1.')
    'Selvaraju et al., ICCV 2017'
    >>> paper('HiResCAM.\\n\\nDraelos & Carin, "Use HiResCAM", arXiv:2011.08891 (2020).')
    'Draelos & Carin, arXiv:2011.08891'
    """
    body = " ".join(doc.split("\n\n", 1)[-1].split())
    for pattern in (_QUOTED, _SHORT):
        found = pattern.search(body)
        if found:
            return f"{found[1]}, {found[2]}" if pattern is _QUOTED else f"{found[1]} {found[2]}"
    return "pytorch-grad-cam" if "pytorch-grad-cam" in body else ""


def without_doctests(doc: str) -> str:
    """The docstring less its doctest blocks (paragraphs that start with ``>>>``)."""
    return "\n\n".join(p for p in doc.split("\n\n") if not p.lstrip().startswith(">>>"))


def anchor(name: str) -> str:
    """The page's label of a method: ``method-gradcam-plus-plus`` for ``gradcam++``."""
    return "method-" + name.replace("++", "-plus-plus").replace("+", "-plus")


def catalogue() -> list[dict[str, object]]:
    """Every registered method with what the page shows of it."""
    from explain.catalogue import describe_methods, method_class

    rows = []
    for name, info in describe_methods().items():
        cls = method_class(name)
        doc = inspect.getdoc(cls) or ""
        rows.append({**info, "name": name, "cls": cls, "doc": doc, "paper": paper(doc),
                     "applies_to": APPLIES_TO.get(name, FAMILIES.get(str(info["family"]), ""))})
    return rows


def _table(rows: list[dict[str, object]]) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 14 14 30 8 34", "",
             "   * - method", "     - family", "     - cost per image and target", "     - layer", "     - paper"]
    for row in rows:
        lines += [f"   * - :ref:`{row['name']} <{anchor(str(row['name']))}>`", f"     - {row['family']}",
                  f"     - {row['cost']}", f"     - {'yes' if row['needs_layer'] else '-'}", f"     - {row['paper']}"]
    return lines + [""]


def _method_section(row: dict[str, object]) -> list[str]:
    cls = row["cls"]
    title = f"``{row['name']}``: {cls.__name__}"
    facts = {"class": f":class:`explain.{cls.__name__}`", "family": row["family"],
             "cost per image and target": row["cost"], "target layer": "yes" if row["needs_layer"] else "no",
             "applies to": row["applies_to"], "paper": row["paper"]}
    lines = [f".. _{anchor(str(row['name']))}:", "", title, "~" * len(title), "",
             ".. list-table::", "   :widths: 22 78", "   :class: method-facts", ""]
    for key, value in facts.items():
        lines += [f"   * - {key}", f"     - {value}"]
    return lines + [""] + without_doctests(str(row["doc"])).splitlines() + [""]


def catalogue_rst() -> list[str]:
    """The reStructuredText the directive puts in the page."""
    rows = catalogue()
    lines = [".. currentmodule:: explain", ""] + _table(rows)
    families = list(FAMILIES) + sorted({str(r["family"]) for r in rows} - set(FAMILIES))
    for family in families:
        members = [row for row in rows if row["family"] == family]
        if not members:
            continue
        heading = HEADINGS.get(family, family)
        lines += [heading, "-" * len(heading), "", FAMILIES.get(family, ""), ""]
        for row in members:
            lines += _method_section(row)
    return lines


class MethodsCatalogue(SphinxDirective):
    """``.. explain-methods::``: the catalogue of registered methods."""

    def run(self):
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(catalogue_rst(), source="explain registry"), container)
        return container.children


def setup(app):
    app.add_directive("explain-methods", MethodsCatalogue)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
