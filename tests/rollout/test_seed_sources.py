"""Hard-seed replay (rollhub.rollout.seed_sources): pool rules, the replay share, checkpoint
round trip, config errors, and one real lockstep training run that replays and resumes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.rollout.seed_sources import ReplayConfig, ReplaySeedSource, SeedCursor, group_qualifies
from rollhub.rollout.types import Group, Trajectory, TrajectoryStatus


def _group(seed: int, outcomes: list[bool | None]) -> Group:
    """A group of `seed`; None is an infra-failed trajectory."""
    trajectories = [
        Trajectory(env_id="e", seed=seed, success=False, status=TrajectoryStatus.INFRA_FAILED)
        if ok is None
        else Trajectory(env_id="e", seed=seed, success=ok)
        for ok in outcomes
    ]
    return Group(group_id=f"g{seed}", env_id="e", seed=seed, trajectories=trajectories)


def _source(**replay) -> ReplaySeedSource:
    return ReplaySeedSource(100, ReplayConfig(**{"fraction": 0.5, **replay}), seed=7)


def test_qualify_rules_judge_scored_trajectories_only():
    assert group_qualifies(_group(1, [True, False]), "not_all_succeeded")
    assert group_qualifies(_group(1, [False, False]), "not_all_succeeded")
    assert not group_qualifies(_group(1, [True, True]), "not_all_succeeded")
    assert group_qualifies(_group(1, [True, False]), "mixed")
    assert not group_qualifies(_group(1, [False, False]), "mixed")
    assert not group_qualifies(_group(1, [True, True]), "mixed")
    # infra failures are no evidence about the task: ignored, and a group of them alone never qualifies
    assert not group_qualifies(_group(1, [True, None]), "not_all_succeeded")
    assert not group_qualifies(_group(1, [None, None]), "not_all_succeeded")


def test_only_groups_that_did_not_all_succeed_enter_the_pool():
    source = _source()
    metrics = source.observe([_group(100, [True, True]), _group(101, [True, False]), _group(102, [False, False])])
    assert source.pool == [101, 102]
    assert metrics == {"batch/replayed_groups": 0.0, "rollout/replay_pool": 2.0}
    mixed = _source(qualify="mixed")
    mixed.observe([_group(100, [True, True]), _group(101, [True, False]), _group(102, [False, False])])
    assert mixed.pool == [101]


def test_empty_pool_gives_fresh_seeds_in_order():
    source = _source(fraction=1.0)
    assert [next(source) for _ in range(3)] == [100, 101, 102]
    assert source.next_seed == 103


def test_replay_share_matches_fraction():
    source = _source(fraction=0.3, pool_size=10_000, max_replays=10_000)
    source.observe([_group(s, [False]) for s in range(10)])  # seeds 0..9: a pool that never drains
    n = 20_000
    replayed = sum(next(source) < 10 for _ in range(n))
    share = replayed / n
    assert abs(share - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5, share
    assert source.next_seed == 100 + n - replayed  # replays take no fresh seed


def test_max_replays_bounds_every_seed_and_replays_are_counted():
    source = _source(fraction=1.0, max_replays=2)
    source.observe([_group(next(source), [False]) for _ in range(3)])  # seeds 100..102 pooled
    issued = [next(source) for _ in range(6)]  # the pool drains after two replays of each
    assert sorted(issued) == [100, 100, 101, 101, 102, 102]
    assert source.pool == []
    assert next(source) == 103  # then fresh seeds again
    # their groups fail again: counted as replays, and never pooled a second time
    metrics = source.observe([_group(s, [False]) for s in issued])
    assert metrics == {"batch/replayed_groups": 6.0, "rollout/replay_pool": 0.0}
    assert all(next(source) >= 104 for _ in range(20))


def test_a_replay_that_all_succeeds_leaves_the_pool():
    source = _source(fraction=1.0, max_replays=5)
    source.observe([_group(100, [False, False])])
    assert next(source) == 100
    source.observe([_group(100, [True, True])])  # solved now: no more replays of it
    assert source.pool == [] and source.replays(100) == 1


def test_pool_is_bounded_and_keeps_the_newest():
    source = _source(pool_size=4)
    source.observe([_group(s, [False]) for s in range(10)])
    assert source.pool == [6, 7, 8, 9]


def test_checkpoint_round_trip_gives_the_same_future_seeds():
    def play(source: ReplaySeedSource, batches: int) -> list[int]:
        out = []
        for _ in range(batches):
            seeds = [next(source) for _ in range(4)]
            out += seeds
            source.observe([_group(s, [s % 3 == 0, False]) for s in seeds])  # every group is hard
        return out

    source = _source(fraction=0.5, pool_size=5, max_replays=2)
    play(source, 5)
    state = json.loads(json.dumps(source.state_dict()))  # the checkpoint stores it as JSON
    expected = play(source, 10)
    restored = _source(fraction=0.5, pool_size=5, max_replays=2)
    restored.load_state_dict(state)
    assert play(restored, 10) == expected
    assert any(expected.count(s) > 1 for s in expected)  # the sequence does replay

    # a checkpoint from before seed sources (next_seed only) loads with an empty pool
    old = _source()
    old.load_state_dict({"next_seed": 42})
    assert old.pool == [] and next(old) == 42
    cursor = SeedCursor(0)
    cursor.load_state_dict(state)  # replay turned off on resume: the position alone
    assert next(cursor) == state["next_seed"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.replay.fraction=1.5", "rollout.replay.fraction must be in [0, 1]"),
        ("rollout.replay.fraction=-0.1", "rollout.replay.fraction must be in [0, 1]"),
        ("rollout.replay.pool_size=0", "rollout.replay.pool_size must be >= 1"),
        ("rollout.replay.max_replays=0", "rollout.replay.max_replays must be >= 1"),
        ("rollout.replay.qualify=some", "rollout.replay.qualify"),
        ("rollout.replay.fractoin=0.5", "did you mean fraction"),
    ],
)
def test_replay_config_errors(override, message):
    from rollhub.trainer.config import RunConfig

    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(RunConfig, None, [override])


def test_replay_config_loads_and_is_off_by_default():
    from rollhub.trainer.build import build_seeds
    from rollhub.trainer.config import RunConfig

    config = load_config(RunConfig, None, [])
    assert not config.rollout.replay.enabled and isinstance(build_seeds(config), SeedCursor)
    config = load_config(RunConfig, None, ["rollout.replay.fraction=0.25", "env.train_seed_offset=5"])
    seeds = build_seeds(config)
    assert isinstance(seeds, ReplaySeedSource) and seeds.config.fraction == 0.25 and next(seeds) == 5


def test_lockstep_training_replays_hard_seeds_and_resumes_with_its_pool(tiny_model_dir, tmp_path):
    """Real run_training: a random tiny model fails its Sokoban rooms, so step 2 replays step 1's
    seeds (fraction 1); a run stopped after step 1 resumes with the pool it checkpointed."""
    from rollhub.rollout.trajectory_log import read_trajectories
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.loop import run_training
    from rollhub.trainer.metrics import read_jsonl

    def config(run_dir: Path, steps: int) -> RunConfig:
        return load_config(
            RunConfig,
            None,
            [
                f"run_dir={run_dir}",
                "seed=3",
                f"model.path={tiny_model_dir}",
                "model.init_tiny=null",
                "env.kwargs={dim: 6, num_boxes: 1, max_steps: 2}",
                "agent.system_prompt=Sokoban.",
                "agent.max_new_tokens=4",
                "rollout.group_size=2",
                "rollout.groups_per_batch=2",
                "rollout.async_ratio=0",
                "rollout.lockstep=true",
                "rollout.replay.fraction=1.0",
                "rollout.replay.max_replays=1",
                f"train.steps={steps}",
                "train.checkpoint_every=1",
                "eval.episodes=0",
            ],
        )

    def train(cfg: RunConfig, *, resume: bool = False) -> list[dict]:
        asyncio.run(run_training(cfg, resume=resume, progress=False, print_fn=lambda _: None))
        return [r for r in read_jsonl(Path(cfg.run_dir) / "metrics.jsonl") if "batch/groups" in r]

    straight = train(config(tmp_path / "straight", 3))
    pooled = straight[0]["rollout/replay_pool"]
    assert pooled > 0 and straight[0]["batch/replayed_groups"] == 0
    assert straight[1]["batch/replayed_groups"] == pooled  # fraction 1: the pooled seeds come back
    trajectories = list(read_trajectories(tmp_path / "straight" / "trajectories.jsonl"))
    seeds = [t.seed for t in trajectories]
    assert len(set(seeds)) < len(seeds) and set(seeds) <= set(range(6))  # training seeds only, some twice

    resumed_dir = tmp_path / "resumed"
    train(config(resumed_dir, 1))
    state = json.loads(json.dumps(_checkpoint_rollout_state(resumed_dir)))
    assert state["seed_source"]["pool"] and state["next_seed"] == 2
    records = train(config(resumed_dir, 3), resume=True)
    assert [r["batch/replayed_groups"] for r in records] == [r["batch/replayed_groups"] for r in straight]
    assert [r["rollout/replay_pool"] for r in records] == [r["rollout/replay_pool"] for r in straight]


def _checkpoint_rollout_state(run_dir: Path) -> dict:
    from rollhub.trainer.checkpoint import latest_checkpoint, read_checkpoint

    return read_checkpoint(latest_checkpoint(run_dir))["rollout"]
