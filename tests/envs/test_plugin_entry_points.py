"""A real third-party package, really installed, adds an env through the `rollhub.envs`
entry-point group; the `rollhub` CLI in a fresh process lists and plays it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN_SOURCE = Path(__file__).resolve().parents[1] / "plugin_pkg"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    build_dir = tmp_path_factory.mktemp("plugin_src")
    source = build_dir / "src"
    shutil.copytree(PLUGIN_SOURCE, source)  # builds write into the source tree; keep the repo clean
    target = build_dir / "site"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    assert list(target.glob("rollhub_echo_plugin-*.dist-info")), "pip did not install the plugin's metadata"
    return target


def run_rollhub(plugin_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "rollhub.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_installed_plugin_env_is_listed(plugin_path):
    result = run_rollhub(plugin_path, "envs", "list")
    assert result.returncode == 0, result.stderr
    line = next(row for row in result.stdout.splitlines() if row.startswith("plugin/Echo-v0"))
    assert "repeat a word" in line
    assert "rollhub/Sokoban-v0" in result.stdout


def test_installed_plugin_env_plays(plugin_path):
    result = run_rollhub(plugin_path, "envs", "try", "plugin/Echo-v0", "--agent", "expert", "--seed", "4", "--json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome == {"env": "plugin/Echo-v0", "seed": 4, "steps": 1, "return": 1.0, "success": True}


def test_without_the_plugin_the_id_is_unknown():
    result = subprocess.run(
        [sys.executable, "-m", "rollhub.cli", "envs", "try", "plugin/Echo-v0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "unknown env id 'plugin/Echo-v0'" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_plugin_env_passes_check_env(plugin_path):
    code = "import asyncio; from rollhub.envs.checker import check_env; print(asyncio.run(check_env('plugin/Echo-v0')))"
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
