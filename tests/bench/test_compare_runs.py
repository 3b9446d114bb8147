"""`rollhub bench compare-runs` on hand-written run folders: readings placed on the job's clock
(SFT time, then RL time, across a resume), the warm-start and the pick, and clear errors."""

import json

import pytest

from rollhub.bench.compare_runs import job_clock, read_run
from rollhub.cli import main


def _write_run(path, steps, *, sft_s=None, summary=None, sft=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    if sft_s is not None:
        (path / "sft_done.json").write_text(json.dumps({"demos": 8, "steps": 4, "final_loss": 0.1, "wall_s": sft_s}))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    if sft is not None:
        (path / "config.json").write_text(json.dumps({"sft": sft}))


def test_a_resumed_run_reads_as_one_clock():
    steps = [
        {"step": 1, "time/elapsed_s": 10.0},
        {"step": 2, "time/elapsed_s": 20.0},
        {"step": 3, "time/elapsed_s": 4.0},  # resumed: the clock restarted
        {"step": 4, "time/elapsed_s": 9.0},
    ]
    assert job_clock(steps) == {0: 0.0, 1: 10.0, 2: 20.0, 3: 24.0, 4: 29.0}


def test_readings_sit_at_the_minute_of_the_job_and_the_gain_is_final_minus_warm_start(tmp_path):
    run = tmp_path / "run"
    steps = [
        {"step": 0, "eval/success_rate": 0.5},
        {"step": 1, "time/elapsed_s": 60.0},
        {"step": 2, "time/elapsed_s": 120.0, "eval/success_rate": 0.7},
        {"step": 3, "time/elapsed_s": 180.0},
    ]
    summary = {"final_success_rate": 0.75, "selected_step": 3, "steps": 3, "wall_s": 420.0}
    _write_run(run, steps, sft_s=180.0, summary=summary, sft={"enabled": True, "episodes": 8, "epochs": 2.0})
    entry = read_run(run, "a", "eval/success_rate")
    assert [(p["step"], p["minute"]) for p in entry["curve"]] == [(0, 3.0), (2, 5.0)]
    assert entry["pick_minute"] == 6.0  # the picked step need not be a held-out reading
    row = entry["row"]
    assert row["warm-start"] == 0.5 and row["RL gain"] == pytest.approx(0.25)
    assert (row["SFT demos x epochs"], row["job min"]) == ("8 x 2", 10.0)  # 180 s of SFT + 420 s


def test_a_job_that_ran_its_own_sft_counts_it_once(tmp_path):
    run = tmp_path / "run"
    summary = {"final_success_rate": 0.6, "selected_step": 0, "wall_s": 420.0, "phases_s": {"sft_s": 180.0}}
    _write_run(run, [{"step": 0, "eval/success_rate": 0.5}], sft_s=180.0, summary=summary)
    assert read_run(run, "a", "eval/success_rate")["row"]["job min"] == 7.0


def test_the_command_writes_a_table_and_a_plot_for_each_run(tmp_path):
    runs = []
    for name, final in (("small", 0.9), ("large", 0.95)):
        run = tmp_path / name
        steps = [
            {"step": 0, "eval/success_rate": final - 0.1},
            {"step": 1, "time/elapsed_s": 30.0, "eval/success_rate": final},
        ]
        _write_run(run, steps, sft_s=60.0, summary={"final_success_rate": final, "selected_step": 1})
        runs.append(str(run))
    out = tmp_path / "out"
    args = ["bench", "compare-runs", "--out", str(out), "--set", f"runs=[{','.join(runs)}]", "--set", "budget_min=30"]
    assert main(args) == 0
    result = json.loads((out / "result.json").read_text())
    assert [row["run"] for row in result["rows"]] == ["small", "large"]
    assert [row["final (pick)"] for row in result["rows"]] == [0.9, 0.95]
    assert (out / "compare_runs.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "runs must name at least one run folder"),
        (["runs=[{run}]", "labels=[a,b]"], "labels has 2 entries for 1 runs"),
        (["runs=[{missing}]"], "has no metrics.jsonl"),
        (["runs=[{run}]", "metric=eval/nothing"], "has no 'eval/nothing' readings"),
        (["runs=[{run}]", "budget_min=-1"], "budget_min must be a positive number"),
    ],
)
def test_bad_input_is_one_line_not_a_traceback(tmp_path, capsys, overrides, message):
    run = tmp_path / "run"
    _write_run(run, [{"step": 0, "eval/success_rate": 0.5}])
    values = {"run": run, "missing": tmp_path / "missing"}
    sets = [item for o in overrides for item in ("--set", o.format(**values))]
    assert main(["bench", "compare-runs", "--out", str(tmp_path / "out"), *sets]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
