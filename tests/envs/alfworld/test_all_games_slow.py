"""The expert wins every one of the 134 real valid_unseen games (slow: minutes)."""

import asyncio

import pytest

from tests.envs.alfworld.conftest import needs_engine

pytestmark = [needs_engine, pytest.mark.slow]


async def test_expert_wins_all_134_valid_unseen_games():
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.alfworld.pool import WorkerPool, default_num_workers

    pool = WorkerPool(default_num_workers())
    limit = asyncio.Semaphore(2 * pool.num_workers)

    async def play(seed):
        async with limit:
            env = ALFWorldEnv(pool=pool)
            try:
                _, info = await env.reset(seed=seed)
                while True:
                    _, reward, terminated, truncated, info = await env.step(env.expert_action())
                    if terminated or truncated:
                        return env.game.name, info
            finally:
                await env.close()

    try:
        results = await asyncio.gather(*(play(seed) for seed in range(134)))
    finally:
        pool.close()
    assert len({name for name, _ in results}) == 134
    lost = [name for name, info in results if not info["success"] or "infra_failure" in info]
    assert lost == []
