"""Sokoban's held-out rooms are held out by content: small rooms repeat across seeds."""

import asyncio

import pytest

from rollhub.core.errors import UserError
from rollhub.envs.registry import make
from rollhub.envs.run_checks import check_eval_disjoint
from rollhub.envs.sokoban.env import key_in_test_partition, room_partition

KWARGS = {"dim": 6, "num_boxes": 1, "max_steps": 10}


def keys(split: str, seeds: range, **extra) -> list[str]:
    env = make("rollhub/Sokoban-v0", split=split, **KWARGS, **extra)

    async def draw() -> list[str]:
        found = []
        for seed in seeds:
            await env.reset(seed=seed)
            found.append(env.task_key())
        return found

    return asyncio.run(draw())


def test_the_same_seeds_without_a_split_repeat_rooms_across_ranges():
    # why seed ranges cannot hold rooms out: disjoint seed ranges draw shared rooms
    from rollhub.envs.sokoban.env import room_key

    env = make("rollhub/Sokoban-v0", **KWARGS)

    async def draw(seeds: range) -> set[str]:
        out = set()
        for seed in seeds:
            await env.reset(seed=seed)
            out.add(room_key(env.board))
        return out

    early, late = asyncio.run(draw(range(0, 1500))), asyncio.run(draw(range(1_000_000, 1_000_100)))
    assert early & late, "expected a small room space to repeat across seed ranges"


def test_train_and_test_splits_are_disjoint_by_content():
    train = keys("train", range(0, 300), min_solution_steps=5)
    test = keys("test", range(1_000_000, 1_000_060))
    assert not any(key_in_test_partition(k) for k in train)
    assert all(key_in_test_partition(k) for k in test)
    assert not set(train) & set(test)
    assert len(set(test)) > 40  # the test partition is not a handful of rooms


def test_the_validation_split_is_disjoint_by_content_from_train_and_test():
    """Checkpoint selection reads the validation split: none of its rooms is trained on or held out,
    even where the seeds are the same (small rooms repeat across seeds)."""
    seeds = range(2_000_000, 2_000_200)
    validation = keys("validation", seeds)
    train, test = keys("train", seeds), keys("test", seeds)
    assert {room_partition(k) for k in validation} == {"validation"}
    assert {room_partition(k) for k in train} == {"train"} and {room_partition(k) for k in test} == {"test"}
    assert not set(validation) & (set(train) | set(test))
    assert len(set(validation)) > 100  # a partition of many rooms, not a handful
    env = make("rollhub/Sokoban-v0", split="validation", **KWARGS)
    everyone = set(validation) | set(train) | set(test)
    assert env.could_draw(everyone) == set(validation)
    assert make("rollhub/Sokoban-v0", split="train", **KWARGS).could_draw(everyone) == set(train)


def test_room_partitions_cover_the_hash_space_in_their_shares():
    values = [f"sokoban:{value:08x}" for value in range(0, 1000 * 4096, 4096)]
    shares = {p: sum(room_partition(k) == p for k in values) / len(values) for p in ("train", "validation", "test")}
    assert shares == pytest.approx({"train": 0.7, "validation": 0.1, "test": 0.2}, abs=0.02)
    assert room_partition("not-a-room") == "test"  # a foreign key is never trained on


def test_the_split_is_deterministic_per_seed():
    assert keys("test", range(5, 10)) == keys("test", range(5, 10))


def test_the_run_check_refuses_evaluation_on_the_training_partition_and_passes_a_split():
    eval_seeds = list(range(1_000_000, 1_000_020))
    train_seeds = list(range(0, 2000))
    check_eval_disjoint(
        "rollhub/Sokoban-v0",
        {**KWARGS, "split": "train"},
        "rollhub/Sokoban-v0",
        {**KWARGS, "split": "test"},
        eval_seeds=eval_seeds,
        train_seeds=train_seeds,
    )
    with pytest.raises(UserError, match="evaluation overlaps training"):
        check_eval_disjoint(
            "rollhub/Sokoban-v0",
            {**KWARGS, "split": "train"},
            "rollhub/Sokoban-v0",
            {**KWARGS, "split": "train"},
            eval_seeds=eval_seeds,
            train_seeds=train_seeds,
        )


def test_a_bad_split_is_refused():
    with pytest.raises(ValueError, match="split must be one of"):
        make("rollhub/Sokoban-v0", split="valid", **KWARGS)
