"""`rollhub view` shows each episode's task, decoded with the run's tokenizer; the learning curve
draws evaluation readings as points with their n and Wilson 95% interval, baselines included."""

import html
import json

from rollhub.cli import main
from rollhub.core.intervals import wilson_interval
from rollhub.envs import make
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.agent import AgentConfig, run_episode
from rollhub.rollout.trajectory_log import RUN_TRAJECTORY_LOG, TrajectoryWriter
from rollhub.trainer.metrics import evaluation_readings, plot_learning_curve


async def _record_tiny_run(run_dir, model_dir, seeds):
    """A run folder as `rollhub train` leaves it: config.json naming the model, and trajectories
    played by the tiny model, logged without their text (only token ids keep the task)."""
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"model": {"path": str(model_dir)}}))
    engine = HFEngine(model_dir, threads=1, max_batch_size=4)
    boards = []
    try:
        with TrajectoryWriter(run_dir / RUN_TRAJECTORY_LOG, include_text=False) as writer:
            for seed in seeds:
                env = make("rollhub/Sokoban-v0", max_steps=2)
                observation, _ = await env.reset(seed=seed)
                boards.append(observation[-1]["content"])
                config = AgentConfig(system_prompt="Push the box.", max_new_tokens=4)
                trajectory = await run_episode(env, engine, engine.tokenizer, config, seed)
                await env.close()
                writer.write(trajectory)
    finally:
        await engine.close()
    return boards


async def test_view_shows_each_episodes_task_decoded(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    boards = await _record_tiny_run(run, tiny_model_dir, seeds=[1, 2])
    assert boards[0] != boards[1]
    record = json.loads((run / RUN_TRAJECTORY_LOG).read_text().splitlines()[0])
    assert "observation" not in record["turns"][0]  # the task is only in the token ids
    assert main(["view", str(run)]) == 0
    page = (run / "trajectories.html").read_text()
    for board in boards:
        assert html.escape(board) in page
    assert "Push the box." in page
    capsys.readouterr()
    assert main(["view", str(run), "--text"]) == 0
    text = capsys.readouterr().out
    assert all(row in text for row in boards[0].splitlines()) and "task:" in text


async def test_view_without_a_tokenizer_says_how_to_get_one(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    await _record_tiny_run(run, tiny_model_dir, seeds=[1])
    (run / "config.json").write_text(json.dumps({"model": {"path": str(tmp_path / "gone")}}))
    assert main(["view", str(run), "--text"]) == 0
    assert "--tokenizer MODEL_DIR" in capsys.readouterr().out
    assert main(["view", str(run), "--tokenizer", str(tmp_path / "gone")]) == 2


def test_curve_readings_are_points_with_n_and_wilson_interval(tmp_path):
    records = [
        {"step": 0, "eval/success_rate": 0.2, "eval/no_tool/success_rate": 0.1, "eval/infra_failures": 0},
        {"step": 1, "train/success_rate": 0.3},
        {"step": 2, "train/success_rate": 0.4},
        {"step": 2, "eval/success_rate": 0.5, "eval/infra_failures": 2, "eval/no_tool/success_rate": 0.15},
    ]
    readings = evaluation_readings(records, eval_seeds=10, samples_per_seed=2)
    assert set(readings) == {"eval/success_rate", "eval/no_tool/success_rate"}
    first, last = readings["eval/success_rate"]
    assert (first["step"], first["n"]) == (0, 20) and (last["step"], last["n"]) == (2, 18)
    assert (first["low"], first["high"]) == wilson_interval(4, 20)
    assert last["low"] < 0.5 < last["high"]
    assert [p["success_rate"] for p in readings["eval/no_tool/success_rate"]] == [0.1, 0.15]
    png = plot_learning_curve(records, tmp_path / "curve.png", eval_seeds=10, samples_per_seed=2)
    assert png is not None and png.stat().st_size > 0
    assert json.loads((tmp_path / "curve.json").read_text()) == json.loads(json.dumps(readings))


def test_curve_draws_readings_as_error_bars_not_a_line(tmp_path, monkeypatch):
    import matplotlib.axes

    lines, bars = [], []
    real_plot, real_errorbar = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(
        matplotlib.axes.Axes, "plot", lambda self, *a, **kw: lines.append(kw.get("label")) or real_plot(self, *a, **kw)
    )
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "errorbar",
        lambda self, x, y, **kw: bars.append((list(x), list(y), kw)) or real_errorbar(self, x, y, **kw),
    )
    records = [{"step": 0, "eval/success_rate": 0.2}, {"step": 4, "eval/success_rate": 0.6}]
    plot_learning_curve(records, tmp_path / "curve.png", eval_seeds=20)
    assert "eval/success_rate" not in lines  # no line joins two readings
    (xs, ys, kw), *_ = bars
    assert xs == [0, 4] and ys == [0.2, 0.6] and kw["linestyle"] == "none" and kw["yerr"] is not None
    assert "n=20" in kw["label"] and "95%" in kw["label"]
