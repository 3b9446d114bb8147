"""`rollhub bench run-signal` on hand-written run folders: group outcome shares, shortfall turns
the group estimator cannot see, step metrics per window, and clear errors for bad input."""

import json

import pytest

from rollhub.bench.run_signal import group_outcome, shortfall_turns, window_rows
from rollhub.cli import main


def _turn(anchor, answer, reward):
    return {"anchor": {"__bytes__": anchor}, "response_text": answer, "reward": reward}


def _trajectory(group, success, turns, seed=None):
    trajectory = {"group_id": group, "success": success, "turns": turns}
    if seed is not None:
        trajectory["seed"] = seed
    return trajectory


def _write_run(path, trajectories, steps=(), config=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajectories))
    (path / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))


def test_outcome_kinds():
    assert group_outcome([{"success": True}, {"success": True}]) == "all_succeed"
    assert group_outcome([{"success": True}, {"success": False}]) == "mixed"
    assert group_outcome([{"success": False}, {"success": False}]) == "all_fail"


def test_a_mistake_every_sample_made_is_counted_as_agreed_and_a_disputed_one_is_not():
    group = [
        # both samples walk left at A (a shortfall they agree on), then differ at B
        _trajectory("g", True, [_turn("A", "left", -0.3), _turn("B", "up", 1.3)]),
        _trajectory("g", False, [_turn("A", "left", -0.3), _turn("B", "down", -0.3)]),
    ]
    total, agreed = shortfall_turns(group, bar=0.3)
    # the two left moves at A (agreed) and the down move at B (up was the alternative); the
    # solving up move is not a shortfall
    assert (total, agreed) == (3, 2)
    # a bar under every reward finds nothing
    assert shortfall_turns(group, bar=-1.0) == (0, 0)


def test_the_solving_move_is_never_a_shortfall_even_below_the_bar():
    group = [_trajectory("g", True, [_turn("A", "up", 0.0)]), _trajectory("g", True, [_turn("A", "up", 0.0)])]
    assert shortfall_turns(group, bar=0.3) == (0, 0)


def test_windows_split_groups_in_training_order_and_average_step_metrics(tmp_path, capsys):
    run = tmp_path / "run"
    trajectories = []
    for g in range(4):  # first half: all fail; second half: all succeed
        win = g >= 2
        for _ in range(2):
            trajectories.append(_trajectory(f"g{g}", win, [_turn("A", "up", 1.3 if win else -0.3)]))
    steps = [
        {"step": 1, "train/loss": 0.1, "batch/groups": 2, "batch/zero_advantage_groups": 0, "train/success_rate": 0.0},
        {"step": 2, "train/loss": 0.1, "batch/groups": 2, "batch/zero_advantage_groups": 2, "train/success_rate": 1.0},
        {"step": 2, "eval/success_rate": 0.5},  # an eval row is not a step
    ]
    _write_run(run, trajectories, steps, config={"algorithm": {"turn_bar_weight": 1.0, "turn_bar": 0.5}})
    out = tmp_path / "out"
    assert main(["bench", "run-signal", "--out", str(out), "--set", f"run={run}", "--set", "windows=2"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["bar"] == 0.5  # the run's own bar
    first, second = result["rows"]
    assert (first["all_fail"], first["all_succeed"]) == (1.0, 0.0)
    assert (second["all_fail"], second["all_succeed"]) == (0.0, 1.0)
    assert first["shortfall turns"] == 4 and first["shortfall where the group agreed"] == 1.0
    assert second["shortfall turns"] == 0
    assert first["zero-adv groups"] == 0.0 and second["zero-adv groups"] == 1.0
    assert first["train success"] == 0.0 and second["train success"] == 1.0
    assert (out / "run_signal.png").stat().st_size > 0


def test_every_window_has_a_row_even_without_step_metrics():
    groups = [[_trajectory("a", False, [])], [_trajectory("b", True, [])]]
    first, second = window_rows(groups, [], windows=2, bar=0.3)
    assert (first["all_fail"], second["all_succeed"], first["steps"]) == (1.0, 1.0, "-")
    assert "replayed groups" not in first


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "trajectories.jsonl"),
        (lambda p: _write_run(p, [_trajectory("g", True, [])]), "fewer than windows"),
        (lambda p: (p.mkdir(), (p / "trajectories.jsonl").write_text('{"group_id": "g"\n')), "not JSON"),
    ],
)
def test_bad_run_folders_are_one_line_errors(tmp_path, capsys, setup, message):
    run = tmp_path / "run"
    setup(run)
    assert main(["bench", "run-signal", "--out", str(tmp_path / "out"), "--set", f"run={run}"]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
