"""No import cycles in our packages (deployments, edge_sim, edgectl, benchmarks): none between the
packages, none between deployments' packages and top-level modules (the layout's promise that
dependencies point one way) nor any package's subpackages, and none between any two modules.
Static: every import is read with `ast`, those inside functions and under TYPE_CHECKING too (an
import made lazy to dodge a cycle is still a dependency)."""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "deployments"
PACKAGES = (PACKAGE, "edge_sim", "edgectl", "benchmarks")

# importer -> imported -> where (path:line of the first such import)
Graph = dict[str, dict[str, str]]


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the packages under `root`, by dotted name (a package by its own name)."""
    names = {}
    for path in sorted(path for package in PACKAGES for path in (root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imported_names(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(dotted name, line) of every import in the file; relative ones resolved, and
    `from a import b` as a.b (b is a module, or a name in module a)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                yield f"{source}.{alias.name}", node.lineno


def import_graph(root: Path, node_of: Callable[[str], str | None]) -> Graph:
    """The imports between the package's modules, each module mapped to its node by `node_of`
    (None: left out)."""
    modules = module_names(root)
    graph: Graph = {}
    for module, path in modules.items():
        source = node_of(module)
        if source is None:
            continue
        for name, line in imported_names(module, path):
            while name and name not in modules:  # a.b.SomeClass -> the module a.b
                name = name.rpartition(".")[0]
            if not name or module.startswith(name + "."):
                continue  # a module's own packages are imported before it anyway
            target = node_of(name)
            if target is not None and target != source:
                where = f"{path.relative_to(root)}:{line}"
                graph.setdefault(source, {}).setdefault(target, where)
    return graph


def top_level(module: str) -> str | None:
    """deployments.ingress.serving -> ingress; deployments.config -> config; deployments and
    the other packages' modules -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == PACKAGE else None


def subpackage(module: str) -> str | None:
    """edgectl.plan.cli -> edgectl.plan; edgectl.local_cluster -> itself; edgectl -> None."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def package(module: str) -> str:
    """edgectl.plan.cli -> edgectl."""
    return module.split(".")[0]


def cycles(graph: Mapping[str, Mapping[str, str]]) -> list[str]:
    """One cycle per strongly connected group of nodes, as 'a -> b -> a' with where each
    import is."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(graph, group) for group in groups]


def _one_cycle(graph: Mapping[str, Mapping[str, str]], group: set[str]) -> str:
    """The shortest way from the group's first node back to itself, inside the group."""
    start = min(group)
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph.get(node, {})):
            if target not in group or target in previous:
                continue
            previous[target] = node
            if target == start:
                queue.clear()
                break
            queue.append(target)
    path = [start]
    while len(path) == 1 or path[-1] != start:
        path.append(previous[path[-1]])
    path.reverse()
    steps = [f"{a} -> {b} ({graph[a][b]})" for a, b in zip(path, path[1:], strict=False)]
    return " -> ".join(path) + ": " + "; ".join(steps)


def test_no_import_cycle_between_the_packages_of_deployments():
    found = cycles(import_graph(REPO, top_level))
    assert not found, "import cycles between deployments' packages:\n" + "\n".join(found)


def test_no_import_cycle_between_our_packages():
    found = cycles(import_graph(REPO, package))
    assert not found, "import cycles between packages:\n" + "\n".join(found)


def test_no_import_cycle_between_the_subpackages_of_every_package():
    found = cycles(import_graph(REPO, subpackage))
    assert not found, "import cycles between subpackages:\n" + "\n".join(found)


def test_no_import_cycle_between_modules_of_every_package():
    found = cycles(import_graph(REPO, lambda module: module))
    assert not found, "import cycles between modules:\n" + "\n".join(found)


def test_every_package_is_scanned():
    scanned = {module.split(".")[0] for module in module_names(REPO)}
    assert scanned == set(PACKAGES)


def test_a_cycle_outside_deployments_is_found(tmp_path: Path):
    files = {
        "edgectl/__init__.py": "",
        "edgectl/local_cluster.py": "if TYPE_CHECKING:\n    from edgectl.local_services import R\n",
        "edgectl/local_services.py": "from edgectl.local_cluster import free_port\n",
        "benchmarks/suite.py": "from edgectl import local_cluster\n",  # depends on it; no cycle
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cycles(import_graph(tmp_path, lambda module: module)) == [
        "edgectl.local_cluster -> edgectl.local_services -> edgectl.local_cluster: "
        "edgectl.local_cluster -> edgectl.local_services (edgectl/local_cluster.py:2); "
        "edgectl.local_services -> edgectl.local_cluster (edgectl/local_services.py:1)"
    ]
    assert cycles(import_graph(tmp_path, subpackage)) == cycles(
        import_graph(tmp_path, lambda module: module)
    )
    assert cycles(import_graph(tmp_path, package)) == []  # one package: no cycle between them


def test_a_cycle_is_found_and_reported_with_where_each_import_is(tmp_path: Path):
    files = {
        "__init__.py": "",
        "config.py": "from deployments.observability import metrics\n",
        "observability/__init__.py": "",
        "observability/metrics.py": "import json\n",
        "observability/grafana.py": "def f():\n    from ..config import X\n",  # lazy, relative
        "api/__init__.py": "from deployments import config\n",  # depends on it; no cycle
    }
    for name, text in files.items():
        (tmp_path / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / name).write_text(text)
    graph = import_graph(tmp_path, top_level)
    assert graph == {
        "config": {"observability": "deployments/config.py:1"},
        "observability": {"config": "deployments/observability/grafana.py:2"},
        "api": {"config": "deployments/api/__init__.py:1"},
    }
    assert cycles(graph) == [
        "config -> observability -> config: "
        "config -> observability (deployments/config.py:1); "
        "observability -> config (deployments/observability/grafana.py:2)"
    ]
    assert cycles(import_graph(tmp_path, lambda module: module)) == []  # not between modules
