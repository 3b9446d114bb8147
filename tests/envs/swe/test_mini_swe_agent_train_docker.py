"""`rollhub train` with mini-swe-agent as `agent.program` on SWE tasks and SmolLM2-135M-Instruct:
episodes run end to end (model -> gateway -> litellm -> DefaultAgent -> the task's container ->
SWE grading -> reward), none infra-failed, no container left, and one GRPO step taken on them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("swebench")
pytest.importorskip("minisweagent")

from rollhub.cli import main  # noqa: E402
from rollhub.rollout.trajectory_log import read_trajectories  # noqa: E402
from rollhub.rollout.types import TrajectoryStatus  # noqa: E402
from rollhub.trainer.metrics import read_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "examples" / "mini_swe_agent" / "recipe.yaml"
SMOLLM2 = REPO / "runs" / "models" / "smollm2-135m-instruct"

pytestmark = [pytest.mark.docker, pytest.mark.slow]  # ~11 min on 2 busy cores: 4 episodes and one step


def containers_of(sessions: set[str]) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        return [
            c.name
            for session in sessions
            for c in client.containers.list(all=True, filters={"label": f"rollhub.gateway.session={session[:60]}"})
        ]
    finally:
        client.close()


def test_train_step_on_mini_swe_agent_episodes_with_smollm2(tasks, tmp_path: Path, monkeypatch):
    if not (SMOLLM2 / "config.json").is_file():
        pytest.skip(f"SmolLM2 is not exported at {SMOLLM2} (rollhub model smollm2)")
    monkeypatch.chdir(REPO)  # the recipe's program path is relative to the repository
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["run_dir"] = str(tmp_path / "run")
    recipe["model"]["path"] = str(SMOLLM2)
    program = recipe["agent"]["program"]
    recipe["agent"]["program"] = [sys.executable, *program[1:], "--result", str(tmp_path / "episodes.jsonl")]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))

    assert main(["train", str(path), "--no-progress"]) == 0

    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "batch/groups" in r]
    assert [r["step"] for r in steps] == [1]
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) >= 4  # two groups of two sessions
    assert all(e["outcome"] != "infra_failure" for e in episodes), episodes
    assert all(e["commands_run"] >= 0 and e["reward"] in (0.0, 1.0) for e in episodes)
    trajectories = list(read_trajectories(tmp_path / "run" / "trajectories.jsonl"))
    assert trajectories and all(t.status is not TrajectoryStatus.INFRA_FAILED for t in trajectories)
    assert all(t.env_id == "rollhub/SWE-v0" and t.num_response_tokens > 0 for t in trajectories)
    sessions = {t.info["session_id"] for t in trajectories}
    assert len(sessions) >= 4
    assert not containers_of(sessions)
