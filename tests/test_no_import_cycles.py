"""No two modules of rollhub import each other, directly or around a circle, at module level or
inside a function: a cycle is a layering bug that an import inside a function only hides."""

from __future__ import annotations

import ast
from pathlib import Path

import rollhub

ROOT = Path(rollhub.__file__).resolve().parent


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The rollhub modules `path` imports anywhere in its text, resolved to files that exist:
    `from rollhub.a import b` names rollhub.a.b when that is a module, else rollhub.a."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("rollhub"):
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            found |= submodules or ({node.module} & known)
            if submodules and len(submodules) < len(node.names):
                found |= {node.module} & known
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("rollhub")} & known
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = {_module_name(path, root): path for path in root.rglob("*.py")}
    known = set(files)
    return {name: _imported_modules(path, known) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _is_package_init_edge(importer: str, imported: str) -> bool:
    """A module importing its own package's `__init__` (e.g. `from rollhub.envs import Env` in
    rollhub.envs.sokoban.env) is how a package exposes its names; the __init__ imports the
    contract modules, never the module that uses them, so that pair alone is not a cycle."""
    return importer.startswith(imported + ".")


def test_rollhub_has_no_import_cycles():
    graph = {name: {m for m in deps if not _is_package_init_edge(name, m)} for name, deps in import_graph().items()}
    found = cycles(graph)
    assert not found, "import cycles (module level or inside functions):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_the_cycle_finder_sees_a_circle_through_a_function_body(tmp_path):
    package = tmp_path / "rollhub"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from rollhub.b import g\n")
    (package / "b.py").write_text("def g():\n    from rollhub.c import h\n")
    (package / "c.py").write_text("import rollhub.a\n")
    (package / "d.py").write_text("from rollhub import a\n")
    graph = import_graph(package)
    assert graph["rollhub.d"] == {"rollhub.a"}
    assert cycles(graph) == [["rollhub.a", "rollhub.b", "rollhub.c"]]
