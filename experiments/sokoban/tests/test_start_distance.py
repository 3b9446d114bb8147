"""`python -m experiments.sokoban.start_distance` on run folders logged from real Sokoban resets:
each group's start is rebuilt from its first turn's anchor and solved, moved starts are told from
rooms as drawn, other envs get no start table, and replayed rooms are told from fresh ones."""

import asyncio
import json

import pytest

import rollhub.envs as envs
from experiments.sokoban.start_distance import add_replay_columns, distance_rows, is_sokoban, main, replay_marks
from rollhub.bench.run_signal import window_rows
from rollhub.envs import registry
from rollhub.envs.sokoban.env import SokobanEnv
from rollhub.envs.sokoban.grid import Board
from rollhub.envs.sokoban.solver import solve

ENV = "rollhub/Sokoban-v0"


async def _start(seed, **kwargs):
    env = envs.make(ENV, **kwargs)
    await env.reset(seed=seed)
    return env.board


def _group(name, seed, board, wins):
    turn = {"anchor": {"__bytes__": board.anchor().hex()}, "response_text": "up", "reward": 0.0}
    return [{"group_id": name, "seed": seed, "success": w, "turns": [turn]} for w in wins]


def test_an_anchor_rebuilds_its_board():
    board = asyncio.run(_start(3))
    assert Board.from_anchor(board.anchor()) == board
    with pytest.raises(ValueError, match="not a Sokoban anchor"):
        Board.from_anchor(b"\x06\x06\x01")


def test_groups_are_counted_by_their_starts_distance_and_outcome():
    boards = {seed: asyncio.run(_start(seed)) for seed in range(40)}
    length = {seed: len(solve(b)) for seed, b in boards.items()}
    a, b = sorted(boards, key=length.get)[0], sorted(boards, key=length.get)[-1]
    assert length[a] < length[b]
    groups = [
        _group("g1", a, boards[a], [True, True]),
        _group("g2", a, boards[a], [True, False]),
        _group("g3", b, boards[b], [False, False]),
    ]
    near, far = distance_rows(groups, ENV, {})
    assert (near["start"], near["moves to goal"], near["groups"]) == ("as drawn", length[a], 2)
    assert (near["success"], near["all_succeed"], near["mixed"], near["all_fail"]) == (0.75, 0.5, 0.5, 0.0)
    assert (far["moves to goal"], far["all_fail"], far["success"]) == (length[b], 1.0, 0.0)


def test_moved_starts_are_told_from_rooms_as_drawn():
    # a run with the start-state curriculum logged the seed's room and, for a moved start, another
    # position: here a shorter room of another seed stands for the moved start
    boards = {seed: asyncio.run(_start(seed)) for seed in range(40)}
    length = {seed: len(solve(b)) for seed, b in boards.items()}
    seed = max(boards, key=length.get)
    short = min(boards, key=length.get)
    drawn, moved = boards[seed], boards[short]
    assert length[short] < length[seed]
    kwargs = {"solution_start": 1.0, "solution_start_distance": [1, 2]}  # the arguments such a run saved
    groups = [_group("m", seed, moved, [True, True]), _group("d", seed, drawn, [False, False])]
    rows = {row["start"]: row for row in distance_rows(groups, ENV, kwargs)}
    assert rows["moved"]["moves to goal"] == length[short]
    assert rows["as drawn"]["moves to goal"] == length[seed]
    assert rows["moved"]["all_succeed"] == 1.0 and rows["as drawn"]["all_fail"] == 1.0


def _write(run, groups, env):
    run.mkdir()
    (run / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for g in groups for t in g))
    (run / "config.json").write_text(json.dumps({"env": env}))


@pytest.mark.parametrize("by_start, expect_table", [("all", True), ("last", True), ("none", False)])
def test_the_start_table_is_added_on_sokoban_runs_only(tmp_path, by_start, expect_table):
    board = asyncio.run(_start(1))
    groups = [_group(f"g{i}", 1, board, [i % 2 == 0, True]) for i in range(4)]
    for name, env in (("sokoban", {"id": ENV, "kwargs": {}}), ("other", {"id": "rollhub/Math-v0", "kwargs": {}})):
        run, out = tmp_path / name, tmp_path / f"out-{name}"
        _write(run, groups, env)
        args = ["--out", str(out), "--set", f"run={run}", "--set", "windows=2"]
        assert main([*args, "--set", f"by_start={by_start}"]) == 0
        result = json.loads((out / "result.json").read_text())
        has_table = "by_start" in result
        assert has_table == (expect_table and name == "sokoban")
        assert (out / "by_start.png").exists() == has_table
        assert [row["all_fail"] for row in result["rows"]] == [0.0, 0.0]  # run-signal's window table
        if has_table:
            (row,) = result["by_start"]
            assert row["groups"] == (4 if by_start == "all" else 2)


def test_a_bad_by_start_is_a_one_line_error(tmp_path, capsys):
    run = tmp_path / "run"
    _write(run, [_group("g", 1, asyncio.run(_start(1)), [True])], {"id": ENV})
    assert main(["--out", str(tmp_path / "o"), "--set", f"run={run}", "--set", "by_start=x"]) == 2
    error = capsys.readouterr().err
    assert "by_start must be one of" in error and "Traceback" not in error


def _played(name, seed, wins):
    turn = {"anchor": {"__bytes__": "0a"}, "response_text": "up", "reward": 0.0}
    return [{"group_id": name, "seed": seed, "success": win, "turns": [turn]} for win in wins]


def test_replays_are_told_from_fresh_rooms_by_seed_and_all_fail_rooms_followed():
    groups = [
        _played("a", 7, [False, False]),  # fresh, all fail
        _played("b", 8, [True, False]),  # fresh, mixed
        _played("c", 7, [True, False]),  # replay of the all-fail room 7, now solved once
        _played("d", 8, [False, False]),  # replay of the mixed room 8
        _played("e", 7, [False, False]),  # replay of room 7, all fail again
        _played("f", None, [False, False]),  # no seed: fresh
    ]
    assert replay_marks(groups) == ([False, False, True, True, True, False], [False, False, True, False, True, False])
    rows = window_rows(groups, [], windows=2, bar=0.3)
    add_replay_columns(rows, groups, windows=2)
    first, second = rows
    assert first["replayed groups"] == pytest.approx(1 / 3)
    assert first["all fail, fresh rooms"] == 0.5  # a fail, b mixed; the replay c is left out
    assert (first["replays of all-fail rooms"], first["... with a success"]) == (1, 1.0)
    assert second["replayed groups"] == pytest.approx(2 / 3)
    assert second["all fail, fresh rooms"] == 1.0  # only f is fresh
    assert (second["replays of all-fail rooms"], second["... with a success"]) == (1, 0.0)


def test_a_run_without_replay_reports_no_replay_columns():
    groups = [_played("a", 1, [False, False]), _played("b", 2, [True, True])]
    rows = window_rows(groups, [], windows=1, bar=0.3)
    add_replay_columns(rows, groups, windows=1)
    assert rows[0]["replayed groups"] == 0.0 and "all fail, fresh rooms" not in rows[0]


class _CostlySokoban(SokobanEnv):
    def __init__(self, **kwargs):
        raise AssertionError("built")  # stands for a constructor that loads games or starts containers


class _CostlyOther:
    def __init__(self, **kwargs):
        raise AssertionError("built")


def test_is_sokoban_reads_a_class_entry_point_without_building_it(monkeypatch):
    for env_id, entry in (
        ("test/CostlySokoban-v0", _CostlySokoban),
        ("test/CostlyOther-v0", _CostlyOther),
        ("test/SokobanFactory-v0", lambda **kw: SokobanEnv(**kw)),
    ):
        monkeypatch.setitem(registry._REGISTRY, env_id, registry.EnvSpec(id=env_id, entry_point=entry))
    assert is_sokoban("test/CostlySokoban-v0")  # answered from the class: its constructor would raise
    assert not is_sokoban("test/CostlyOther-v0")
    assert is_sokoban("test/SokobanFactory-v0")  # a factory is built to find out
    assert is_sokoban(ENV) and not is_sokoban("rollhub/Math-v0") and not is_sokoban("rollhub/NoSuch-v0")
