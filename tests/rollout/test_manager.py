"""EnvManager: real Sokoban rollouts, token accounting, redundancy cancellation, lockstep, infra retries."""

from __future__ import annotations

import asyncio
import json

import pytest
from rollout_testing import CountdownEnv, sections

from rollhub.rollout.agent import AgentConfig
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.config import RolloutConfig
from rollhub.rollout.manager import EnvManager
from rollhub.rollout.types import RolloutFailureError, TrajectoryStatus

FAST_AGENT = AgentConfig(max_new_tokens=6, max_turns=4, max_context_tokens=1024)


async def test_64_sokoban_trajectories_every_token_accounted(engine, tmp_path):
    config = sections("rollhub/Sokoban-v0", group_size=4, agent=FAST_AGENT)
    manager = EnvManager(engine, engine.tokenizer, **config, jsonl_path=str(tmp_path / "t.jsonl"))
    tokens_before = engine.stats.generated_tokens
    groups = await manager.collect_batch(16)
    await manager.close()
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(groups) == 16 and len(trajectories) == 64
    assert all(len(g.trajectories) == 4 and len({t.seed for t in g.trajectories}) == 1 for g in groups)
    assert len({g.seed for g in groups}) == 16
    produced = engine.stats.generated_tokens - tokens_before
    kept = sum(t.num_response_tokens for t in trajectories)
    assert kept == produced == manager.metrics.generated_tokens  # no token lost or invented
    for trajectory in trajectories:
        assert trajectory.status in (TrajectoryStatus.COMPLETED, TrajectoryStatus.TRUNCATED)
        assert trajectory.turns and all(t.token_versions == [0] * len(t.response_ids) for t in trajectory.turns)
        masked = sum(sum(s.response_mask) for s in trajectory.packed_sequences())
        assert masked == trajectory.num_response_tokens
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert len(lines) == 64 and sum(json.loads(line)["num_response_tokens"] for line in lines) == kept
    assert manager.open_envs == 0 and manager.live_tasks == 0 and engine.num_in_flight == 0
    summary = manager.summary()
    assert summary["env_step_latency"]["rollhub/Sokoban-v0"]["count"] == sum(len(t.turns) for t in trajectories)


async def test_redundancy_cancels_stragglers_and_leaves_nothing_behind(engine, countdown_factory):
    slow_every = iter(range(1000))

    def factory(env_id, **kwargs):
        # every third env is a straggler; redundancy must not wait for it
        return CountdownEnv(max_steps=3, step_sleep_s=5.0 if next(slow_every) % 3 == 2 else 0.0)

    config = sections(
        "test/Countdown-v0",
        group_size=2,
        redundant_trajectories=1,
        redundant_groups=1,
        agent=AgentConfig(max_new_tokens=4),
    )
    manager = EnvManager(engine, engine.tokenizer, **config, env_factory=factory)
    live_before = CountdownEnv.live
    groups = await asyncio.wait_for(manager.collect_batch(3), timeout=60)
    assert len(groups) == 3 and all(len(g.trajectories) == 2 for g in groups)
    assert manager.metrics.redundant_cancelled >= 3  # each group had one straggler
    assert manager.live_tasks == 0 and manager.open_envs == 0 and CountdownEnv.live == live_before
    for _ in range(100):
        if engine.num_in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.num_in_flight == 0
    await manager.close()


async def test_lockstep_baseline_steps_all_envs_together(engine, countdown_factory):
    config = sections(
        "test/Countdown-v0",
        group_size=3,
        lockstep=True,
        agent=AgentConfig(max_new_tokens=5),
        env_kwargs={"max_steps": 2},
    )
    manager = EnvManager(engine, engine.tokenizer, **config, env_factory=countdown_factory)
    groups = await manager.collect_batch(2)
    assert [len(g.trajectories) for g in groups] == [3, 3]
    assert all(len(t.turns) == 2 for g in groups for t in g.trajectories)
    assert manager.open_envs == 0
    with pytest.raises(ValueError, match="lockstep"):
        RolloutConfig(lockstep=True, async_ratio=0, redundant_trajectories=1).validate()


async def test_infra_failures_are_retried_then_group_dropped(engine):
    calls = iter(range(1000))

    def flaky(env_id, **kwargs):
        return CountdownEnv(max_steps=2, fail_on_step=1 if next(calls) % 2 == 0 else None)

    config = sections("test/Countdown-v0", group_size=2, agent=AgentConfig(max_new_tokens=3))
    manager = EnvManager(engine, engine.tokenizer, **config, max_infra_retries=2, env_factory=flaky)
    groups = await manager.collect_batch(2)
    assert all(t.status != TrajectoryStatus.INFRA_FAILED for g in groups for t in g.trajectories)
    assert manager.metrics.infra_failures >= 1 and manager.metrics.infra_retries >= 1

    always_broken = EnvManager(
        engine,
        engine.tokenizer,
        **sections("test/Countdown-v0", group_size=2, agent=AgentConfig(max_new_tokens=3)),
        max_infra_retries=1,
        env_factory=lambda env_id, **kw: CountdownEnv(fail_reset=True),
    )
    with pytest.raises(RolloutFailureError, match="infra"):  # a permanently broken env stops the run, never spins
        await asyncio.wait_for(always_broken.collect_batch(1), timeout=30)
    assert always_broken.metrics.groups_dropped_infra >= 1
    await always_broken.close()
    assert always_broken.open_envs == 0


async def test_per_env_concurrency_limit(engine):
    peak = 0

    class Tracked(CountdownEnv):
        async def step(self, action):
            nonlocal peak
            peak = max(peak, CountdownEnv.live - baseline)
            return await super().step(action)

    baseline = CountdownEnv.live
    config = sections(
        "test/Countdown-v0",
        group_size=4,
        env_concurrency={"test/Countdown-v0": 2},
        agent=AgentConfig(max_new_tokens=3),
    )
    manager = EnvManager(
        engine, engine.tokenizer, **config, env_factory=lambda env_id, **kw: Tracked(max_steps=2, step_sleep_s=0.01)
    )
    await manager.collect_batch(2)
    assert 1 <= peak <= 2


async def test_async_run_with_weight_updates_tags_versions_and_respects_alpha(engine, tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    buffer = GroupBuffer(2, alpha=1, staleness_rule="oldest")  # the per-token lag bound below is this rule's
    config = sections(
        "test/Countdown-v0",
        group_size=2,
        agent=AgentConfig(max_new_tokens=8),
        env_kwargs={"max_steps": 3, "step_sleep_s": 0.01},
    )
    manager = EnvManager(
        engine, engine.tokenizer, **config, buffer=buffer, env_factory=lambda env_id, **kw: CountdownEnv(**kw)
    )
    stop = asyncio.Event()
    running = asyncio.create_task(manager.run(stop))
    seen_versions = set()
    for version in range(4):
        batch = await asyncio.wait_for(buffer.get_batch(version), timeout=60)
        for group in batch:
            for trajectory in group.trajectories:
                for turn in trajectory.turns:
                    assert all(version - v <= 1 for v in turn.token_versions)  # ceil(alpha) lag bound
                    assert all(0 <= v <= version for v in turn.token_versions)
                    seen_versions.update(turn.token_versions)
        await manager.update_weights(weights, version + 1)
    stop.set()
    await asyncio.wait_for(running, 30)
    assert buffer.peak_occupancy <= 4
    assert len(seen_versions) >= 2  # later batches were generated by newer weights
    assert manager.live_tasks == 0 and engine.num_in_flight == 0 and buffer.in_flight == 0
    assert len(manager.metrics.weight_updates) == 4
    await engine.update_weights(weights, version=0)
