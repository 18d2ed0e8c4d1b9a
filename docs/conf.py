"""Sphinx configuration of explain's documentation site: ``make docs`` builds it to docs/_build/html.

Sphinx, because the docstrings are reStructuredText with :func: and :class: roles, which autodoc
renders as they are, and because the field's libraries (captum, torchcam, zennit, Quantus) publish
their references with it; furo, a maintained theme that reads well on a phone too.
"""

import inspect
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the checkout's explain, installed or not
sys.path.insert(0, str(DOCS / "_ext"))

import explain  # noqa: E402
from sphinx.ext.napoleon import _process_docstring as napoleon_process_docstring  # noqa: E402

project = "explain"
author = "the explain authors"
copyright = "the explain authors, Apache-2.0"
release = version = explain.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_nb",
    "methods_catalogue",
    "api_pages",
]
# No intersphinx: it would download other projects' inventories, and the build runs offline.

exclude_patterns = ["_build", "**.ipynb_checkpoints"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}

# Every warning fails `make docs`, and a cross-reference that leads nowhere is a warning.
nitpicky = True
nitpick_ignore_regex = [
    # Names of other libraries in signatures: without intersphinx (offline) they cannot resolve.
    (r"py:.*", r"(torch|torchvision|numpy|np|PIL|matplotlib|ray|pyarrow|captum|zennit|scipy|skimage|nn|os|"
              r"threading|collections\.abc|typing|pathlib|inspect|Tensor)\b.*"),
]

# autodoc: the signatures as written; each module's __all__ is what a page documents.
autodoc_member_order = "groupwise"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_attr_annotations = False  # a dataclass's field types are in its signature already


def skip_internal_members(app, what, name, obj, skip, options):
    """Leave out the captum class an attribution method runs (``captum_method``): plumbing."""
    return True if name == "captum_method" else None


def parsable_defaults(app, what, name, obj, options, signature, return_annotation):
    """A dataclass field's ``default_factory`` shows as ``<factory>``, which is no Python, so
    Sphinx would split the whole signature at its commas: show it as ``...``."""
    return (signature.replace("<factory>", "...") if signature else signature), return_annotation


def numpy_sections(app, what, name, obj, options, lines):
    """Napoleon, except on attributes and properties: it would read the first line of their
    prose ("What the last call explained: a target ...") as "type: description". A constant
    without a comment of its own gets its type's docstring (str's, dict's): dropped."""
    if what == "data" and type(obj).__doc__ and "\n".join(lines).strip() == inspect.cleandoc(type(obj).__doc__):
        lines.clear()
    if what not in ("attribute", "data", "property"):
        napoleon_process_docstring(app, what, name, obj, options, lines)


def setup(app):
    for listener in list(app.events.listeners["autodoc-process-docstring"]):
        if listener.handler is napoleon_process_docstring:
            app.disconnect(listener.id)
    app.connect("autodoc-process-docstring", numpy_sections)
    app.connect("autodoc-skip-member", skip_internal_members)
    app.connect("autodoc-process-signature", parsable_defaults)

# The tutorials are rendered from the outputs committed with them, never executed here.
nb_execution_mode = "off"
# A notebook's text/markdown outputs (the result tables of tutorials 02 and 04) as MyST, whose
# tables render as tables; myst-nb's default, CommonMark, has none (they would read as raw
# `| ... |` text). tests/test_docs.py fails on a raw table in any page.
nb_render_markdown_format = "myst"
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"explain {version}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {"navigation_with_keys": True}
# The right-hand contents of a page list its sections, not every class, method and attribute
# autodoc documents (the API pages open with summary tables of their names instead).
toc_object_entries = False
