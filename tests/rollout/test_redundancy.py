"""Redundancy from the recipe (rollout.redundant_groups / redundant_trajectories / env_concurrency),
and carry mode: late groups are kept for the next batch instead of discarded, so slow (hard)
tasks are trained on as often as they occur."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rollout_testing import CountdownEnv, sections

from rollhub.core.errors import UserError
from rollhub.rollout.agent import AgentConfig
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.manager import EnvManager
from rollhub.trainer.build import build_buffer, build_rollout
from rollhub.trainer.config import RunConfig
from rollhub.trainer.step_metrics import rollout_metrics


class HardSeedsCountdown(CountdownEnv):
    """Countdown whose seeds divisible by 4 are 'hard': every step takes 15x longer."""

    async def reset(self, *, seed=None, options=None):
        self.step_sleep_s = 0.15 if (seed or 0) % 4 == 0 else 0.01
        return await super().reset(seed=seed, options=options)


def hard_factory(env_id, **kwargs):
    return HardSeedsCountdown(max_steps=2)


def test_recipe_knobs_reach_manager_and_buffer(engine, tmp_path: Path):
    config = RunConfig(run_dir=str(tmp_path))
    config.env.id = "test/Countdown-v0"
    config.rollout.redundant_groups = 2
    config.rollout.redundant_trajectories = 1
    config.rollout.env_concurrency = {"test/Countdown-v0": 3}
    config.rollout.staleness_rule = "newest"
    config.train.log_trajectories = False
    buffer = build_buffer(config)
    manager = build_rollout(
        config, engine, engine.tokenizer, model_dir=tmp_path, buffer=buffer, seeds=iter(range(100)), run_dir=tmp_path
    )
    assert isinstance(manager, EnvManager)
    assert manager.rollout is config.rollout and manager.env is config.env and manager.agent is config.agent
    assert manager.rollout.redundant_groups == 2 and manager.rollout.redundant_trajectories == 1
    assert set(manager._env_limits) == {"test/Countdown-v0"}
    assert manager.redundancy_mode == "carry"  # the unbiased mode is the default
    assert buffer.capacity == 2 * 4 + 2 and buffer.staleness_rule == "newest"  # (alpha+1)*B + g
    config.rollout.env_concurrency = {"test/Countdwn-v0": 3}
    with pytest.raises(UserError, match="env_concurrency names test/Countdwn-v0"):
        build_rollout(
            config, engine, engine.tokenizer, model_dir=tmp_path, buffer=None, seeds=iter(range(9)), run_dir=tmp_path
        )


@pytest.mark.parametrize("mode", ["cancel", "carry"])
async def test_carry_mode_trains_every_started_task(engine, mode):
    """5 batches of 2 groups with 2 redundant groups; seeds 0, 4, 8 ... are 15x slower.
    cancel: the slow seeds lose the race and are cancelled, so none is trained.
    carry: they run on and are trained a batch later; nothing is cancelled."""
    config = sections("test/Countdown-v0", group_size=2, redundant_groups=2, agent=AgentConfig(max_new_tokens=3))
    drawn: list[int] = []

    def seeds():
        for seed in range(1000):
            drawn.append(seed)
            yield seed

    manager = EnvManager(
        engine, engine.tokenizer, **config, redundancy_mode=mode, env_factory=hard_factory, seeds=seeds()
    )
    trained: list[int] = []
    for _ in range(5):
        groups = await asyncio.wait_for(manager.collect_batch(2), timeout=60)
        assert len(groups) == 2 and all(len(g.trajectories) == 2 for g in groups)
        trained += [g.seed for g in groups]
    hard = [s for s in trained if s % 4 == 0]
    if mode == "cancel":
        assert hard == [] and manager.metrics.groups_redundant_cancelled >= 5
    else:
        assert hard, "a slow task started in carry mode must be trained on"
        assert manager.metrics.groups_redundant_cancelled == 0 and manager.metrics.groups_carried >= 5
        assert manager.summary()["groups_carried"] == manager.metrics.groups_carried
        # no seed skipped for good: every seed drawn and not yet trained is a group still running
        untrained = set(drawn) - set(trained)
        assert len(untrained) <= len(manager._carried), (sorted(untrained), len(manager._carried))
    await manager.close()
    assert manager.live_tasks == 0 and manager.open_envs == 0


async def test_async_run_gives_redundant_groups_slots_and_keeps_late_ones(engine, tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    buffer = GroupBuffer(2, alpha=1, redundant_groups=2)
    config = sections("test/Countdown-v0", group_size=2, redundant_groups=2, agent=AgentConfig(max_new_tokens=3))
    manager = EnvManager(engine, engine.tokenizer, **config, buffer=buffer, env_factory=hard_factory)
    stop = asyncio.Event()
    running = asyncio.create_task(manager.run(stop))
    trained = []
    for version in range(4):
        batch = await asyncio.wait_for(buffer.get_batch(version), timeout=60)
        trained += [g.seed for g in batch]
        record = rollout_metrics(manager, buffer)  # what the trainer logs each step
        assert record["buffer/redundant_slots"] == 2 and "rollout/redundant_cancelled" in record
        await asyncio.sleep(0.5)  # the trainer's step: slow groups keep running meanwhile
        await manager.update_weights(weights, version + 1)
    stop.set()
    await asyncio.wait_for(running, 30)
    assert 4 < buffer.peak_occupancy <= 6  # (alpha + 1) * B slots, plus the 2 redundant ones
    assert any(s % 4 == 0 for s in trained), (
        trained,
        buffer.dropped_stale,
        manager.summary()["redundant_cancelled"],
    )  # slow groups finished across the update and were trained
    assert manager.live_tasks == 0 and buffer.in_flight == 0
    await engine.update_weights(weights, version=0)


def test_rollout_section_validation():
    from rollhub.rollout.config import RolloutConfig

    for kwargs, match in (
        ({"redundant_groups": -1}, "redundant_groups"),
        ({"redundant_trajectories": -2}, "redundant_trajectories"),
        ({"lockstep": True, "async_ratio": 0, "redundant_groups": 1}, "lockstep"),
        ({"env_concurrency": {"rollhub/SWE-v0": 0}}, "env_concurrency"),
        ({"staleness_rule": "median"}, "staleness_rule"),
    ):
        with pytest.raises(ValueError, match=match):
            RolloutConfig(**kwargs).validate()
    RolloutConfig(redundant_groups=2, redundant_trajectories=2, env_concurrency={"rollhub/SWE-v0": 8}).validate()
