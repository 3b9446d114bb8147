"""`python -m experiments.sokoban.sokoban_failures`: the episode classifier on hand-made action sequences (real
SokobanEnv, hand-drawn and generated rooms), and the whole bench on a tiny random model."""

import asyncio
import json

import pytest
import torch

from experiments.sokoban.sokoban_failures import OUTCOMES, analyse_episode, main
from rollhub.envs.sokoban.env import SokobanEnv
from rollhub.envs.sokoban.grid import MOVES
from rollhub.envs.sokoban.solver import solve

# the main recipe's env (configs/sokoban_tiny.yaml)
KWARGS = dict(dim=6, num_boxes=1, max_steps=10, reward="sparse", observation="grid+positions", action_tag="")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _analyse(actions, *, seed=0, board=None, end_on_deadlock=True):
    env = SokobanEnv(**KWARGS, end_on_deadlock=end_on_deadlock)
    options = {"board": board} if board else None
    return asyncio.run(analyse_episode(env, seed, actions, options=options))


def _start(seed):
    env = SokobanEnv(**KWARGS)
    asyncio.run(env.reset(seed=seed))
    return env.board


def _seed_with_wall_move(max_d0=8):
    """A held-out seed whose start board has a move into a wall and a plan short enough to add one."""
    for seed in range(1_000_000, 1_000_050):
        board = _start(seed)
        walls = [m for m in MOVES if board.try_move(m)[0] is None]
        plan = solve(board)
        if walls and len(plan) <= max_d0:
            return seed, walls[0], plan
    raise AssertionError("no seed with a wall move at the start")


def test_the_solver_plan_is_solved_with_no_waste():
    for seed in range(1_000_000, 1_000_005):
        plan = solve(_start(seed))
        result = _analyse(plan, seed=seed)
        assert result.outcome == "solved"
        assert result.d0 == len(plan) and result.steps == len(plan)
        assert sum(result.wasted.values()) == 0 and result.first_error is None
        assert all(m.kind == "optimal" and m.on_path and m.on_solver_plan for m in result.moves)


def test_a_wall_move_then_the_plan_wastes_one_move_and_leaves_the_path():
    seed, wall, plan = _seed_with_wall_move()
    result = _analyse([wall, *plan], seed=seed)
    assert result.outcome == "solved"
    assert result.wasted == {"invalid": 1, "format": 0, "away": 0, "equal": 0}
    first = result.first_error
    assert first.step == 0 and first.kind == "invalid" and first.on_path and first.on_solver_plan
    # the same boards one step late: no longer on a shortest path, and the prompt said "Invalid: ..."
    after = result.moves[1]
    assert after.kind == "optimal" and not after.on_path and not after.on_solver_plan and after.after_rejected
    assert not any(m.after_rejected for m in result.moves[2:])


def test_pushes_into_dead_cells_are_sorted_by_kind():
    # the box (row 1) is pushed left into the top-left corner; its target is on its right
    corner = "######\n#_XS_#\n#____#\n#____#\n#____#\n######"
    # the box is pushed up against the top wall, away from corners; the target is in the bottom row
    wall = "######\n#____#\n#_X__#\n#_P__#\n#___O#\n######"
    # two boxes side by side along the top wall: each cell is live alone, together they cannot move
    frozen = "######\n#OX_O#\n#__X_#\n#__P_#\n#____#\n######"
    for board, action, kind in (
        (corner, "left", "dead_corner"),
        (wall, "up", "dead_wall"),
        (frozen, "up", "dead_other"),
    ):
        result = _analyse([action], board=board)
        assert result.outcome == kind, board
        assert result.dead_step == 0 and result.wasted["away"] == 1 and result.first_error.kind == "away"
    # without end_on_deadlock the episode goes on, but it is dead from that push: later moves are not counted
    result = _analyse(["up", "down", "down", "down"], board=wall, end_on_deadlock=False)
    assert result.outcome == "dead_wall" and result.steps == 1


def test_horizon_and_format_errors():
    seed, wall, _ = _seed_with_wall_move()
    result = _analyse([wall] * 10, seed=seed)  # max_steps wall moves: cut off, the box still live
    assert result.outcome == "horizon_live" and result.wasted["invalid"] == 10
    assert [m.on_path for m in result.moves] == [True] + [False] * 9
    result = _analyse([wall] * 9 + ["jump"], seed=seed)
    assert result.outcome == "format_error" and result.wasted["format"] == 1
    with pytest.raises(ValueError, match="ended after 10 of 11"):
        _analyse([wall] * 11, seed=seed)


def test_bench_on_a_tiny_model(tmp_path):
    from rollhub.inference.models import init_tiny_model

    model = init_tiny_model(tmp_path / "model", "5m", seed=0)
    out = tmp_path / "failures.json"
    sets = [f"models={model}", "seeds=3", "samples_per_seed=2", f"out={out}", "progress=false"]
    assert main([*[x for s in sets for x in ("--set", s)]]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").exists()
    assert "held-out evaluation seeds [1000000, 1000003)" in result["split"]
    summary = result["models"][str(model)]
    assert summary["episodes"] == 6 == len(result["episodes"][str(model)])
    assert summary["infra_failures"] == 0 and summary["replay_mismatches"] == 0
    assert sum(summary["outcome_shares"].values()) == pytest.approx(1.0)
    assert sum(summary["outcome_counts"].values()) == 6 and set(summary["outcome_counts"]) == set(OUTCOMES)
    assert sum(b["n"] for b in summary["success_by_d0"].values()) == 6
    # greedy: one sample per seed whatever samples_per_seed says (the repeats would be identical);
    # an explicit --out DIR writes DIR/result.json as the other benchmarks do
    sets = [f"models={model}", "seeds=3", "samples_per_seed=4", "temperature=0", "progress=false"]
    out_dir = tmp_path / "greedy"
    assert main(["--out", str(out_dir), *[x for s in sets for x in ("--set", s)]]) == 0
    greedy = json.loads((out_dir / "result.json").read_text())
    assert greedy["models"][str(model)]["episodes"] == 3


def test_bench_refuses_a_missing_model(tmp_path, capsys):
    assert main(["--set", f"models={tmp_path / 'nope'}", "--set", "progress=false"]) != 0
    assert "not a model folder" in capsys.readouterr().err


def test_rooms_are_sorted_by_their_samples_and_all_failed_rooms_by_first_error():
    from experiments.sokoban.sokoban_failures import EpisodeAnalysis, Move, room_outcomes

    def episode(seed, solved, d0=6, first=None):
        moves = [Move(step=0, kind="optimal", on_path=True, on_solver_plan=True, after_rejected=False)]
        if first:
            moves.append(Move(step=first[0], kind=first[1], on_path=True, on_solver_plan=True, after_rejected=False))
        waste = dict.fromkeys(("invalid", "format", "away", "equal"), 0)
        return EpisodeAnalysis(seed, "solved" if solved else "horizon_live", d0, 10, waste, moves)

    episodes = [
        *[episode(1, True) for _ in range(4)],  # all solved
        episode(2, True),
        episode(2, False, first=(1, "invalid")),  # mixed
        episode(3, False, d0=8, first=(1, "away")),
        episode(3, False, d0=8, first=(3, "away")),  # all failed
        episode(4, False, d0=6, first=(1, "invalid")),  # all failed, one sample
    ]
    rooms = room_outcomes(episodes)
    assert rooms["rooms"] == 4 and rooms["samples_per_room"] == 4
    assert (rooms["all_solved"], rooms["mixed"], rooms["all_failed"]) == (0.25, 0.25, 0.5)
    hard = rooms["all_failed_rooms"]
    assert hard["n"] == 2 and hard["mean_d0"] == 7.0  # one d0 per room, not per episode
    # the mixed room's invalid first error is not an all-failed room's
    assert hard["first_error_kind_shares"]["away"] == pytest.approx(2 / 3)
    assert hard["first_error_mean_step"] == pytest.approx(5 / 3)
