"""Training seeds (rollhub.rollout.seed_sources): fresh seeds in order, the checkpointed position,
and checkpoints that still carry the seed pool of the removed hard-seed replay."""

from __future__ import annotations

import json

import pytest

from rollhub.core.config import load_config
from rollhub.rollout.seed_sources import SeedCursor


def test_cursor_hands_out_fresh_seeds_from_its_offset_and_round_trips():
    cursor = SeedCursor(100)
    assert [next(cursor) for _ in range(3)] == [100, 101, 102]
    state = json.loads(json.dumps(cursor.state_dict()))  # the checkpoint stores it as JSON
    restored = SeedCursor(0)
    restored.load_state_dict(state)
    assert next(restored) == 103


def test_cursor_loads_a_checkpoint_with_a_replay_pool():
    """Older runs saved the replay pool, counts and draws beside the position: only the position counts."""
    cursor = SeedCursor(0)
    cursor.load_state_dict({"next_seed": 42, "pool": [3, 5], "replays": [[3, 1]], "rng": [3, [1, 2], None]})
    assert next(cursor) == 42 and next(cursor) == 43
    cursor.load_state_dict({})  # no position saved: stays where it is
    assert next(cursor) == 44


def test_build_seeds_starts_at_the_training_offset():
    from rollhub.trainer.build import build_seeds
    from rollhub.trainer.config import RunConfig

    seeds = build_seeds(load_config(RunConfig, None, ["env.train_seed_offset=5"]))
    assert isinstance(seeds, SeedCursor) and next(seeds) == 5


def test_the_run_seed_moves_the_training_tasks_and_the_engine_sampling():
    """Two runs that differ only in `seed` train on disjoint tasks and sample with other seeds;
    seed 0 keeps env.train_seed_offset and engine.seed as given."""
    from rollhub.trainer.build import build_seeds
    from rollhub.trainer.config import RunConfig

    base = ["env.train_seed_offset=5", "engine.seed=7"]
    zero, one = (load_config(RunConfig, None, [*base, f"seed={seed}"]) for seed in (0, 1))
    assert next(build_seeds(zero)) == 5 and zero.engine_config.seed == 7
    assert next(build_seeds(one)) == 5 + one.train_seed_bound and one.engine_config.seed == 8
    assert set(zero.train_seeds).isdisjoint(one.train_seeds)
    assert one.engine.seed == 7  # the section itself is untouched (config.json, a resume, re-validation)
    # a seed whose tasks would reach the held-out seeds is refused, not silently overlapped
    from rollhub.core.errors import UserError

    onto_held_out = (zero.eval.seed_offset - 5) // zero.train_seed_bound
    with pytest.raises(UserError, match="training seeds"):
        load_config(RunConfig, None, [*base, f"seed={onto_held_out}"])
