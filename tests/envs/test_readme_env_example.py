"""The README's "register your own env" example runs and passes check_env as written."""

import re
import sys
import types
from pathlib import Path

from rollhub.envs.checker import check_env
from rollhub.envs.registry import _REGISTRY

README = Path(__file__).resolve().parents[2] / "README.md"


async def test_readme_example_registers_a_working_env(monkeypatch):
    match = re.search(r"# my_envs/__init__.py\n(.*?)```", README.read_text(), re.DOTALL)
    assert match, "README lost its 'register your own env' example"
    module = types.ModuleType("my_envs")
    monkeypatch.setitem(sys.modules, "my_envs", module)
    exec(compile(match.group(1), "README.md", "exec"), module.__dict__)
    module.register_envs()
    try:
        await check_env("mine/Coin-v0")
    finally:
        _REGISTRY.pop("mine/Coin-v0", None)
