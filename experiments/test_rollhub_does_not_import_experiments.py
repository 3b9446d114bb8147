"""The product never depends on the lab: no module of `rollhub` imports `experiments`, at module
level or inside a function, so deleting this folder leaves `rollhub` whole."""

import ast
from pathlib import Path

import rollhub

ROOT = Path(rollhub.__file__).resolve().parent


def _imports_experiments(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "experiments":
            return True
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "experiments" for alias in node.names):
            return True
    return False


def test_no_rollhub_module_imports_experiments():
    offenders = [str(path.relative_to(ROOT.parent)) for path in ROOT.rglob("*.py") if _imports_experiments(path)]
    assert offenders == []
