"""The package's architecture, read from its source: layers that import only downwards, no
import cycles, no private names borrowed across modules, metrics that do not depend on
the methods they score, and methods that are their classes alone: no module outside
``explain/methods/`` names a module inside it, and the tests keep no lists of methods by hand.

Every import counts, those inside functions too; relative imports are resolved; imports
under ``if TYPE_CHECKING:`` are left out (they never run). ``explain/__init__.py``, the lazy
face that imports its names on first use, is exempt.
"""

from __future__ import annotations

import ast
import re
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
    "explain.options", "explain.errors", "explain.heap", "explain.concurrency", "explain.passes", "explain.pass_listener",
    "explain.similarity", "explain.image_input", "explain.data",
)
#: The layers, top to bottom. A module may import modules of its own layer or of lower
#: ones, never of a higher one. A name covers a module and, for a package, all of it.
LAYERS: list[tuple[str, ...]] = [
    ("explain.cli", "explain.__main__"),                                  # 1 the command line
    ("explain.ray_data",),                                                # 2 Ray Data for pipelines of one's own
    ("explain.batch",),                                                   # 3 the batch engine
    ("explain.evaluation", "explain.report", "explain.viewer", "explain.model_summary", "explain.analysis"),  # 4 scoring, reports, summaries, the dataset analyses
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
#: The batch layer's engines: what runs the jobs, here and on Ray.
ENGINES = ("explain.batch.local_run", "explain.batch.ray_driver", "explain.batch.ray_stages", "explain.batch.ray_jobs")
#: What the engines run never reaches back for them: the job interface and its jobs, the group
#: explainer, the task strategies and the records they return; so a new job or task plugs in
#: without touching an engine.
FORBIDDEN += [
    (module, engine)
    for module in ("explain.batch.job", "explain.batch.evaluating", "explain.batch.explaining",
                   "explain.batch.task_outputs", "explain.batch.outputs", "explain.batch.manifest",
                   "explain.batch.writing", "explain.batch.options")
    for engine in ENGINES
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
    from explain import methods

    names = [name for names in explain._EXPORTS.values() for name in names]
    names += [*methods.BASES, *methods.METHOD_CLASSES]  # the methods: from the registry
    assert len(names) == len(set(names)), "a name is listed under two modules"
    assert set(explain.__all__) == set(names) | set(explain._SUBMODULES)
    for module in (*explain._EXPORTS, *explain._SUBMODULES):
        assert f"explain.{module}" in MODULES, module
    assert all(getattr(explain, name) is getattr(methods, name) for name in methods.METHOD_CLASSES)


def test_no_module_outside_the_methods_imports_a_family_module():
    """Outside explain/methods/, a method is reached through the package's exports
    (explain.methods, listed from the registry) or by name through explain.catalogue: no module
    names a module inside explain/methods/, so a new method in its family module needs no
    import anywhere else."""
    found = [
        f"{MODULES[importer].relative_to(PACKAGE.parent)}:{line}: {importer} imports {imported}"
        for importer, targets in sorted(EDGES.items()) if not _within(importer, "explain.methods")
        for imported, line in sorted(targets.items()) if imported.startswith("explain.methods.")
    ]
    assert not found, "import the methods from explain.methods or explain.catalogue:\n" + "\n".join(found)


TESTS = PACKAGE.parent / "tests"
#: Literal collections of methods the tests may keep, and why: lists of methods expected to
#: refuse (a new method is run, and fails loudly where it refuses too), a table the tests check
#: against the registry, and the methods that have a reference implementation to compare with.
KEPT_LISTS = {
    ("conftest.py", "CHEAP"): "the one table of cheap settings; test_api checks that it keeps every method cheap",
    ("test_detectors.py", "SKIP"): "the methods expected not to apply to detectors",
    ("test_methods_reference.py", "NEW_METHODS"): "the CAMs with a pytorch-grad-cam reference",
    ("test_transformers.py", "REFUSED_SWIN"): "the methods expected to refuse Swin, with their reasons",
    ("test_zoo.py", "EMBEDDER_REFUSALS"): "the methods expected to refuse each embedding model",
}
#: A slice of a list of methods: the methods it keeps are those at some positions.
_SLICED = re.compile(r"\b(\w*(?:METHODS|CAMS|ATTRIBUTIONS)\w*|method_names\(\))\s*\[\s*-?\d*\s*:")


def _literal_names(tree: ast.AST) -> list[tuple[str, int, set[str]]]:
    """The string constants of each list, tuple, set or dict (its keys) in ``tree``, with the
    name of the variable it is assigned to ("" where none) and its line."""
    assigned = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            assigned.update((id(inner), node.targets[0].id) for inner in ast.walk(node.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            elements = node.keys if isinstance(node, ast.Dict) else node.elts
            strings = {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            found.append((assigned.get(id(node), ""), node.lineno, strings))
    return found


def test_the_tests_keep_no_lists_of_methods_by_hand():
    """The tests choose their methods from the registry, by the classes' attributes (``family``,
    ``images_only``, ``needs_layer``, ``backward``, ``trains``...), never by position in a list
    nor by a literal list that names every method of a family, those an attribute selects, or
    most methods: an added method is then tested by every test it belongs in, with no list to
    update."""
    import explain

    names = explain.method_names()
    families: dict[str, set[str]] = defaultdict(set)
    for name in names:
        families[explain.method_class(name).family].add(name)
    censuses = {family: members for family, members in families.items() if len(members) >= 3}
    # the methods an attribute selects (or leaves out), which a literal list would copy by hand
    selections = {}
    for attribute in ("trains", "needs_layer", "backward", "images_only"):
        chosen = {name for name in names if getattr(explain.method_class(name), attribute)}
        selections.update({attribute: chosen, f"not {attribute}": set(names) - chosen})
    found = []
    for path in sorted(TESTS.glob("*.py")):
        text = path.read_text()
        for match in _SLICED.finditer(text):
            found.append(f"{path.name}:{text[: match.start()].count(chr(10)) + 1}: {match[0]} (a slice)")
        for variable, line, strings in _literal_names(ast.parse(text, str(path))):
            methods = strings & set(names)
            whole = [f"every {family}" for family, members in censuses.items() if members <= methods]
            whole += [f"those with {key}" for key, members in selections.items() if len(members) >= 3 and members == methods]
            if (whole or len(methods) > len(names) // 2) and (path.name, variable) not in KEPT_LISTS:
                found.append(f"{path.name}:{line}: {variable or 'a literal'} names {len(methods)} methods"
                             f"{' (' + '; '.join(whole) + ')' if whole else ''}")
    assert not found, "select the methods by their class attributes instead:\n" + "\n".join(found)


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


#: A flag as the command line spells it (``--max-memory``), not a dash in text or a range.
_FLAG_TEXT = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _message_text(call: ast.Call) -> str:
    """The literal text of a ``UsageError(...)`` call's parts, each expression (an Option, a
    value) as ``{}``, and without the commands quoted in backticks (`explain evaluate --regions
    FILE` is a command to run, not an option of this one)."""
    pieces = []
    for arg in call.args:
        values = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
        for value in values:
            literal = isinstance(value, ast.Constant) and isinstance(value.value, str)
            pieces.append(value.value if literal else "{}")
    return re.sub(r"`[^`]*`", "", "".join(pieces))


def test_the_library_errors_name_options_as_data_not_as_flags():
    # Below the CLI a UsageError names each option it is about as an explain.errors.Option, so
    # that each caller words it: the CLI as a flag (str(error)), explain_dataset as its parameter.
    spelled = []
    for module, path in MODULES.items():
        if not module.startswith(("explain.batch", "explain.models")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "UsageError":
                spelled += [f"{module}:{node.lineno}: {flag}" for flag in _FLAG_TEXT.findall(_message_text(node))]
    assert not spelled, spelled
