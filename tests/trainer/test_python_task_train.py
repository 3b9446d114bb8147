"""`rollhub train` on a task given as plain Python: a JSONL of prompts and a reward (or step) function."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from trainer_testing import tiny_recipe

from rollhub.cli import main
from rollhub.trainer.metrics import read_jsonl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python_task"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_on_a_jsonl_and_a_reward_function(tiny_model_dir, tmp_path, capsys):
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        env={"id": f"python:{EXAMPLES / 'task.py'}:reward", "kwargs": {"dataset": "prompts.jsonl"}},
        agent={"system_prompt": "Answer with a number.", "history_window": 1, "max_new_tokens": 4},
        algorithm={"estimator": "grpo"},
        sft={"enabled": True, "episodes": 4, "batch_size": 4},  # imitates each row's "solution"
        eval={"episodes": 2, "env": {"kwargs": {"dataset": "held_out.jsonl"}}},
    )
    assert main(["train", str(recipe), "--no-progress"]) == 0
    assert "final success" in capsys.readouterr().out
    run = tmp_path / "run"
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r] == [1, 2]
    # every trained reply was scored by the file's own function on its own row
    reward = _example("task").reward
    rows = [json.loads(line) for line in (EXAMPLES / "prompts.jsonl").read_text().splitlines()]
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert trajectories
    for trajectory in trajectories:
        (turn,) = trajectory["turns"]
        expected = reward(turn["response_text"], rows[trajectory["seed"] % len(rows)])
        assert turn["reward"] == (0.0 if expected is None else expected)
        assert turn["action_valid"] is (expected is not None)


def test_train_on_a_multi_turn_step_function(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        env={
            "id": f"python:{EXAMPLES / 'guess.py'}:step",
            "kwargs": {"dataset": "guess_prompts.jsonl", "max_steps": 2},
        },
        train={"steps": 1, "checkpoint_every": 0},
        eval={"episodes": 2, "env": {"kwargs": {"dataset": "guess_held_out.jsonl"}}},
    )
    assert main(["train", str(recipe), "--no-progress"]) == 0
    run = tmp_path / "run"
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r] == [1]
    step = _example("guess").step
    rows = [json.loads(line) for line in (EXAMPLES / "guess_prompts.jsonl").read_text().splitlines()]
    for trajectory in read_jsonl(run / "trajectories.jsonl"):
        row, history = rows[trajectory["seed"] % len(rows)], []
        assert 1 <= len(trajectory["turns"]) <= 2
        for turn in trajectory["turns"]:
            history.append({"role": "assistant", "content": turn["response_text"]})
            feedback, expected, done = step(history, row)
            assert turn["reward"] == (0.0 if expected is None else expected)
            history.append({"role": "user", "content": feedback or f"Reward: {expected:g}."})
