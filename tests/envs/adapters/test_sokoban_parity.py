"""Our Sokoban and GEM's agree move for move on GEM's rooms (rollhub.envs.adapters.parity)."""

from __future__ import annotations

import pytest

pytest.importorskip("gem")

from rollhub.envs.adapters.parity import sokoban_parity  # noqa: E402


@pytest.mark.parametrize(
    "gem_id, rooms",
    [
        ("gem:game:Sokoban-v0-easy", 12),
        # GEM's 8x8 rooms take ~15 s each to generate
        pytest.param("gem:game:Sokoban-v0-hard", 4, marks=pytest.mark.slow),
    ],
)
async def test_transitions_agree_on_the_same_rooms(gem_id, rooms):
    report = await sokoban_parity(gem_id, rooms=rooms, moves=25, seed=1)
    print(report)
    assert report["moves_compared"] >= rooms * 5
    assert report["board_agreement"] == report["refusal_agreement"] == report["solve_agreement"] == 1.0, report
