"""The Methods page and the guide's tables of methods, generated from explain's registry when
the site is built.

``.. explain-methods::`` writes a summary table of every registered method (name, family, cost in
passes, target layer, paper), then a section per family and one per method with its class, what
it applies to, and its docstring (formula and paper; the doctests are left to the API reference).
``explain-methods-table`` (in a Markdown page: a fenced directive whose argument names families)
writes a table of their methods, its columns chosen from :data:`COLUMNS` (the formula and what
computes it come from each class's ``formula`` and ``runs_on``). The families come in the order
of ``explain.base.FAMILIES`` and the methods in the registry's; a method registered later
appears with no change here.
"""

from __future__ import annotations

import inspect
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: What each family's methods apply to (the families come in the order of explain.base.FAMILIES).
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
    "layer attribution": "Any differentiable model, through a target layer: a value per unit of the layer "
                         "(or, with ``neuron=``, per input pixel for one unit).",
}
HEADINGS = {"gradient CAM": "Gradient CAMs", "gradient-free CAM": "Gradient-free CAMs",
            "perturbation CAM": "Perturbation CAMs", "gradient attribution": "Gradient attributions",
            "perturbation attribution": "Perturbation attributions", "layer attribution": "Layer attributions",
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


_CATALOGUE: list[dict[str, object]] = []


def catalogue() -> list[dict[str, object]]:
    """Every registered method with what the pages show of it (its cost and formula written out
    from its defaults). Made once, when the build starts (``builder-inited``): autodoc's
    ``autodoc_preserve_defaults`` later puts the source text of each default in its place."""
    if not _CATALOGUE:
        _CATALOGUE.extend(_catalogue())
    return _CATALOGUE


def _catalogue() -> list[dict[str, object]]:
    from explain.base import with_defaults
    from explain.catalogue import describe_methods, method_class

    rows = []
    for name, info in describe_methods().items():
        cls = method_class(name)
        doc = inspect.getdoc(cls) or ""
        rows.append({**info, "name": name, "cls": cls, "doc": doc, "paper": paper(doc),
                     "applies_to": APPLIES_TO.get(name, FAMILIES.get(str(info["family"]), "")),
                     "formula": with_defaults(cls, cls.formula),
                     "neuron": with_defaults(cls, getattr(cls, "neuron_formula", ""))})
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
    facts = {"class": f":class:`{public_name(cls)}`", "family": row["family"],
             "cost per image and target": row["cost"], "target layer": "yes" if row["needs_layer"] else "no",
             "applies to": row["applies_to"], "paper": row["paper"]}
    lines = [f".. _{anchor(str(row['name']))}:", "", title, "~" * len(title), "",
             ".. list-table::", "   :widths: 22 78", "   :class: method-facts", ""]
    for key, value in facts.items():
        lines += [f"   * - {key}", f"     - {value}"]
    return lines + [""] + without_doctests(str(row["doc"])).splitlines() + [""]


def family_order(rows: list[dict[str, object]]) -> list[str]:
    """The families of ``rows`` in explain's order (explain.base.FAMILIES, then the others by name)."""
    from explain.base import FAMILIES as ORDER

    present = {str(row["family"]) for row in rows}
    return [family for family in ORDER if family in present] + sorted(present - set(ORDER))


def catalogue_rst() -> list[str]:
    """The reStructuredText the directive puts in the page."""
    rows = catalogue()
    lines = [".. currentmodule:: explain", ""] + _table(rows)
    for family in family_order(rows):
        members = [row for row in rows if row["family"] == family]
        if not members:
            continue
        heading = HEADINGS.get(family, family)
        lines += [heading, "-" * len(heading), "", FAMILIES.get(family, ""), ""]
        for row in members:
            lines += _method_section(row)
    return lines


def public_name(cls: type) -> str:
    """Where the reference documents ``cls``: ``explain.NAME`` for the methods of
    explain.methods, which explain exports, else its package's name (``explain.concepts``'s
    ``crp``)."""
    if cls.__module__.startswith("explain.methods."):
        return f"explain.{cls.__name__}"
    return f"{cls.__module__.rsplit('.', 1)[0]}.{cls.__name__}"


def _module(cls: type) -> str:
    """The file of ``cls`` under explain/methods/ (``relevance/excitation.py``), or under
    explain/ for a method registered elsewhere (``concepts/method.py``)."""
    if cls.__module__.startswith("explain.methods."):
        return cls.__module__.removeprefix("explain.methods.").replace(".", "/") + ".py"
    return cls.__module__.removeprefix("explain.").replace(".", "/") + ".py"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


#: The columns of ``explain-methods-table``: heading, and the cell of a catalogue row.
COLUMNS = {
    "family": ("family", lambda row: row["family"]),
    "class": ("method", lambda row: f"`{row['cls'].__name__}`"),
    "name": ("name", lambda row: f"`{row['name']}`"),
    "formula": ("formula", lambda row: row["formula"]),
    "neuron": ("with `neuron=`", lambda row: row["neuron"]),
    "runs_on": ("runs on", lambda row: row["cls"].runs_on),
    "cost": ("cost", lambda row: row["cost"]),
    "paper": ("paper", lambda row: row["paper"]),
    "module": ("module", lambda row: f"`{_module(row['cls'])}`"),
}


def methods_table(families: list[str], columns: list[str], headings: dict[str, str] | None = None) -> list[str]:
    """A Markdown table of the registered methods of ``families`` (in explain's order), one row
    each, with ``columns`` (keys of :data:`COLUMNS`; ``headings`` replaces their headings); a
    family's name shows on its first row only.

    >>> print("\\n".join(methods_table(["transformer attention"], ["name", "cost"])[:3]))
    | name | cost |
    |---|---|
    | `attention-relevance` | 1 forward + 1 backward to the first attention |
    """
    rows = catalogue()
    unknown = [c for c in columns if c not in COLUMNS] + [f for f in families if f not in family_order(rows)]
    if unknown:
        raise ValueError(f"explain-methods-table: unknown column or family {unknown}; columns: {', '.join(COLUMNS)}")
    headings = {**{key: heading for key, (heading, _) in COLUMNS.items()}, **(headings or {})}
    lines = ["| " + " | ".join(headings[c] for c in columns) + " |", "|" + "---|" * len(columns)]
    for family in [f for f in family_order(rows) if f in families]:
        for i, row in enumerate(row for row in rows if row["family"] == family):
            cells = [COLUMNS[c][1](row) if c != "family" or i == 0 else "" for c in columns]
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return lines


class MethodsTable(SphinxDirective):
    """``explain-methods-table``, in a Markdown page: a table of the methods of the families
    its argument names (comma-separated), with the ``:columns:`` given (comma-separated keys of
    :data:`COLUMNS`) and ``:formula:`` as the formula column's heading."""

    required_arguments = 1
    final_argument_whitespace = True
    option_spec = {"columns": lambda text: [c.strip() for c in text.split(",") if c.strip()],
                   "formula": str}

    def run(self):
        families = [f.strip() for f in self.arguments[0].split(",") if f.strip()]
        columns = self.options.get("columns", ["family", "name", "formula", "paper", "module"])
        headings = {"formula": self.options["formula"]} if "formula" in self.options else {}
        container = nodes.container()
        table = methods_table(families, columns, headings)
        self.state.nested_parse(StringList(table, source="explain registry"), self.content_offset, container)
        return container.children


class MethodsCatalogue(SphinxDirective):
    """``.. explain-methods::``: the catalogue of registered methods."""

    def run(self):
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(catalogue_rst(), source="explain registry"), container)
        return container.children


def setup(app):
    app.connect("builder-inited", lambda app: catalogue())  # before autodoc changes the defaults
    app.add_directive("explain-methods", MethodsCatalogue)
    app.add_directive("explain-methods-table", MethodsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
