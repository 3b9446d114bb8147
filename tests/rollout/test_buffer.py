"""GroupBuffer: the (α+1)·B admission bound, staleness drops, histogram, checkpoints."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.types import Group, Trajectory, Turn


def make_group(version: int, tokens: int = 3, name: str = "g") -> Group:
    turn = Turn(
        prompt_ids=[1, 2],
        response_ids=list(range(tokens)),
        behaviour_logprobs=[-1.0] * tokens,
        token_versions=[version] * tokens,
    )
    trajectory = Trajectory(env_id="test/X-v0", seed=0, turns=[turn])
    return Group(group_id=name, env_id="test/X-v0", seed=0, trajectories=[trajectory])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch_size=st.integers(1, 4),
    alpha=st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]),
    latencies=st.lists(st.floats(0.0, 0.004), min_size=8, max_size=30),
    train_s=st.floats(0.0, 0.003),
    seed=st.integers(0, 1000),
)
def test_alpha_bound_never_exceeded_with_random_latencies(batch_size, alpha, latencies, train_s, seed):
    """Producers with random generation latencies vs a trainer: occupancy and lag stay bounded."""

    async def scenario() -> None:
        rng = random.Random(seed)
        buffer = GroupBuffer(batch_size, alpha)
        bound = math.floor((alpha + 1) * batch_size + 1e-9)
        version = 0
        violations: list[str] = []

        async def produce(latency: float) -> None:
            async with buffer.admit() as ticket:
                start_version = version
                if buffer.occupancy > bound:
                    violations.append(f"occupancy {buffer.occupancy} > {bound}")
                await asyncio.sleep(latency)
                if rng.random() < 0.1:
                    return  # failed group: slot must come back
                ticket.put(make_group(start_version))

        async def producers() -> None:
            tasks = [asyncio.create_task(produce(latency)) for latency in latencies * 3]
            await asyncio.gather(*tasks)

        producing = asyncio.create_task(producers())
        for _ in range(3):
            try:
                batch = await buffer.get_batch(version, timeout_s=2.0)
            except TimeoutError:
                break  # producers ran out: fine
            for group in batch:
                lag = version - group.oldest_version
                if lag > math.ceil(alpha):
                    violations.append(f"lag {lag} > ceil({alpha})")
            await asyncio.sleep(train_s)
            version += 1
        producing.cancel()
        await asyncio.gather(producing, return_exceptions=True)
        assert not violations, violations
        assert buffer.peak_occupancy <= bound
        assert buffer.in_flight == 0  # every cancelled producer gave its slot back

    asyncio.run(scenario())


async def test_alpha_zero_admits_exactly_one_batch():
    buffer = GroupBuffer(2, alpha=0)
    tickets = [await buffer.acquire(), await buffer.acquire()]
    third = asyncio.create_task(buffer.acquire())
    await asyncio.sleep(0.01)
    assert not third.done()
    for ticket in tickets:
        ticket.put(make_group(0))
    await asyncio.sleep(0.01)
    assert not third.done()  # buffered groups still count until consumed
    assert len(await buffer.get_batch(0)) == 2
    await asyncio.sleep(0.01)
    assert not third.done()  # nothing is generated while the trainer trains (it would be stale)
    next_batch = asyncio.create_task(buffer.get_batch(1))
    await asyncio.wait_for(third, 1)  # the trainer asks for the next batch: room again
    next_batch.cancel()
    await asyncio.gather(next_batch, return_exceptions=True)


async def test_trainer_bound_run_drops_nothing():
    """A slow trainer and fast producers: every admitted group is consumed, none is dropped.

    With the plain (α+1)·B occupancy bound, a group admitted while the trainer trains runs on
    weights one version behind the next batch, and one batch per two steps arrived too late."""
    batch_size, alpha, steps = 2, 1.0, 6
    buffer = GroupBuffer(batch_size, alpha)
    version = 0
    stop = asyncio.Event()

    async def producer() -> None:
        while not stop.is_set():
            ticket = await buffer.acquire()
            admitted = version
            await asyncio.sleep(0.001)
            ticket.put(make_group(admitted))

    workers = [asyncio.create_task(producer()) for _ in range(8)]
    for _ in range(steps):
        batch = await buffer.get_batch(version)
        assert all(version - g.oldest_version <= 1 for g in batch)
        await asyncio.sleep(0.03)  # training: producers are far faster
        version += 1
    stop.set()
    for worker in workers:
        worker.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    assert buffer.dropped_stale == 0
    assert buffer.peak_occupancy <= buffer.capacity


async def test_fractional_alpha_capacity():
    assert GroupBuffer(4, alpha=0.5).capacity == 6
    assert GroupBuffer(3, alpha=0.5).capacity == 4  # floor(4.5)
    assert GroupBuffer(4, alpha=1.5).max_lag == 2


async def test_redundant_groups_at_alpha_zero_carry_a_group_one_version_late():
    """α = 0 with redundant slots: a group that finished at version 0 while the trainer stepped is
    carried into the version-1 batch, not dropped; two versions late is still too stale, and
    without redundant slots α = 0 keeps allowing no lag at all."""
    carrying = GroupBuffer(1, alpha=0, redundant_groups=1)
    assert carrying.max_lag == 1
    carrying.put(make_group(0, name="late"))
    assert [g.group_id for g in await carrying.get_batch(1)] == ["late"]
    carrying.put(make_group(0, name="too-late"))
    carrying.set_trainer_version(2)
    assert carrying.dropped_stale == 1 and carrying.buffered == 0

    on_policy = GroupBuffer(1, alpha=0)
    assert on_policy.max_lag == 0
    on_policy.put(make_group(0, name="late"))
    on_policy.set_trainer_version(1)
    assert on_policy.dropped_stale == 1
    on_policy.configure(redundant_groups=2)  # how a training run builds it (rollhub.trainer.build)
    assert on_policy.max_lag == 1
    assert GroupBuffer(4, alpha=2, redundant_groups=1).max_lag == 2


async def test_stale_groups_dropped_and_counted_staleness_histogram():
    buffer = GroupBuffer(2, alpha=1)
    buffer.put(make_group(0, name="old"))
    buffer.put(make_group(2, name="a"))
    buffer.put(make_group(3, name="b", tokens=2))
    batch = await buffer.get_batch(3)
    assert [g.group_id for g in batch] == ["a", "b"]
    assert buffer.dropped_stale == 1
    assert dict(buffer.last_batch_staleness) == {1: 3, 0: 2}
    assert buffer.metrics()["staleness/max"] == 1


async def test_get_batch_waits_for_enough_groups():
    buffer = GroupBuffer(2, alpha=1)
    buffer.put(make_group(0))
    waiting = asyncio.create_task(buffer.get_batch(0))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    buffer.put(make_group(0))
    assert len(await asyncio.wait_for(waiting, 1)) == 2
    assert buffer.consumer_wait_s > 0.01


async def test_state_dict_roundtrip_keeps_groups_and_anchor_types():
    buffer = GroupBuffer(2, alpha=1)
    group = make_group(1)
    group.trajectories[0].turns[0].anchor = b"\x01\x02"
    buffer.put(group)
    buffer.dropped_stale = 5
    restored = GroupBuffer(2, alpha=1)
    restored.load_state_dict(buffer.state_dict())
    assert restored.buffered == 1 and restored.dropped_stale == 5
    assert restored._groups[0].trajectories[0].turns[0].anchor == b"\x01\x02"
    with pytest.raises(ValueError, match="alpha"):
        GroupBuffer(2, alpha=2).load_state_dict(buffer.state_dict())


async def test_batch_takes_the_oldest_groups_first_so_late_ones_are_not_left_to_go_stale():
    buffer = GroupBuffer(2, alpha=1.0)
    tickets = [await buffer.acquire() for _ in range(4)]  # admitted in this order at version 0
    for name, ticket in zip("abc", tickets[1:]):
        ticket.put(make_group(0, name=name))  # fresh groups arrive first
    tickets[0].put(make_group(0, name="slow"))  # the first admitted arrives last
    batch = await buffer.get_batch(0)
    assert [g.group_id for g in batch] == ["slow", "a"]  # same version: admitted first wins
    buffer.put(make_group(1, name="new"))
    buffer.put(make_group(0, name="c0"))  # no ticket: admission index 0, before b and c
    batch = await buffer.get_batch(1)
    assert [g.group_id for g in batch] == ["c0", "b"]
    assert [g.group_id for g in await buffer.get_batch(1)] == ["c", "new"]  # version 0 before version 1
