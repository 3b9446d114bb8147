"""`rollhub train` with `agent.program`: an unmodified OpenAI program is the agent, its sessions
through the gateway are the training episodes, and the run trains on them."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from rollhub.cli import main
from rollhub.rollout.trajectory_log import read_trajectories
from rollhub.trainer.metrics import read_jsonl

PROGRAM = textwrap.dedent(
    """
    import os, httpx, openai
    client = openai.OpenAI(max_retries=0, timeout=120)  # OPENAI_BASE_URL from the environment
    messages = [{"role": "user", "content": "Say one word."}]
    reply = client.chat.completions.create(model="rollhub-policy", messages=messages)
    messages += [reply.choices[0].message.model_dump(), {"role": "user", "content": "Again."}]
    again = client.chat.completions.create(model="rollhub-policy", messages=messages)
    tokens = reply.usage.completion_tokens + again.usage.completion_tokens
    url = f"{os.environ['ROLLHUB_GATEWAY_URL']}/sessions/{os.environ['ROLLHUB_SESSION_ID']}/reward"
    httpx.post(url, json={"reward": float(tokens % 3), "success": tokens % 3 == 2}).raise_for_status()
    """
)


@pytest.mark.slow  # a whole training job, ~80 s on 2 cores
def test_train_runs_an_agent_program_through_the_gateway(tiny_model_dir: Path, tmp_path: Path):
    script = tmp_path / "agent.py"
    script.write_text(PROGRAM)
    recipe = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tiny_model_dir), "init_tiny": None},
        "env": {"id": "rollhub/Sokoban-v0"},
        "agent": {"max_new_tokens": 4, "program": [sys.executable, str(script)]},
        "algorithm": {"estimator": "grpo"},
        "rollout": {"group_size": 2, "groups_per_batch": 2, "async_ratio": 1.0},
        "train": {"steps": 2, "checkpoint_every": 0},
        "sft": {"enabled": False},
        "eval": {"episodes": 0},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path), "--no-progress"]) == 0
    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "batch/groups" in r]
    assert [r["step"] for r in steps] == [1, 2]
    trajectories = list(read_trajectories(tmp_path / "run" / "trajectories.jsonl"))
    assert len(trajectories) >= 8  # two steps of two groups of two sessions
    for trajectory in trajectories:
        assert trajectory.env_id == "rollhub/Sokoban-v0" and len(trajectory.turns) == 2
        first, second = trajectory.turns
        assert all(1 <= len(turn.response_ids) <= 4 for turn in trajectory.turns)  # agent.max_new_tokens
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == (
            first.prompt_ids + first.response_ids
        )
