"""Failure budget of training: infra failures never enter a group baseline, and a run that can only
fail stops with a clear error (cause, counts, what to check) instead of looping forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.envs.base import Env
from rollhub.envs.registry import register
from rollhub.rollout.types import Group, RolloutFailureError, Trajectory, TrajectoryStatus, Turn
from rollhub.sandbox.base import SandboxError
from rollhub.trainer.batch import AlgorithmConfig, batch_failed, build_training_batch
from rollhub.trainer.config import RunConfig
from rollhub.trainer.job import run_training
from rollhub.trainer.metrics import read_jsonl
from rollhub.trainer.step_metrics import batch_reward_metrics


class NeverStartsEnv(Env):
    """Every reset fails in the machinery (its container never starts)."""

    async def reset(self, *, seed=None, options=None):
        raise SandboxError("docker daemon not reachable")

    async def step(self, action: str):
        raise AssertionError("never reached: reset failed")


class AlwaysLosesEnv(Env):
    """One step, always lost, always the same reward: nothing to learn from."""

    async def reset(self, *, seed=None, options=None):
        return [{"role": "user", "content": "Try."}], {"anchor": "start", "success": False}

    async def step(self, action: str):
        return [], 0.0, True, False, {"anchor": "end", "success": False, "action_valid": True, "format_ok": True}


register("test/NeverStarts-v0", NeverStartsEnv, gymnasium_compat=False)
register("test/AlwaysLoses-v0", AlwaysLosesEnv, gymnasium_compat=False)


# --- group statistics --------------------------------------------------------------------


def _trajectory(rewards, anchors, status=TrajectoryStatus.COMPLETED, success=False) -> Trajectory:
    turns, prompt = [], [1, 2]
    for k, (reward, anchor) in enumerate(zip(rewards, anchors)):
        response = [10 + k, 20 + k]
        turns.append(Turn(list(prompt), response, [-1.0, -1.0], [0, 0], reward=reward, anchor=anchor))
        prompt = prompt + response + [3]
    return Trajectory(env_id="e", seed=0, turns=turns, status=status, success=success)


def _rows(batch) -> list[list[float]]:
    return [batch.advantages[i][batch.response_mask[i] > 0].tolist() for i in range(len(batch))]


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        # mean of the two scored totals (1, 0) is 0.5; with the failed member scored as 0 it would be 1/3
        ("grpo", [[0.5] * 4, [-0.5] * 4]),
        # episode +-0.5; anchor "s" holds returns 1 and 0 (and would hold the failed member's 0 too)
        ("gigpo", [[1.0, 1.0, 0.5, 0.5], [-1.0, -1.0, -0.5, -0.5]]),
    ],
)
def test_an_infra_failed_member_is_left_out_of_the_baseline(estimator, expected):
    failed = _trajectory([0.0], ["s"], status=TrajectoryStatus.INFRA_FAILED)
    group = Group("g", "e", 0, [_trajectory([0.0, 1.0], ["s", "t"]), failed, _trajectory([0.0, 0.0], ["s", "u"])])
    algorithm = AlgorithmConfig(estimator=estimator, gamma=1.0, omega=1.0, normalize_std=False)
    batch, stats = build_training_batch([group], 0, algorithm)
    assert stats.excluded_trajectories == 1 and stats.trajectories == 2
    assert _rows(batch) == [pytest.approx(row) for row in expected]


def test_a_lone_survivor_has_no_baseline_and_is_not_trained_on():
    group = Group("g", "e", 0, [_trajectory([1.0], ["s"]), _trajectory([0.0], ["s"], TrajectoryStatus.INFRA_FAILED)])
    batch, stats = build_training_batch([group], 0, AlgorithmConfig(estimator="grpo"))
    assert batch is None  # GRPO would otherwise give it A = R = +1 for whatever it did
    assert stats.groups_without_baseline == 1 and stats.excluded_trajectories == 2
    single = Group("s", "e", 0, [_trajectory([1.0], ["s"])])  # a configured group of one keeps A = R
    batch, stats = build_training_batch([single], 0, AlgorithmConfig(estimator="grpo"))
    assert _rows(batch) == [pytest.approx([1.0, 1.0])] and stats.groups_without_baseline == 0


def test_batch_failed_only_when_nothing_succeeded_and_nothing_can_be_learned():
    def failed(*groups: Group) -> bool:
        _, stats = build_training_batch(list(groups), 0, AlgorithmConfig(estimator="grpo"))
        return batch_failed(list(groups), stats)

    lost = Group("a", "e", 0, [_trajectory([0.0], ["s"]), _trajectory([0.0], ["s"])])
    infra = Group("b", "e", 1, [_trajectory([0.0], ["s"], TrajectoryStatus.INFRA_FAILED)] * 2)
    assert failed(lost, infra)
    assert not failed(lost, Group("c", "e", 2, [_trajectory([0.5], ["s"]), _trajectory([0.0], ["s"])]))  # signal
    solved = Group("d", "e", 3, [_trajectory([1.0], ["s"], success=True), _trajectory([1.0], ["s"], success=True)])
    assert not failed(lost, solved)  # all alike, but solved: not a failure


def test_reward_metrics_leave_infra_failures_out_and_count_model_failures():
    crashed = _trajectory([0.0], ["s"], status=TrajectoryStatus.TRUNCATED)
    crashed.info["model_failure"] = "env_error"
    group = Group(
        "g",
        "e",
        0,
        [_trajectory([1.0], ["s"], success=True), crashed, _trajectory([0.0], ["s"], TrajectoryStatus.INFRA_FAILED)],
    )
    record = batch_reward_metrics([group])
    assert record["train/success_rate"] == pytest.approx(0.5)  # 1 of the 2 scored, not 1 of 3
    assert record["train/mean_return"] == pytest.approx(0.5)
    assert record["train/infra_failed_trajectories"] == 1.0
    assert record["train/model_failure_rate"] == pytest.approx(0.5)
    assert record["train/model_failures/env_error"] == 1.0


# --- runs that can only fail stop, with a clear error -------------------------------------------


def _config(tmp_path: Path, model_dir: Path, env_id: str, **rollout) -> Path:
    data = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(model_dir), "init_tiny": None},
        "env": {"id": env_id},
        "agent": {"max_new_tokens": 4},
        "rollout": {"group_size": 2, "groups_per_batch": 2, "async_ratio": 1.0, **rollout},
        "train": {"steps": 6, "checkpoint_every": 0, "log_trajectories": False},
        "sft": {"enabled": False},
        "eval": {"episodes": 0},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _train(path: Path, timeout_s: float = 180.0) -> None:
    config = load_config(RunConfig, path)
    asyncio.run(asyncio.wait_for(run_training(config, progress=False, print_fn=lambda _: None), timeout_s))


def _train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "batch/groups" in r]


def test_async_run_with_an_env_that_never_starts_stops_with_the_infra_error(tiny_model_dir, tmp_path):
    recipe = _config(tmp_path, tiny_model_dir, "test/NeverStarts-v0")
    with pytest.raises(RolloutFailureError) as caught:
        _train(recipe)  # the trainer waits on the buffer: it must notice the producer gave up
    message = str(caught.value)
    assert "200 of the last 200 trajectories failed for infrastructure reasons" in message
    assert "docker daemon not reachable" in message and "test/NeverStarts-v0" in message
    assert _train_steps(tmp_path / "run") == []  # no batch ever arrived, and nothing was trained on


def test_lockstep_run_whose_batches_all_fail_stops_after_max_failed_batches(tiny_model_dir, tmp_path, capsys):
    recipe = _config(
        tmp_path, tiny_model_dir, "test/NeverStarts-v0", async_ratio=0.0, lockstep=True, max_failed_batches=2
    )
    assert main(["train", str(recipe), "--no-progress"]) == 2  # a UserError: one line, no traceback
    err = capsys.readouterr().err
    assert "every trajectory failed in 2 consecutive batches" in err
    assert "4 trajectories: 4 infra failures" in err and "Traceback" not in err
    assert _train_steps(tmp_path / "run") == [1]


def test_async_run_where_every_trajectory_is_lost_stops_after_max_failed_batches(tiny_model_dir, tmp_path):
    recipe = _config(tmp_path, tiny_model_dir, "test/AlwaysLoses-v0", max_failed_batches=3)
    with pytest.raises(RolloutFailureError) as caught:
        _train(recipe)
    message = str(caught.value)
    assert "every trajectory failed in 3 consecutive batches (rollout.max_failed_batches=3)" in message
    assert "4 trajectories: 0 infra failures, none succeeded" in message
    assert _train_steps(tmp_path / "run") == [1, 2]


def test_max_failed_batches_zero_trains_on(tiny_model_dir, tmp_path):
    recipe = _config(tmp_path, tiny_model_dir, "test/AlwaysLoses-v0", max_failed_batches=0)
    config = load_config(RunConfig, recipe, ["train.steps=3"])
    asyncio.run(asyncio.wait_for(run_training(config, progress=False, print_fn=lambda _: None), 180))
    assert _train_steps(tmp_path / "run") == [1, 2, 3]
