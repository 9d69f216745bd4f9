"""The shape of ``api/``: no import cycle between files, no private name crossing files, small modules.

These are the house rules of ``docs/design.md`` ("Layout"); the layer contracts themselves are
import-linter's (``make lint``), which checks packages, not files. The no-cycle rule also holds for the
code around the app: ``bench/``, ``tools/``, ``harness/`` and the Python client (``sdk/python``).
"""

from __future__ import annotations

import ast
import pathlib

import grimp

from harness.processes import ROOT

API = ROOT / "api"
#: The packages whose files import one another without a cycle, within and across them (the Python
#: client, ``sdk/python/src/durable_workflow_client``, is installed by ``make install``).
ACYCLIC_PACKAGES = ("api", "bench", "tools", "harness", "durable_workflow_client")
MAX_MODULE_LINES = 500


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative so a deep package cannot hit the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            if successors:
                successor = successors.pop()
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, sorted(graph[successor])))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_strongly_connected_finds_a_cycle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycle_between_files() -> None:
    imports = grimp.build_graph(*ACYCLIC_PACKAGES)
    modules = set(imports.modules)
    graph = {module: set(imports.find_modules_directly_imported_by(module)) & modules for module in modules}
    assert _strongly_connected(graph) == []


def _private_imports(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("api")):
            source = "." * node.level + (node.module or "")
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} from {source}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def test_no_private_name_is_imported_from_another_file() -> None:
    offences = [offence for path in sorted(API.rglob("*.py")) for offence in _private_imports(path)]
    assert offences == []


def test_no_module_is_over_the_size_limit() -> None:
    sizes = {path: len(path.read_text().splitlines()) for path in API.rglob("*.py")}
    too_large = sorted(
        f"{path.relative_to(ROOT)}: {lines}" for path, lines in sizes.items() if lines > MAX_MODULE_LINES
    )
    assert too_large == [], f"split these by job (limit {MAX_MODULE_LINES} lines)"


#: The app's layers, highest first (pyproject.toml's import-linter contract says the same): a module
#: may import its own layer's package or a lower layer, never a higher one, lazily or not.
LAYERS = (
    ("api.controllers", "api.tasks"),
    ("api.services",),
    ("api.extensions",),
    ("api.core",),
    ("api.models",),
    ("api.libs",),
)


def _layer_of(module: str) -> tuple[int, str] | None:
    for rank, packages in enumerate(LAYERS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return rank, package
    return None


def test_no_import_runs_up_a_layer() -> None:
    imports = grimp.build_graph("api")
    upward = []
    for module in sorted(imports.modules):
        layer = _layer_of(module)
        if layer is None:
            continue
        for imported in sorted(imports.find_modules_directly_imported_by(module)):
            target = _layer_of(imported)
            if target is None:
                continue
            if target[0] < layer[0] or (target[0] == layer[0] and target[1] != layer[1]):
                upward.append(f"{module} imports {imported}")
    assert upward == [], "imports that run up a layer (or across controllers/tasks)"
