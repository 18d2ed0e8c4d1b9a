"""The pages of the API reference that document ``explain``'s own names, generated from the
package when the site is built, so that a name added to ``explain.__all__`` (or a method
registered in a family) lands on its page with no change here.

``.. explain-api:: PAGE`` writes a summary table of the page's names (each with the first
sentence of its docstring) and then a section per group with their entries: ``cams`` (the
CAM families), ``attributions`` (the attribution and relevance families, the noise tunnel),
``attention`` (transformer attention) and ``explain`` (every other name of ``explain``,
grouped by what it is for; a name no group claims goes under "More"). ``.. explain-summary::
MODULE`` writes the summary table of a module's ``__all__``.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: The method families on each method page, in the order of their sections, with headings.
METHOD_PAGES = {
    "cams": {"gradient CAM": "Gradient CAMs", "gradient-free CAM": "Gradient-free CAMs",
             "perturbation CAM": "Perturbation CAMs"},
    "attributions": {"gradient attribution": "Gradient attributions", "layer attribution": "Layer attributions",
                     "perturbation attribution": "Perturbation attributions",
                     "relevance": "Relevance propagation"},
    "attention": {"transformer attention": "Transformer attention"},
}
#: Base classes shown first on a method page.
BASES = {"cams": ("BaseCAM", "GradientCAM"), "attributions": ("Attribution", "NoiseTunnel"), "attention": ()}
#: The sections of the ``explain`` page: (heading, the modules of explain._EXPORTS or names).
EXPLAIN_SECTIONS = [
    ("Making and calling explainers", ("Explainer", "Explanation", "ConceptExplanation", "explainer", "method_names",
                                       "method_class",
                                       "describe_methods", "explain_together", "register", "NotApplicable")),
    ("Drawing maps", ("drawing",)),
    ("Layers, hooks and model summaries", ("layers", "hooks", "tokens", "model_summary")),
    ("Inputs and targets", ("image_input", "similarity")),
    ("Segmentation and detection", ("tasks", "detectors")),
]
#: Names documented on another page (explain.tasks, explain.concepts), though explain exports
#: them too.
ELSEWHERE = ("SegmentationTarget", "DetectionTarget", "CRP", "ConceptAtlas", "concept_atlas", "reference_patches")


_ROLE = re.compile(r":[\w:]+:`(~?)([^`<]*?)\s*(?:<([^>]+)>)?`")


def plain_roles(text: str) -> str:
    """``text`` with its cross-reference roles made literals: a summary table sits outside
    the module its names are relative to.

    >>> plain_roles("See :func:`~explain.overlay`, :class:`the result <explain.Explanation>`.")
    'See ``overlay``, the result.'
    """

    def literal(found: re.Match) -> str:
        if found[3]:
            return found[2]
        return f"``{found[2].split('.')[-1] if found[1] else found[2]}``"

    return _ROLE.sub(literal, text)


def first_sentence(obj, module: str = "") -> str:
    """The first sentence of ``obj``'s docstring, on one line, its roles made literals (for a
    constant, of its ``#:`` comment in ``module`` or a module below it).

    >>> first_sentence(first_sentence)
    "The first sentence of ``obj``'s docstring, on one line, its roles made literals (for a constant, of its ``#:`` comment in ``module`` or a module below it)."
    """
    doc = inspect.getdoc(obj) or ""
    if not (inspect.isclass(obj) or callable(obj) or inspect.ismodule(obj)):
        doc = _attribute_doc(obj, module)
    paragraph = " ".join(doc.split("\n\n")[0].split())
    end = paragraph.find(". ")
    return plain_roles(paragraph if end < 0 else paragraph[: end + 1])


def _attribute_doc(obj, module: str) -> str:
    """The ``#:`` comment of the constant ``obj`` is, in ``module`` or a module below it."""
    from sphinx.pycode import ModuleAnalyzer

    below = sorted(n for n in sys.modules if n == module or n.startswith(module + "."))
    package = sorted(n for n in sys.modules if n.startswith("explain.") and n not in below)
    for name in below + package:  # where it is defined may lie outside ``module``
        try:
            docs = ModuleAnalyzer.for_module(name).find_attr_docs()
        except Exception:  # a module without source (a C extension)
            continue
        for (_, attribute), lines in docs.items():
            if getattr(sys.modules[name], attribute, None) is obj:
                return "\n".join(lines)
    return ""


def public_names() -> list[str]:
    """explain's exported names, less its submodules (documented on pages of their own)."""
    import explain

    return [name for name in explain.__all__ if not inspect.ismodule(getattr(explain, name))]


def home(name: str) -> str:
    """The module of explain that defines ``name``: ``drawing`` for ``explain.overlay``."""
    import explain

    parts = (getattr(getattr(explain, name), "__module__", None) or "").split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "explain" else ""


def _method_families() -> dict[str, str]:
    """explain's exported method classes by name -> their family."""
    import explain
    from explain.catalogue import method_class, method_names

    exported = {getattr(explain, name): name for name in public_names()}
    families = {}
    for method in method_names():
        cls = method_class(method)
        if cls in exported:
            families[exported[cls]] = cls.family
    return families


def page_groups(page: str) -> list[tuple[str, list[str]]]:
    """(heading, names) of each section of ``page``, the names in the order they are shown."""
    families = _method_families()
    if page in METHOD_PAGES:
        groups = [("Base classes", list(BASES[page]))] if BASES[page] else []
        for family, heading in METHOD_PAGES[page].items():
            groups.append((heading, [name for name, of in families.items() if of == family]))
        return [(heading, names) for heading, names in groups if names]
    if page != "explain":
        raise ValueError(f"no API page {page!r}; pages: explain, {', '.join(METHOD_PAGES)}")
    claimed = {name for names in (BASES[p] for p in METHOD_PAGES) for name in names}
    claimed |= {name for name, family in families.items() if any(family in f for f in METHOD_PAGES.values())}
    rest = [name for name in public_names() if name not in claimed and name not in ELSEWHERE]
    groups = []
    for heading, keys in EXPLAIN_SECTIONS:
        names = [n for n in rest if n in keys or home(n) in keys]
        names.sort(key=lambda n: keys.index(n) if n in keys else len(keys))
        groups.append((heading, names))
    shown = {name for _, names in groups for name in names}
    groups.append(("More", [name for name in rest if name not in shown]))
    return [(heading, names) for heading, names in groups if names]


def summary_table(module: str, names: list[str]) -> list[str]:
    """A two-column list-table: each name, linked, and the first sentence of its docstring."""
    mod = importlib.import_module(module)
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 28 72", "   :class: api-summary", "",
             "   * - name", "     - what it is"]
    for name in names:
        obj = getattr(mod, name)
        role = "class" if inspect.isclass(obj) else "func" if callable(obj) else "data"
        lines += [f"   * - :{role}:`~{module}.{name}`", f"     - {first_sentence(obj, module) or '-'}"]
    return lines + [""]


def entry(name: str) -> list[str]:
    import explain

    obj = getattr(explain, name)
    if inspect.isclass(obj):
        # the base class documents the call that every method shares
        special = ["   :special-members: __call__"] if name == "Explainer" else []
        return [f".. autoclass:: explain.{name}", "   :members:", *special, ""]
    if callable(obj):
        return [f".. autofunction:: explain.{name}", ""]
    return [f".. autodata:: explain.{name}", ""]


def page_rst(page: str) -> list[str]:
    groups = page_groups(page)
    lines = summary_table("explain", [name for _, names in groups for name in names])
    for heading, names in groups:
        lines += [heading, "-" * len(heading), ""]
        for name in names:
            lines += entry(name)
    return lines


class ApiPage(SphinxDirective):
    """``.. explain-api:: PAGE``: a page of explain's names (see the module's docstring)."""

    required_arguments = 1

    def run(self):
        text = StringList(page_rst(self.arguments[0]), source=f"explain-api {self.arguments[0]}")
        node = nodes.container()
        nested_parse_with_titles(self.state, text, node)
        return node.children


class ApiSummary(SphinxDirective):
    """``.. explain-summary:: MODULE``: the summary table of ``MODULE.__all__``."""

    required_arguments = 1

    def run(self):
        module = self.arguments[0]
        names = list(importlib.import_module(module).__all__)
        node = nodes.container()
        nested_parse_with_titles(self.state, StringList(summary_table(module, names), source=module), node)
        return node.children


def setup(app):
    app.add_directive("explain-api", ApiPage)
    app.add_directive("explain-summary", ApiSummary)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
