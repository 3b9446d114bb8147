"""`rollhub bench async ENV`: the real rollout path in lockstep and env-async mode on any env id."""

from __future__ import annotations

import json

from rollhub.cli import main


def test_bench_async_runs_both_modes_and_predicts_from_what_it_measured(tmp_path, capsys):
    out = tmp_path / "sokoban.json"
    argv = ["bench", "async", "rollhub/Sokoban-v0", "--quick", "--set", "engine=latency-model", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["engine"].startswith("SIMULATED latency-model engine")
    assert result["lockstep_batch_s"] > 0 and result["env_async_batch_s"] > 0
    assert len(result["batches_s"]["lockstep"]) == len(result["batches_s"]["env-async"]) == 1
    # Sokoban's steps take microseconds against the engine's generation: no gain is predicted
    assert result["generation_s_per_turn"] > 100 * result["env_step_p50_s"]
    assert 1.0 <= result["predicted_gain"] <= result["amdahl_bound"] < 1.05
    assert "measured gain" in capsys.readouterr().out


def test_bench_async_mistakes_are_one_line_errors(capsys):
    assert main(["bench", "async"]) == 2
    assert "needs an env id" in capsys.readouterr().err
    assert main(["bench", "async", "rollhub/Sokoban-v9"]) == 2
    assert "unknown env id" in capsys.readouterr().err
    assert main(["bench", "async", "rollhub/Sokoban-v0", "--set", "engine=vllm"]) == 2
    err = capsys.readouterr().err
    assert (
        "engine: 'vllm' is not allowed; choose one of 'tiny', 'latency-model'" in err
        and len(err.strip().splitlines()) == 1
    )
