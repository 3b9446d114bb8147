"""Training seeds (rollhub.rollout.seed_sources): fresh seeds in order, the checkpointed position,
and checkpoints that still carry the seed pool of the removed hard-seed replay."""

from __future__ import annotations

import json

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
