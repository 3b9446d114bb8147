"""Failure accounting (the rule in rollhub.rollout.types): the model's failures are scored, the
machinery's are re-rolled and never scored, and a permanently broken env stops rollout with a
clear error in bounded time instead of being re-rolled forever."""

from __future__ import annotations

import asyncio

import pytest
from rollout_testing import CountdownEnv, sections

from rollhub.envs.base import Env
from rollhub.envs.registry import register
from rollhub.inference.engines.base import SamplingParams
from rollhub.rollout.agent import AgentConfig, EpisodeRunner, run_episode
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.manager import EnvManager
from rollhub.rollout.types import RolloutFailureError, TrajectoryStatus
from rollhub.sandbox.base import SandboxError
from rollhub.trainer.batch import AlgorithmConfig, build_training_batch

AGENT = AgentConfig(max_new_tokens=4, max_context_tokens=1024)


class BrokenResetEnv(Env):
    """Its sandbox never starts: reset raises before the model has done anything (infra)."""

    made = 0

    def __init__(self) -> None:
        BrokenResetEnv.made += 1

    async def reset(self, *, seed=None, options=None):
        raise SandboxError("container failed to start: no such image")

    async def step(self, action: str):
        raise AssertionError("never reached: reset failed")


class ActionCrashEnv(Env):
    """Its step raises on whatever the model sends (the env attributes it to the action)."""

    made = 0

    def __init__(self) -> None:
        ActionCrashEnv.made += 1

    async def reset(self, *, seed=None, options=None):
        return [{"role": "user", "content": "Say something."}], {"anchor": "start", "success": False}

    async def step(self, action: str):
        raise ValueError(f"cannot parse the move {action!r}")


class SandboxDiesOnStepEnv(ActionCrashEnv):
    """The container dies under the step: a machinery error escaping `step` (infra)."""

    async def step(self, action: str):
        raise SandboxError("container exited unexpectedly")


register("test/BrokenReset-v0", BrokenResetEnv, gymnasium_compat=False)
register("test/ActionCrash-v0", ActionCrashEnv, gymnasium_compat=False)


def _manager(engine, env_id: str, max_infra_retries: int = 1, **rollout) -> EnvManager:
    defaults = dict(group_size=2, infra_failure_window=8, agent=AGENT)
    config = sections(env_id, **{**defaults, **rollout})
    return EnvManager(engine, engine.tokenizer, **config, max_infra_retries=max_infra_retries)


# --- infra: bounded, with a clear error ----------------------------------------------------


async def test_collect_batch_with_an_env_that_never_resets_stops_with_a_clear_error(engine):
    manager = _manager(engine, "test/BrokenReset-v0")
    BrokenResetEnv.made = 0
    with pytest.raises(RolloutFailureError) as caught:
        await asyncio.wait_for(manager.collect_batch(2), timeout=30)
    message = str(caught.value)
    assert "8 of the last 8 trajectories failed for infrastructure reasons" in message
    assert "container failed to start" in message and "test/BrokenReset-v0" in message
    assert "rollout.max_infra_failure_rate" in message
    assert 8 <= BrokenResetEnv.made < 40  # stopped once the window was full, not after endless re-rolls
    assert manager.metrics.infra_failures >= 8 and manager.metrics.trajectories_kept == 0
    with pytest.raises(RolloutFailureError):  # the budget stays spent
        await asyncio.wait_for(manager.collect_batch(1), timeout=5)
    await manager.close()
    assert manager.open_envs == 0 and manager.live_tasks == 0


async def test_run_with_an_env_that_never_resets_raises_and_frees_the_buffer(engine):
    buffer = GroupBuffer(2, alpha=1.0)
    config = sections("test/BrokenReset-v0", group_size=2, infra_failure_window=8, agent=AGENT)
    manager = EnvManager(engine, engine.tokenizer, **config, max_infra_retries=1, buffer=buffer)
    with pytest.raises(RolloutFailureError, match="8 of the last 8"):
        await asyncio.wait_for(manager.run(asyncio.Event()), timeout=30)
    assert manager.failure is not None
    assert buffer.in_flight == 0 and buffer.buffered == 0  # every admitted slot was given back
    assert manager.open_envs == 0 and manager.live_tasks == 0


async def test_lockstep_batches_count_toward_the_same_budget(engine):
    manager = _manager(engine, "test/BrokenReset-v0", lockstep=True)
    groups = await manager.collect_batch(2)  # 4 failures: the window of 8 is not full yet
    assert [t.status for g in groups for t in g.trajectories] == [TrajectoryStatus.INFRA_FAILED] * 4
    with pytest.raises(RolloutFailureError, match="8 of the last 8"):
        await asyncio.wait_for(manager.collect_batch(2), timeout=30)
    assert manager.open_envs == 0


async def test_a_healthy_share_of_infra_failures_keeps_running(engine):
    made = iter(range(1000))

    def two_envs_break(env_id, **kwargs):
        return CountdownEnv(max_steps=1, fail_reset=next(made) in (1, 6))

    config = sections("test/Countdown-v0", group_size=2, infra_failure_window=8, agent=AGENT)
    manager = EnvManager(engine, engine.tokenizer, **config, max_infra_retries=2, env_factory=two_envs_break)
    groups = await asyncio.wait_for(manager.collect_batch(6), timeout=60)
    assert len(groups) == 6 and manager.failure is None
    assert manager.metrics.infra_failures == 2 and manager.metrics.infra_retries == 2
    # re-rolled to full size: every kept group has N scored members of one seed
    assert all(len(g.trajectories) == 2 and all(t.scored for t in g.trajectories) for g in groups)
    assert all({t.seed for t in g.trajectories} == {g.seed} for g in groups)
    await manager.close()


# --- model failures: scored, trainable, never retried ----------------------------------------


async def test_env_exception_caused_by_the_action_is_a_model_failure(engine):
    trajectory = await run_episode(ActionCrashEnv(), engine, engine.tokenizer, AGENT, seed=0)
    assert trajectory.status == TrajectoryStatus.TRUNCATED and trajectory.scored
    assert (
        trajectory.model_failure == "env_error" and "cannot parse the move" in trajectory.info["model_failure_detail"]
    )
    assert trajectory.infra_error is None
    assert len(trajectory.turns) == 1 and trajectory.turns[0].reward == 0.0
    assert not trajectory.turns[0].action_valid and trajectory.info["invalid_actions"] == 1


async def test_manager_keeps_model_failures_and_does_not_retry_them(engine):
    manager = _manager(engine, "test/ActionCrash-v0", max_infra_retries=3)
    ActionCrashEnv.made = 0
    groups = await asyncio.wait_for(manager.collect_batch(2), timeout=30)
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == 4 and all(t.model_failure == "env_error" for t in trajectories)
    assert ActionCrashEnv.made == 4  # one env per trajectory: nothing was re-rolled
    assert manager.metrics.infra_failures == 0 and manager.metrics.infra_retries == 0
    assert manager.summary()["model_failures"] == 4 and manager.summary()["model_failure_reasons"] == {"env_error": 4}
    # trainable: every response token enters the batch
    batch, stats = build_training_batch(groups, 0, AlgorithmConfig(estimator="grpo"))
    assert stats.trajectories == 4 and stats.excluded_trajectories == 0
    assert int(batch.response_mask.sum()) == sum(t.num_response_tokens for t in trajectories)
    await manager.close()


async def test_machinery_error_escaping_step_is_infra(engine):
    trajectory = await run_episode(SandboxDiesOnStepEnv(), engine, engine.tokenizer, AGENT, seed=0)
    assert trajectory.status == TrajectoryStatus.INFRA_FAILED and not trajectory.scored
    assert "container exited" in trajectory.infra_error and trajectory.model_failure is None


async def test_context_overflow_is_a_model_failure(engine):
    config = AgentConfig(max_new_tokens=16, min_new_tokens=8, max_context_tokens=90)
    trajectory = await run_episode(CountdownEnv(max_steps=50), engine, engine.tokenizer, config, seed=0)
    assert trajectory.status == TrajectoryStatus.TRUNCATED and trajectory.scored
    assert trajectory.model_failure == "context" and trajectory.info["truncated_reason"] == "context"


async def test_too_many_resubmits_is_a_model_failure(engine, tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    config = AgentConfig(max_new_tokens=120, max_context_tokens=1024, max_resubmits=0)
    runner = EpisodeRunner(CountdownEnv(max_steps=3), tokenizer, config, env_id="test/Countdown-v0", seed=0)
    await runner.reset()
    prompt, _ = runner.next_request()
    task = asyncio.create_task(
        runner.generate(engine, prompt, SamplingParams(max_new_tokens=120, stop_token_ids=(10**9,)))
    )
    while engine.stats.generated_tokens < 10:
        await asyncio.sleep(0.005)
    await engine.pause()
    await engine.update_weights(weights, version=1)
    await engine.resume()
    generation = await task
    assert generation.finish_reason == "abort"
    await runner.step_env(prompt, generation)
    trajectory = runner.trajectory
    assert runner.done and runner.next_request() is None
    assert trajectory.status == TrajectoryStatus.TRUNCATED and trajectory.scored
    assert trajectory.model_failure == "max_resubmits" and trajectory.infra_error is None
    assert trajectory.turns[-1].reward == 0.0 and trajectory.num_response_tokens == len(generation.token_ids) > 0
    await engine.update_weights(weights, version=0)


# --- a group with an infra-failed member: baseline over the others only -----------------------


async def test_lockstep_group_with_an_infra_failed_member_is_baselined_on_the_others(engine):
    made = iter(range(1000))

    def third_env_dies(env_id, **kwargs):  # the third member's worker crashes on its second step
        return CountdownEnv(max_steps=3, fail_on_step=2 if next(made) == 2 else None)

    config = sections("test/Countdown-v0", group_size=4, lockstep=True, agent=AGENT)
    manager = EnvManager(engine, engine.tokenizer, **config, env_factory=third_env_dies)
    [group] = await manager.collect_batch(1)
    statuses = [t.status for t in group.trajectories]
    assert statuses.count(TrajectoryStatus.INFRA_FAILED) == 1 and statuses[2] == TrajectoryStatus.INFRA_FAILED
    assert group.trajectories[2].turns  # it has a scored-looking first turn: it must still not count
    batch, stats = build_training_batch([group], 0, AlgorithmConfig(estimator="grpo"))
    scored = [t for t in group.trajectories if t.scored]
    mean = sum(t.total_reward for t in scored) / len(scored)
    assert stats.excluded_trajectories == 1 and len(batch) == 3
    for row, trajectory in enumerate(scored):
        advantages = batch.advantages[row][batch.response_mask[row] > 0].tolist()
        assert advantages == pytest.approx([trajectory.total_reward - mean] * trajectory.num_response_tokens)
