"""The package's architecture, read from its source: layers that import only downwards, no
import cycles, no private names borrowed across modules, and metrics that do not depend on
the methods they score.

Every import counts, those inside functions too; relative imports are resolved; imports
under ``if TYPE_CHECKING:`` are left out (they never run). ``explain/__init__.py``, the lazy
face that imports its names on first use, is exempt.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "explain"

#: The core: what everything else builds on (each module of the package that no other layer
#: names belongs here too).
CORE = (
    "explain.base", "explain.layers", "explain.tokens", "explain.hooks", "explain.attention_capture",
    "explain.targets", "explain.explanation", "explain.checks", "explain.baselines", "explain.superpixels",
    "explain.regions", "explain.model_tasks", "explain.imagenet", "explain.drawing", "explain.images",
    "explain.options", "explain.errors", "explain.heap", "explain.concurrency", "explain.passes",
    "explain.similarity", "explain.image_input",
)
#: The layers, top to bottom. A module may import modules of its own layer or of lower
#: ones, never of a higher one. A name covers a module and, for a package, all of it.
LAYERS: list[tuple[str, ...]] = [
    ("explain.cli",),                                                     # 1 the command line
    ("explain.ray_data",),                                                # 2 Ray Data for pipelines of one's own
    ("explain.batch",),                                                   # 3 the batch engine
    ("explain.evaluation", "explain.report", "explain.viewer", "explain.model_summary"),  # 4 scoring, reports, summaries
    ("explain.tasks", "explain.metrics"),                                 # 5 tasks and metrics
    ("explain.catalogue",),                                               # 6 the methods by name
    ("explain.concepts",),                                                # 7 concepts: CRP, the atlas, feature visualisation
    ("explain.methods",),                                                 # 8 the methods
    ("explain.models",),                                                  # 9 loading models
    CORE,                                                                 # 10 the core
]
#: The lazy face of the package, exempt from every rule.
FACE = "explain"
#: (importer, imported): imports forbidden besides the layering (a metric scores any
#: explainer, so the metrics never reach for the methods, nor for the concepts built on them).
FORBIDDEN = [
    ("explain.metrics", "explain.methods"), ("explain.metrics", "explain.catalogue"),
    ("explain.metrics", "explain.concepts"),
]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _within(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module``: that of the longest name covering it; the core's
    for a module no name covers."""
    best, index = "", len(LAYERS) - 1
    for i, names in enumerate(LAYERS):
        for name in names:
            if _within(module, name) and len(name) > len(best):
                best, index = name, i
    return index


def _owner(name: str) -> str | None:
    """The module of the package that ``name`` (a dotted path) lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """The import statements of ``tree``, at any depth, outside ``if TYPE_CHECKING:`` blocks."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _import_graph() -> tuple[dict[str, dict[str, int]], list[str]]:
    """Edges importer -> {imported module: line} between the package's modules, and the
    imports of a private (underscore) name from another module."""
    edges: dict[str, dict[str, int]] = defaultdict(dict)
    private = []
    for module, path in MODULES.items():
        if module == FACE:
            continue
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node in _imports(tree):
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            targets = []
            if isinstance(node, ast.Import):
                targets = [_owner(alias.name) for alias in node.names]
            else:
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if not _within(source, FACE):
                    continue
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if full in MODULES:  # a submodule
                        targets.append(full)
                        continue
                    targets.append(_owner(source))
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{where}: {module} imports {alias.name} from {source}")
            for target in targets:
                if target and target != module:
                    edges[module].setdefault(target, node.lineno)
    return edges, private


EDGES, PRIVATE = _import_graph()


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _judged() -> dict[str, dict[str, int]]:
    """The import graph without the exempt face (whose own imports are not read at all)."""
    return {a: {b: line for b, line in targets.items() if b != FACE} for a, targets in EDGES.items()}


def test_the_layers_name_modules_that_exist():
    named = [name for names in LAYERS for name in names]
    assert len(named) == len(set(named)), "a module is in two layers"
    missing = [name for name in named if name not in MODULES]
    assert not missing, f"LAYERS names modules that do not exist: {missing}"


def test_the_graph_sees_the_imports_inside_functions():
    # catalogue imports the methods at its top; layers imports the tasks of models at its top;
    # the Ray stages import the model check inside the function that runs in a worker.
    assert "explain.methods" in EDGES["explain.catalogue"]
    assert "explain.model_tasks" in EDGES["explain.layers"]
    assert "explain.batch.preparation" in EDGES["explain.batch.ray_stages"]


def test_no_import_cycles():
    """A package's face importing its own children is no cycle; a child importing its
    parent's face is an edge to the parent, and closes one."""
    cycles = _cycles(_judged())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_imports_go_down_the_layers():
    upward = []
    for importer, targets in sorted(_judged().items()):
        for imported, line in sorted(targets.items()):
            if layer_of(imported) < layer_of(importer):
                upward.append(f"{MODULES[importer].relative_to(PACKAGE.parent)}:{line}: {importer} "
                              f"(layer {layer_of(importer) + 1}) imports {imported} (layer {layer_of(imported) + 1})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_private_names_imported_across_modules():
    assert not PRIVATE, "underscore names imported from another module:\n" + "\n".join(PRIVATE)


@pytest.mark.parametrize("importer, imported", FORBIDDEN)
def test_forbidden_imports(importer, imported):
    found = [f"{a} imports {b}" for a, targets in EDGES.items() if _within(a, importer)
             for b in targets if _within(b, imported)]
    assert not found, "\n".join(found)


def test_each_public_name_is_exported_once():
    import explain

    names = [name for names in explain._EXPORTS.values() for name in names]
    assert len(names) == len(set(names)), "a name is listed under two modules"
    assert set(explain.__all__) == set(names) | set(explain._SUBMODULES)
    for module in (*explain._EXPORTS, *explain._SUBMODULES):
        assert f"explain.{module}" in MODULES, module


def _code_lines(node: ast.AST) -> int:
    """The lines of a function or class, its docstring left out (a long explanation is welcome)."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_functions_and_classes_stay_small():
    # Past ~60 lines a function does several things, past ~200 a class holds several jobs:
    # split them into parts whose names say what each does.
    too_long = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            limit = 60 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else 200
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _code_lines(node) > limit:
                too_long.append(f"{module}.{node.name}: {_code_lines(node)} lines (limit {limit})")
    assert not too_long, too_long
