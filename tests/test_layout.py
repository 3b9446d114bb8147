"""The layering of the layout table (docs/layout.md) holds: each package imports only from the layers below it,
and each module's file is at the path its import name says."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import rollhub

ROOT = Path(rollhub.__file__).resolve().parent

#: package -> the rollhub packages it may import (besides itself); bench and cli may import all
ALLOWED = {
    "core": set(),
    "sandbox": {"core"},
    "envs": {"sandbox", "core"},
    "inference": {"core"},
    "rollout": {"inference", "envs", "sandbox", "core"},
    "trainer": {"rollout", "inference", "envs", "core"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rollhub_imports(path: Path) -> set[str]:
    """Every `rollhub.*` module named by an import statement anywhere in the file (function bodies too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "rollhub" or name.startswith("rollhub.")}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_from_the_layers_below(package):
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _rollhub_imports(path):
            target = name.split(".")[1] if "." in name else "rollhub"
            if target != package and target not in ALLOWED[package]:
                violations.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    assert not violations, (
        f"rollhub.{package} may import only {sorted(ALLOWED[package]) or 'nothing else'}:\n" + "\n".join(violations)
    )


def test_the_checker_catches_an_upward_import(tmp_path):
    offending = tmp_path / "bad.py"
    offending.write_text("def f():\n    from rollhub.bench.sim.latency_model import LatencyModelEngine\n")
    assert _rollhub_imports(offending) == {"rollhub.bench.sim.latency_model"}


def test_importing_the_product_packages_loads_no_benchmark_code():
    code = (
        "import sys, rollhub.envs, rollhub.sandbox, rollhub.rollout.manager, "
        "rollhub.trainer.job, rollhub.trainer.build\n"
        "print(sorted(m for m in sys.modules if m.startswith('rollhub.bench')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.strip() == "[]"


def test_every_module_lives_at_the_path_its_name_says():
    mismatched = []
    for path in sorted(ROOT.rglob("*.py")):
        name = _module_name(path)
        try:
            spec = importlib.util.find_spec(name)
        except ImportError as exc:  # a parent package needs an optional extra
            pytest.skip(f"{name}: {exc}")
        if spec is None or Path(spec.origin).resolve() != path:
            mismatched.append(f"{name} -> {spec.origin if spec else None} (expected {path})")
    assert not mismatched, "\n".join(mismatched)


def test_benchmark_envs_register_from_bench_and_are_marked():
    from rollhub.envs.registry import all_specs

    bench_specs = [spec for spec in all_specs() if spec.id.startswith("bench/")]
    assert bench_specs, "the rollhub-bench entry point registered nothing"
    for spec in bench_specs:
        assert spec.description.startswith("[benchmark simulation]")
        assert str(spec.entry_point).startswith("rollhub.bench.")
    builtin = (ROOT / "envs" / "builtin.py").read_text()
    assert "bench/" not in builtin and "rollhub.bench" not in builtin
