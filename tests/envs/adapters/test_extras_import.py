"""An adapter's package that is missing or installed but broken is one line naming the extra; the
openenv and verifiers extras pin one MCP so they install together."""

import re
import sys
import tomllib
from pathlib import Path

import pytest

from rollhub.cli import main
from rollhub.core.errors import MissingExtraError, UserError
from rollhub.envs.adapters.common import require

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def _package(root: Path, name: str, body: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)


@pytest.mark.parametrize(
    "body,fragment",
    [
        ("from rollhub_no_such_dependency import thing\n", "No module named 'rollhub_no_such_dependency'"),
        ("raise ImportError(\"cannot import name 'Tool' from 'mcp'\\nsecond line\")\n", "cannot import name 'Tool'"),
    ],
)
def test_broken_package_is_one_line_with_the_reinstall(tmp_path, monkeypatch, body, fragment):
    _package(tmp_path, "rollhub_broken_pkg", body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as caught:
        require("rollhub_broken_pkg", "openenv", "env openenv:x")
    message = str(caught.value)
    assert "\n" not in message and fragment in message
    assert (
        "'rollhub_broken_pkg' is installed but does not import" in message and "pip install -e '.[openenv]'" in message
    )


def test_missing_package_names_its_extra():
    with pytest.raises(MissingExtraError, match=re.escape("pip install -e '.[gem]'")):
        require("rollhub_absent_pkg", "gem", "env gem:x")


def test_broken_openenv_through_envs_try_is_one_line(tmp_path, monkeypatch, capsys):
    """What a user sees when another install moved openenv's dependencies away under it."""
    _package(tmp_path, "openenv", "raise ImportError(\"cannot import name 'FastMCP' from 'fastmcp'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "openenv" or m.startswith(("openenv.", "rollhub.envs.adapters.sa"))]:
        monkeypatch.delitem(sys.modules, name)
    code = main(["envs", "try", "openenv:rollhub.envs.adapters.samples_openenv:CountdownEnvironment"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "'openenv' is installed but does not import" in err and "FastMCP" in err


def test_openenv_and_verifiers_extras_pin_the_same_mcp():
    """verifiers 0.2.1 needs mcp<2; fastmcp 4 needs mcp>=2: both extras pin fastmcp 3 / mcp 1, so
    installing one after the other never moves a package the first one needs."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert "mcp>=1.24,<2" in extras["openenv"] and "mcp>=1.24,<2" in extras["verifiers"]
    assert "fastmcp>=3.0,<4" in extras["openenv"]
