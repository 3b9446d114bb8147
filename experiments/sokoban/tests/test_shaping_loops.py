"""`python -m experiments.sokoban.shaping_loops`: the exact loop search on hand-made graphs, on a hand-drawn
room with a known farmable loop under the first (per-move) clip, on rewards built to be farmable,
and the whole bench on the main recipe's rooms."""

import asyncio
import json

import numpy as np
import pytest

from experiments.sokoban.shaping_loops import main, paying_loop, price_edges, state_graph
from rollhub.envs.sokoban.env import SokobanEnv

# pushing the box up costs 3 moves; the first, per-move clip priced that push at -k, so each 10-move
# lap that pushes it back down paid +2k (tests/envs/sokoban/test_sokoban_env.py plays it)
LOOP_ROOM = "\n".join(["######", "##___#", "#____#", "#__X_#", "#O_P_#", "######"])
# two boxes, one already on its target: pushing it off and back on is a loop of the room
TWO_BOX_ROOM = "\n".join(["#######", "#_____#", "#__*__#", "#_P___#", "#___X_#", "#_O___#", "#######"])


def _graph(edges):
    src, dst, weight = (np.array(column) for column in zip(*edges))
    n = int(max(src.max(), dst.max())) + 1
    return n, src.astype(np.int64), dst.astype(np.int64), weight.astype(float)


def test_a_positive_cycle_is_found_and_it_is_a_cycle():
    # 0 -> 1 -> 2 -> 0 sums to +0.5; a dead end 2 -> 3 and a tail 4 -> 0
    n, src, dst, w = _graph([(0, 1, 1.0), (1, 2, -2.0), (2, 0, 1.5), (2, 3, 5.0), (4, 0, 7.0)])
    loop = paying_loop(n, src, dst, w)
    assert loop is not None
    assert w[loop].sum() == pytest.approx(0.5)
    # consecutive edges chain and the last returns to the first's source
    for a, b in zip(loop, loop[1:] + loop[:1]):
        assert dst[a] == src[b]


@pytest.mark.parametrize(
    "edges",
    [
        [(0, 1, 1.0), (1, 2, -2.0), (2, 0, 1.0)],  # a cycle summing to exactly 0 pays nothing
        [(0, 1, 3.0), (1, 2, 4.0), (2, 3, 5.0)],  # large rewards on a path, no cycle at all
        [(0, 0, -0.1), (0, 1, 2.0), (1, 0, -2.5)],  # negative self-loop and negative cycle
    ],
)
def test_no_positive_cycle_means_none(edges):
    assert paying_loop(*_graph(edges)) is None


def test_a_long_positive_cycle_is_found():
    # a 300-node ring whose edges lose 1 each except one that pays 300.5: the loop pays 1.5
    ring = [(i, (i + 1) % 300, -1.0) for i in range(1, 300)] + [(0, 1, 300.5)]
    n, src, dst, w = _graph(ring)
    loop = paying_loop(n, src, dst, w)
    assert loop is not None and len(loop) == 300
    assert w[loop].sum() == pytest.approx(1.5)


async def _room(progress_clip: bool, level: str = LOOP_ROOM, **kwargs):
    env = SokobanEnv(
        reward="sparse", progress_reward=1.0, progress_clip=progress_clip, action_tag="", max_steps=40, **kwargs
    )
    await env.reset(options={"board": level})
    return env, state_graph(env, env.board, max_states=10_000)


def test_the_per_move_clip_pays_a_loop_in_the_hand_drawn_room_and_the_env_pricing_does_not():
    env, graph = asyncio.run(_room(progress_clip=True))
    assert graph.complete and len(graph.boards) > 10
    reward, residual = price_edges(env, graph, "clip-every-move", 1.0)
    loop = paying_loop(len(graph.boards), graph.src, graph.dst, residual)
    assert loop is not None and reward[loop].sum() > 0
    # the lap really is a loop of the env: play it and come back, with the old clip's price
    start = graph.boards[int(graph.src[loop[0]])]
    assert start.after([graph.moves[e] for e in loop]).anchor() == start.anchor()
    for clip in (False, True):
        env, graph = asyncio.run(_room(progress_clip=clip))
        reward, residual = price_edges(env, graph, "recipe", 1.0)
        assert paying_loop(len(graph.boards), graph.src, graph.dst, residual) is None
        # the env's own rewards, not the residuals, agree: searching them finds no loop either
        assert paying_loop(len(graph.boards), graph.src, graph.dst, reward) is None


@pytest.mark.parametrize(
    "level,kwargs,farmable",
    [
        (LOOP_ROOM, {"invalid_reward": 0.05}, True),  # a wall move that pays: a one-move loop
        (TWO_BOX_ROOM, {"box_off_target_reward": 0.5}, True),  # push a box off its target, and back
        (TWO_BOX_ROOM, {"box_on_target_reward": 0.5, "box_off_target_reward": -0.5}, False),  # gym-sokoban's, balanced
        (TWO_BOX_ROOM, {"step_reward": -0.1, "box_on_target_reward": 1.0, "box_off_target_reward": -1.0}, False),
    ],
)
def test_a_farmable_preset_is_caught(level, kwargs, farmable):
    env, graph = asyncio.run(_room(progress_clip=True, level=level, **kwargs))
    reward, residual = price_edges(env, graph, "recipe", 1.0)
    loop = paying_loop(len(graph.boards), graph.src, graph.dst, residual)
    assert (loop is not None) == farmable
    if farmable:
        assert reward[loop].sum() > 0


def test_the_bench_on_the_main_recipe(tmp_path):
    out = tmp_path / "out"
    assert main(["--quick", "--out", str(out), "--set", "progress=false"]) == 0
    result = json.loads((out / "result.json").read_text())
    rows = {row["pricing"]: row for row in result["rows"]}
    assert set(rows) == {"recipe", "potential", "dead-clip", "clip-every-move"}
    assert all(row["rooms"] == 3 and row["skipped"] == 0 for row in rows.values())
    for pricing in ("recipe", "potential", "dead-clip"):
        assert rows[pricing]["paying loop"] == 0
    # seeds 0-2 of the main recipe's training rooms hold loops the old clip paid
    assert rows["clip-every-move"]["paying loop"] >= 1 and rows["clip-every-move"]["lap / k"] >= 1
    assert rows["dead-clip"]["above potential"] > rows["potential"]["above potential"] == 0
    assert (out / "shaping_loops.png").stat().st_size > 0


def test_bad_options_are_user_errors(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["--out", out, "--set", "pricings=potential,nonsense"]) != 0
    assert main(["--out", out, "--set", "recipes=configs/nope.yaml"]) != 0
    err = capsys.readouterr().err
    assert "nonsense" in err and "nope.yaml" in err
    assert "Traceback" not in err
