"""`rollhub train` runs two steps of the tiny model on one env of each source (real packages)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from rollhub.cli import main
from rollhub.trainer.metrics import read_jsonl

pytestmark = pytest.mark.slow


def _recipe(tmp_path: Path, model_dir: Path, env_id: str, kwargs: dict | None = None) -> Path:
    data = {
        "run_dir": str(tmp_path / "run"),
        "seed": 3,
        "model": {"path": str(model_dir), "init_tiny": None},
        "env": {"id": env_id, "kwargs": kwargs or {}},
        "agent": {"system_prompt": "", "history_window": 1, "max_new_tokens": 6},
        "rollout": {"group_size": 2, "groups_per_batch": 2, "async_ratio": 1.0},
        "optim": {"lr": 1e-3, "micro_batch_size": 32},
        "train": {"steps": 2, "checkpoint_every": 1},
        "sft": {"enabled": False},
        "eval": {"episodes": 2},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _two_steps(tmp_path: Path, model_dir: Path, env_id: str, kwargs: dict | None = None) -> None:
    assert main(["train", str(_recipe(tmp_path, model_dir, env_id, kwargs)), "--no-progress"]) == 0
    steps = [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/loss" in r]
    assert len(steps) == 2


def test_train_on_gem(tiny_model_dir, tmp_path):
    pytest.importorskip("gem")
    _two_steps(tmp_path, tiny_model_dir, "gem:game:Sokoban-v0-easy", {"max_turns": 3, "max_steps": 3})


def test_train_on_verifiers(tiny_model_dir, tmp_path):
    pytest.importorskip("verifiers")
    _two_steps(tmp_path, tiny_model_dir, "verifiers:rollhub.envs.adapters.samples_verifiers", {"max_turns": 3})


def test_train_on_openenv_server(tiny_model_dir, tmp_path):
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("openenv.core")
    from rollhub.envs.adapters.samples_openenv import app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app(), host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        _two_steps(tmp_path, tiny_model_dir, f"openenv:ws://127.0.0.1:{port}", {"max_steps": 3})
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.docker
def test_train_on_harbor_task(tiny_model_dir, tmp_path):
    from rollhub.envs.checker import docker_available

    if not docker_available():
        pytest.skip("needs a Docker engine")
    task = Path(__file__).resolve().parents[3] / "docs" / "env_cards" / "harbor_sample" / "fix-add"
    _two_steps(tmp_path, tiny_model_dir, f"harbor:{task}", {"max_steps": 2})
