"""`python -m experiments.sokoban.gain_readings` on a hand-written run record: each run's two gains, the bar on
each split, the spread of their difference, and clear errors for bad input."""

import json

import pytest

from experiments.sokoban.gain_readings import main, read_gains


def _run(held, diag):
    return {
        "summary": {"warmstart_success_rate": held[0], "final_success_rate": held[1]},
        "diagnostic": {"sft_T1": diag[0], "final_T1": diag[1]},
    }


def _record(tmp_path, runs):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    return path


def test_gains_are_points_and_the_draw_noise_shrinks_with_more_draws():
    row = read_gains("a", _run((0.8, 0.92), (0.84, 0.93)))
    assert row["held-out gain"] == pytest.approx(12.0)
    assert row["diagnostic gain"] == pytest.approx(9.0)
    assert row["difference"] == pytest.approx(3.0)
    # 400 draws against 2000 at similar rates: the held-out gain is about sqrt(5) times noisier
    assert 2.0 < row["held-out draw sd"] / row["diagnostic draw sd"] < 2.6


def test_a_run_missing_a_reading_is_not_a_row():
    assert read_gains("a", {"summary": {"warmstart_success_rate": 0.8, "final_success_rate": 0.9}}) is None
    assert read_gains("a", _run((0.8, None), (0.8, 0.9))) is None
    assert read_gains("a", _run((0.8, 1.7), (0.8, 0.9))) is None  # not a success rate
    assert read_gains("a", _run((0.8, 0.9), (True, 0.9))) is None  # a flag, not a reading


def test_the_command_judges_each_split_and_measures_the_spread(tmp_path):
    runs = {
        "passes-both": _run((0.80, 0.92), (0.83, 0.94)),
        "passes-held-out-only": _run((0.79, 0.93), (0.83, 0.91)),
        "fails-both": _run((0.90, 0.95), (0.93, 0.96)),
        "no-diagnostic": {"summary": {"warmstart_success_rate": 0.8, "final_success_rate": 0.9}},
    }
    out = tmp_path / "out"
    assert main(["--out", str(out), "--set", f"records={_record(tmp_path, runs)}"]) == 0
    result = json.loads((out / "result.json").read_text())
    rows = {row["run"]: row for row in result["rows"]}
    assert set(rows) == {"passes-both", "passes-held-out-only", "fails-both"}
    assert (rows["passes-both"]["passes held-out"], rows["passes-both"]["passes diagnostic"]) == (True, True)
    assert (rows["passes-held-out-only"]["passes held-out"], rows["passes-held-out-only"]["passes diagnostic"]) == (
        True,
        False,
    )
    assert (rows["fails-both"]["passes held-out"], rows["fails-both"]["passes diagnostic"]) == (False, False)
    summary = result["summary"]
    assert (summary["runs"], summary["pass held-out"], summary["pass diagnostic"], summary["verdicts differ"]) == (
        3,
        2,
        1,
        1,
    )
    # differences 1, 6, 2 points: mean 3, sample sd sqrt(7)
    assert summary["mean difference (held-out - diagnostic), points"] == pytest.approx(3.0)
    assert summary["sd of the difference, points"] == pytest.approx(7**0.5, abs=0.01)
    assert (out / "gain_readings.png").stat().st_size > 0


def test_a_higher_bar_fails_a_run_the_default_passes(tmp_path):
    record = _record(tmp_path, {"a": _run((0.80, 0.92), (0.83, 0.94))})
    out = tmp_path / "out"
    assert main(["--out", str(out), "--set", f"records={record}", "--set", "bar=12.5"]) == 0
    assert json.loads((out / "result.json").read_text())["rows"][0]["passes held-out"] is False


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["records={missing}"], "does not exist"),
        (["records={record}", "runs=[nope]"], "has no run named 'nope'"),
        (["records={record}", "runs=[partial]"], "lacks a held-out or a diagnostic reading"),
        (["records={only_partial}"], "no run in"),
        (["records={not_json}"], "is not a run record"),
        (["records={record}", "bar=0"], "bar must be a gain in points"),
    ],
)
def test_bad_input_is_one_line_not_a_traceback(tmp_path, capsys, overrides, message):
    partial = {"summary": {"warmstart_success_rate": 0.8, "final_success_rate": 0.9}}
    record = _record(tmp_path, {"a": _run((0.8, 0.9), (0.8, 0.9)), "partial": partial})
    only_partial = tmp_path / "only.json"
    only_partial.write_text(json.dumps({"runs": {"partial": partial}}))
    not_json = tmp_path / "bad.json"
    not_json.write_text("{ not json")
    values = {
        "missing": tmp_path / "missing.json",
        "record": record,
        "only_partial": only_partial,
        "not_json": not_json,
    }
    sets = [item for o in overrides for item in ("--set", o.format(**values))]
    assert main(["--out", str(tmp_path / "out"), *sets]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
