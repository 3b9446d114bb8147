"""Data safety: a kill at any point of a save, a non-finite step or a torn log line loses nothing.

Crashes at an exact point are made with `_CrashAt`: it counts the calls that change a folder
(rename, replace, unlink/remove, rmdir; `shutil.rmtree` goes through the last two) and raises before
the k-th one and before every later one, which is what a SIGKILL at that point leaves on disk.
The checks then run the real loaders on what is left. Random SIGKILLs of a whole run are in
test_kill_resume.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_testing import tiny_recipe

from rollhub.core.config import load_config
from rollhub.rollout.trajectory_log import TrajectoryWriter, read_trajectories
from rollhub.rollout.types import PackedSequence, Trajectory, TrajectoryStatus, Turn
from rollhub.trainer.checkpoint import (
    CHECKPOINT_DIR,
    STATE_FILE,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rollhub.trainer.config import RunConfig
from rollhub.trainer.losses import LossConfig
from rollhub.trainer.metrics import MetricsLog, read_jsonl
from rollhub.trainer.policy import Policy, TokenBatch, collate
from rollhub.trainer.update import policy_update, ppo_update

# --- crash injection ---------------------------------------------------------------------


class Crash(BaseException):
    """A simulated kill: BaseException, so no `except Exception` in the code under test can swallow it."""


class _CrashAt:
    """Raise `Crash` before the `at`-th folder-changing call and every one after it (nothing runs after a kill)."""

    MUTATIONS = ("rename", "replace", "unlink", "remove", "rmdir")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int) -> None:
        self.at, self.calls = at, 0
        for name in self.MUTATIONS:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, real):
        def call(*args, **kwargs):
            self.calls += 1
            if self.calls >= self.at:
                raise Crash(f"killed before call {self.calls}")
            return real(*args, **kwargs)

        return call


def _count_mutations(monkeypatch: pytest.MonkeyPatch, action) -> int:
    with monkeypatch.context() as patch:
        counter = _CrashAt(patch, at=10**9)
        action()
    return counter.calls


# --- a tiny policy and a hand-made batch -------------------------------------------------


@pytest.fixture
def policy(tiny_model_dir) -> Policy:
    torch.manual_seed(0)
    return Policy(tiny_model_dir, device="cpu", micro_batch_size=2)


def _batch(policy: Policy, rows: int = 4, bad: float | None = None) -> TokenBatch:
    """`rows` sequences, 6 prompt + 6 response tokens; `bad` (nan/inf) replaces one response token's advantage."""
    sequences, advantages = [], []
    for row in range(rows):
        ids = [5 + (7 * row + 3 * k) % 50 for k in range(12)]
        mask = [False] * 6 + [True] * 6
        sequences.append(
            PackedSequence(
                input_ids=ids,
                response_mask=mask,
                behaviour_logprobs=[0.0] * 12,
                token_versions=[0] * 12,
                turn_index=[0] * 12,
            )
        )
        advantages.append([(1.0 if row % 2 else -1.0) * m for m in mask])
    if bad is not None:
        advantages[1][8] = bad
    batch = collate(sequences, advantages, policy.tokenizer.pad_token_id)
    batch.behaviour_logprobs = policy.compute_logprobs(batch) * batch.response_mask  # on-policy samples
    return batch


def _optimizer_state(optimizer: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in optimizer.state[p].items()} for g in optimizer.param_groups for p in g["params"]]


def _same_state(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


# --- non-finite steps --------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_nonfinite_advantage_skips_the_step_and_says_so(policy, bad, caplog):
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    good = policy_update(policy, optimizer, _batch(policy), None, LossConfig())
    assert good["skipped_nonfinite"] == 0.0  # a finite step is taken (and fills Adam's moments)
    weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
    moments = _optimizer_state(optimizer)
    assert moments[0]  # there is optimizer state to protect

    with caplog.at_level(logging.WARNING, logger="rollhub.trainer.update"):
        out = policy_update(policy, optimizer, _batch(policy, bad=bad), None, LossConfig())

    assert out["skipped_nonfinite"] == 1.0
    assert all(torch.equal(weights[k], v) for k, v in policy.model.state_dict().items())
    assert _same_state(moments, _optimizer_state(optimizer))
    assert all(p.grad is None for p in policy.model.parameters())  # no NaN gradient is left for the next step
    assert "skipped this optimizer step" in caplog.text


def test_ppo_minibatches_skip_only_the_nonfinite_part(policy):
    """Of two mini-batches only the one holding the inf advantage is skipped; the count is reported."""
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    out = ppo_update(policy, optimizer, _batch(policy, bad=float("inf")), LossConfig(), minibatches=2, seed=1)
    assert out["skipped_nonfinite"] == 1.0
    assert out["optimizer_steps"] == 1.0
    after = policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the finite part still trained
    assert all(torch.isfinite(v).all() for v in after.values())


# --- checkpoints -------------------------------------------------------------------------


def _save(run_dir: Path, step: int, policy: Policy, optimizer, keep_last: int = 1) -> Path:
    return save_checkpoint(
        run_dir,
        step,
        model=policy.model,
        optimizer=optimizer,
        trainer_state={"version": step, "warmstart_success": None},
        rollout_state={"next_seed": 100 + step, "buffer": None},
        keep_last=keep_last,
    )


def test_checkpoints_load_with_weights_only_and_restore_every_rng(policy, tmp_path):
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    policy_update(policy, optimizer, _batch(policy), None, LossConfig())
    path = _save(tmp_path, 1, policy, optimizer)
    expected = (np.random.rand(3), torch.rand(3))
    payload = torch.load(path / STATE_FILE, weights_only=True)  # only tensors and plain values inside
    assert payload["trainer"]["version"] == 1 and payload["rollout"]["next_seed"] == 101
    load_checkpoint(path, model=policy.model, optimizer=optimizer)
    assert np.array_equal(np.random.rand(3), expected[0]) and torch.equal(torch.rand(3), expected[1])
    with pytest.raises(TypeError):  # state the safe loader could not read back fails at save time
        save_checkpoint(tmp_path, 2, model=policy.model, optimizer=None, trainer_state={"bad": object()})


@pytest.mark.parametrize("next_step", [1, 2], ids=["re-save-same-step", "rotate"])
def test_a_crash_anywhere_in_a_save_leaves_a_loadable_checkpoint(policy, tmp_path, monkeypatch, next_step):
    """keep_last=1, so only rename-then-delete keeps a checkpoint through every crash point."""
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    template = tmp_path / "template"
    _save(template, 1, policy, optimizer)
    shutil.copytree(template, tmp_path / "count")
    mutations = _count_mutations(monkeypatch, lambda: _save(tmp_path / "count", next_step, policy, optimizer))
    assert mutations >= 3
    for at in range(1, mutations + 1):
        run = tmp_path / f"crash-{at}"
        shutil.copytree(template, run)
        with monkeypatch.context() as patch:
            _CrashAt(patch, at)
            with pytest.raises(Crash):
                _save(run, next_step, policy, optimizer)
        latest = latest_checkpoint(run)
        assert latest is not None, f"no checkpoint left after a crash before mutation {at}"
        payload = load_checkpoint(latest, model=policy.model, optimizer=optimizer)
        assert payload["step"] in (1, next_step)
        # the next save clears what the crash left and rotates as usual
        _save(run, 3, policy, optimizer)
        assert sorted(p.name for p in (run / CHECKPOINT_DIR).iterdir()) == ["step-000003"]


def test_latest_checkpoint_ignores_incomplete_folders(policy, tmp_path):
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    good = _save(tmp_path, 1, policy, optimizer, keep_last=5)
    torn = shutil.copytree(good, tmp_path / CHECKPOINT_DIR / "step-000002")
    with open(torn / STATE_FILE, "r+b") as handle:  # a copy cut short
        handle.truncate(1000)
    no_state = shutil.copytree(good, tmp_path / CHECKPOINT_DIR / "step-000003")
    (no_state / STATE_FILE).unlink()
    (tmp_path / CHECKPOINT_DIR / "step-000004").mkdir()  # a delete that was interrupted
    assert list_checkpoints(tmp_path) == [good]
    assert latest_checkpoint(tmp_path) == good


def test_a_checkpoint_of_an_earlier_version_still_resumes(policy, tmp_path):
    """No manifest, numpy's RNG state as a tuple holding an array: found, and read by the safe loader."""
    folder = tmp_path / CHECKPOINT_DIR / "step-000004"
    folder.mkdir(parents=True)
    legacy_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    payload = {"step": 4, "model": policy.model.state_dict(), "optimizer": None, "trainer": {"version": 4}}
    torch.save({**payload, "rollout": {"next_seed": 9}, "rng": legacy_rng}, folder / STATE_FILE)
    expected = np.random.rand(2)
    assert latest_checkpoint(tmp_path) == folder
    assert load_checkpoint(folder, model=policy.model, optimizer=None)["trainer"]["version"] == 4
    assert np.array_equal(np.random.rand(2), expected)


def test_policy_save_is_atomic(policy, tmp_path, monkeypatch):
    """A crash at any point of re-saving a model folder leaves the old or the new folder, loadable, or none."""
    out = tmp_path / "model"
    policy.save_pretrained(out)
    policy.save_pretrained(tmp_path / "count")
    mutations = _count_mutations(monkeypatch, lambda: policy.save_pretrained(tmp_path / "count"))
    assert mutations >= 2  # published by renames, not written in place
    for at in range(1, mutations + 1):
        with monkeypatch.context() as patch:
            _CrashAt(patch, at)
            with pytest.raises(Crash):
                policy.save_pretrained(out)
        if out.exists():
            Policy(out, device="cpu")  # whole, or it would not load
    policy.save_pretrained(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["count", "model"]  # leftovers cleared


def test_policy_save_refuses_to_replace_a_folder_that_is_not_a_model(policy, tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds no model"):
        policy.save_pretrained(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


# --- logs --------------------------------------------------------------------------------


def test_a_torn_metrics_line_costs_only_itself(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "a": 1}) + "\n" + '{"step": 2, "a"')  # killed mid-write
    log = MetricsLog(tmp_path, tensorboard=False)
    log.log(2, {"a": 2})
    assert read_jsonl(path) == [{"step": 1, "a": 1}, {"step": 2, "a": 2}]


def _trajectory(seed: int) -> Trajectory:
    turn = Turn(prompt_ids=[1, 2], response_ids=[3], behaviour_logprobs=[-0.5], token_versions=[0])
    return Trajectory(env_id="e", seed=seed, turns=[turn], status=TrajectoryStatus.COMPLETED, trajectory_id=str(seed))


def test_a_torn_trajectory_line_costs_only_itself(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(_trajectory(1))
    with open(path, "a") as handle:
        handle.write('{"env_id": "e", "seed": 2, "tur')  # killed mid-write
    with TrajectoryWriter(path) as writer:
        writer.write(_trajectory(3))
    assert [t.seed for t in read_trajectories(path)] == [1, 3]


# --- the training job --------------------------------------------------------------------


def _config(tmp_path: Path, model_dir: Path, **sections) -> RunConfig:
    """The shared tiny recipe, lockstep (sync) with one evaluation seed; `sections` update it."""
    base = {
        "rollout": {"group_size": 2, "groups_per_batch": 2, "async_ratio": 0.0, "lockstep": True},
        "train": {"steps": 2, "checkpoint_every": 1, "keep_checkpoints": 5},
        "eval": {"episodes": 1},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return load_config(RunConfig, tiny_recipe(tmp_path, model_dir, **base))


def _train(config: RunConfig, *, resume: bool):
    from rollhub.trainer.job import run_training

    return asyncio.run(run_training(config, resume=resume, progress=False, print_fn=lambda _: None))


def _groups(run: Path) -> dict[str, set[int]]:
    """group_id -> seeds of its lines in trajectories.jsonl."""
    groups: dict[str, set[int]] = {}
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        record = json.loads(line)
        groups.setdefault(record["group_id"], set()).add(record["seed"])
    return groups


def _assert_each_task_logged_once(run: Path, config: RunConfig, steps: int) -> None:
    groups = _groups(run)
    seeds = [seed for group in groups.values() for seed in group]
    assert all(len(group) == 1 for group in groups.values())
    first = config.train_seed_start
    assert sorted(seeds) == list(range(first, first + steps * config.rollout.groups_per_batch))


def test_resume_cuts_the_trajectory_log_back_to_the_checkpoint(tiny_model_dir, tmp_path):
    config = _config(tmp_path, tiny_model_dir)
    run = Path(config.run_dir)
    _train(config, resume=False)
    _assert_each_task_logged_once(run, config, steps=2)
    # the state of a kill after step 2 was logged but before its checkpoint was written
    shutil.rmtree(latest_checkpoint(run))
    _train(config, resume=True)
    _assert_each_task_logged_once(run, config, steps=2)
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r] == [1, 2]
    # no complete checkpoint at all: the run starts over, and so does its trajectory log
    shutil.rmtree(run / CHECKPOINT_DIR)
    _train(config, resume=True)
    _assert_each_task_logged_once(run, config, steps=2)


def test_a_half_written_sft_model_is_removed_and_sft_redone(tiny_model_dir, tmp_path):
    config = _config(
        tmp_path, tiny_model_dir, sft={"enabled": True, "episodes": 2, "batch_size": 4}, train={"steps": 1}
    )
    run = Path(config.run_dir)
    # what an in-place save killed halfway leaves: config.json written, weights cut short,
    # and the SFT log of the interrupted attempt
    shutil.copytree(tiny_model_dir, run / "sft_model")
    with open(run / "sft_model" / "model.safetensors", "r+b") as handle:
        handle.truncate(handle.seek(0, os.SEEK_END) // 2)
    (run / "sft_metrics.jsonl").write_text(json.dumps({"step": 1, "sft/loss": 9.0}) + "\n")

    _train(config, resume=True)

    assert (run / "sft_done.json").is_file()
    Policy(run / "sft_model", device="cpu")  # a whole model now
    steps = [r["step"] for r in read_jsonl(run / "sft_metrics.jsonl")]
    assert steps and len(steps) == len(set(steps))  # one attempt's lines, none twice
    assert 9.0 not in [r["sft/loss"] for r in read_jsonl(run / "sft_metrics.jsonl")]
