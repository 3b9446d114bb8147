"""Registry: versioned ids, make with kwargs, clear errors, lazy imports of entry points."""

import logging
import sys

import pytest

import rollhub.envs as envs
from rollhub.core.errors import MissingExtraError, UserError
from rollhub.envs.registry import _REGISTRY, register


@pytest.fixture
def cleanup():
    added = []
    yield added
    for env_id in added:
        _REGISTRY.pop(env_id, None)


def test_ids_must_be_versioned(cleanup):
    with pytest.raises(ValueError, match="Name-vN"):
        register("Sokoban", "x:y")
    with pytest.raises(ValueError, match="Name-vN"):
        register("rollhub/Sokoban-v", "x:y")
    cleanup.append(register("test/Ok-v12", "x:y", gymnasium_compat=False).id)


def test_make_merges_registered_and_call_kwargs():
    env = envs.make("rollhub/Sokoban-v0", max_steps=7)
    assert env.max_steps == 7 and env.dim == (6, 6) and env.spec.id == "rollhub/Sokoban-v0"


def test_make_errors_are_user_errors():
    with pytest.raises(UserError, match="did you mean rollhub/Sokoban-v0"):
        envs.make("rollhub/Sokoban-v9")
    with pytest.raises(UserError, match="bad arguments"):
        envs.make("rollhub/Math-v0", colour="red")


def test_missing_extra_is_reported_with_the_install_command(cleanup):
    cleanup.append(register("test/Extra-v0", "no_such_swe_module:Env", extra="swe", gymnasium_compat=False).id)
    with pytest.raises(MissingExtraError, match=r"pip install -e '\.\[swe\]'"):
        envs.make("test/Extra-v0")


def test_reregistering_replaces_with_a_warning(cleanup, caplog):
    cleanup.append(register("test/Twice-v0", "a:b", gymnasium_compat=False).id)
    with caplog.at_level(logging.WARNING):
        register("test/Twice-v0", "rollhub.envs.sokoban.env:SokobanEnv", gymnasium_compat=False)
    assert "registered again" in caplog.text
    assert envs.spec("test/Twice-v0").entry_point.endswith("SokobanEnv")


def test_listing_does_not_import_env_modules():
    import subprocess

    code = (
        "import sys, rollhub.envs as e; e.all_specs(); "
        "print(any(m.startswith('rollhub.envs.sokoban') or m.startswith('rollhub.envs.math') for m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
