"""Worker processes: placement of groups, crashed and hung workers, many concurrent envs."""

import asyncio
import os
import signal

import numpy as np
import pytest

from tests.envs.alfworld.conftest import needs_engine

pytestmark = needs_engine


async def run_episode(env, seed, agent, rng=None):
    """Play one episode; returns (success, steps, last info)."""
    _, info = await env.reset(seed=seed)
    steps = 0
    while True:
        action = env.expert_action() if agent == "expert" else env.random_action(rng)
        _, _, terminated, truncated, info = await env.step(action)
        steps += 1
        if terminated or truncated:
            return info["success"], steps, info


async def test_a_killed_worker_fails_only_its_own_episode_and_is_restarted():
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.alfworld.pool import WorkerPool

    pool = WorkerPool(2)
    try:
        victim, survivor = ALFWorldEnv(pool=pool), ALFWorldEnv(pool=pool)
        await victim.reset(seed=0)
        await survivor.reset(seed=1)
        assert victim.slot.worker != survivor.slot.worker
        dead_pid = pool.pid_of(victim.slot)
        os.kill(dead_pid, signal.SIGKILL)

        obs, reward, terminated, truncated, info = await victim.step(victim.expert_action())
        assert "worker" in info["infra_failure"]
        assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
        again = await victim.step("<action>look</action>")  # still reported, never raises
        assert again[4]["infra_failure"]

        total = 0.0
        while True:  # the other worker's episode is untouched
            _, reward, terminated, truncated, info = await survivor.step(survivor.expert_action())
            total += reward
            if terminated or truncated:
                break
        assert info["success"] is True and total == 1.0 and "infra_failure" not in info

        success, _, info = await run_episode(victim, 0, "expert")  # a new episode gets a new worker
        assert success and "infra_failure" not in info
        assert pool.pid_of(victim.slot) != dead_pid and pool.workers[victim.slot.worker].restarts == 1
        await victim.close()
        await survivor.close()
    finally:
        pool.close()


async def test_a_hung_worker_is_killed_after_the_timeout_and_replaced():
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.alfworld.pool import WorkerPool

    pool = WorkerPool(1, hang_timeout_s=60.0)  # a cold load on a busy machine takes seconds
    try:
        env = ALFWorldEnv(pool=pool)
        await env.reset(seed=0)
        hung_pid = pool.pid_of(env.slot)
        pool.hang_timeout_s = 2.0  # the watchdog reads it live
        os.kill(hung_pid, signal.SIGSTOP)  # alive but silent, like an engine stuck in a loop
        _, reward, terminated, truncated, info = await asyncio.wait_for(env.step(env.expert_action()), timeout=60)
        assert info["infra_failure"] and truncated and not terminated and reward == 0.0
        pool.hang_timeout_s = 60.0
        success, _, _ = await run_episode(env, 0, "expert")
        assert success and pool.pid_of(env.slot) != hung_pid
        await env.close()
    finally:
        pool.close()


async def test_a_group_shares_one_worker_and_its_translation_cache():
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.alfworld.pool import WorkerPool

    pool = WorkerPool(2)
    try:
        group = [ALFWorldEnv(pool=pool) for _ in range(4)]
        await asyncio.gather(*(env.reset(seed=7) for env in group))
        assert len({env.slot.worker for env in group}) == 1
        loner = ALFWorldEnv(pool=pool)
        await loner.reset(seed=8, options={"route_key": "another-group"})
        assert loner.slot.worker != group[0].slot.worker  # new groups go to the least loaded worker
        stats = {s["worker"]: s for s in await pool.worker_stats()}
        cache = stats[group[0].slot.worker]["translation_cache"]
        assert (
            cache["misses"] == 2 and cache["hits"] >= 4 * 4 - 2
        )  # one translation (plain + optimised) for 4 loads + 4 resets
        assert stats[group[0].slot.worker]["logic_cache"]["misses"] == 1  # one grammar parse for the group
        assert stats[group[0].slot.worker]["sessions"] == 4
        worker = group[0].slot.worker
        await asyncio.gather(*(env.close() for env in group + [loner]))
        stats = {s["worker"]: s for s in await pool.worker_stats()}
        assert stats[worker]["free_sessions"] == 4  # engine objects are kept for reuse
    finally:
        pool.close()


async def drive_concurrently(num_envs: int, group_size: int, random_max_steps: int):
    """Half expert, half random agents, in groups on shared workers; all at once."""
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.alfworld.pool import WorkerPool

    pool = WorkerPool(2)
    try:
        envs = []
        jobs = []
        for i in range(num_envs):
            group = i // group_size
            agent = "expert" if i % 2 == 0 else "random"
            env = ALFWorldEnv(pool=pool, max_steps=50 if agent == "expert" else random_max_steps)
            envs.append(env)
            jobs.append(run_episode(env, 10 + group, agent, np.random.default_rng(i)))
        results = await asyncio.gather(*jobs)
        stats = await pool.worker_stats()
        await asyncio.gather(*(env.close() for env in envs))
        return results, stats
    finally:
        pool.close()


async def check_concurrent_episodes(num_envs: int, group_size: int, random_max_steps: int) -> None:
    results, stats = await drive_concurrently(num_envs, group_size, random_max_steps)
    assert len(results) == num_envs
    for i, (success, steps, info) in enumerate(results):
        assert "infra_failure" not in info
        assert (
            success is True if i % 2 == 0 else (steps == random_max_steps or success)
        )  # experts win, random agents run out
    assert sum(s["sessions"] for s in stats) == num_envs and all(s["restarts"] == 0 for s in stats)


async def test_eight_concurrent_envs_complete_their_episodes():
    await check_concurrent_episodes(8, group_size=4, random_max_steps=5)


@pytest.mark.slow
async def test_sixty_four_concurrent_envs_complete_their_episodes():
    await check_concurrent_episodes(64, group_size=8, random_max_steps=50)
