"""Every long phase shows on the job's bars: SFT, the readings, RL (with why it stopped early);
other libraries' bars stay quiet; a reading that only had infra failures says so, never 0%."""

import asyncio
import io

from rich.console import Console
from trainer_testing import tiny_recipe

from rollhub.core.config import load_config
from rollhub.rollout.types import Trajectory, TrajectoryStatus
from rollhub.trainer.config import RunConfig
from rollhub.trainer.evaluate import EvalResult
from rollhub.trainer.job import run_training
from rollhub.trainer.progress import JobProgress


def test_every_phase_has_a_bar_and_rl_says_why_it_stopped(tiny_model_dir, tmp_path, capsys):
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        sft={"enabled": True, "episodes": 2, "batch_size": 4},
        train={"steps": 6, "checkpoint_every": 0, "max_wall_s": 0.001},  # stops after the first step
        eval={"episodes": 2},
    )
    config = load_config(RunConfig, recipe)
    screen = io.StringIO()
    display = JobProgress(console=Console(file=screen, width=200, force_terminal=False))
    summary = asyncio.run(run_training(config, progress=display, print_fn=lambda _: None))
    assert summary.steps == 1
    lines = screen.getvalue().splitlines()

    def bar(name: str) -> str:
        found = [line for line in lines if line.startswith(name + " ")]
        assert found, f"no '{name}' bar in:\n" + "\n".join(lines)
        return found[-1]

    assert "2/2" in bar("SFT demos") and "solved " in bar("SFT demos")
    assert "loss" in bar("SFT")
    assert "2/2" in bar("eval warmstart") and "success 0/2" in bar("eval warmstart")
    assert "2/2" in bar("eval final")
    rl = bar("RL")
    assert "1/6" in rl and "stopped: train.max_wall_s=0.001 reached after 1 of 6 steps" in rl
    # transformers' own bars (one per weight load and save) stay off the terminal
    assert "Loading weights" not in capsys.readouterr().err


def test_a_reading_of_only_infra_failures_is_not_reported_as_zero_percent():
    def failed(seed: int) -> Trajectory:
        episode = Trajectory(env_id="rollhub/Sokoban-v0", seed=seed, status=TrajectoryStatus.INFRA_FAILED)
        episode.infra_error = "SGLangError('server at http://127.0.0.1:30000 refused')"
        return episode

    reading = EvalResult(0.0, 0.0, 0.0, 0.0, 0.0, infra_failures=3, trajectories=[failed(s) for s in range(3)])
    assert reading.all_infra_failed
    assert reading.describe() == (
        "all 3 episodes failed for infra reasons: SGLangError('server at http://127.0.0.1:30000 refused')"
    )
    assert "infra_reason" not in reading.metrics()  # metrics stay numbers
    scored = Trajectory(env_id="rollhub/Sokoban-v0", seed=9)
    mixed = EvalResult(0.0, 0.0, 0.0, 0.0, 0.0, infra_failures=1, trajectories=[failed(0), scored])
    assert not mixed.all_infra_failed and mixed.describe() == "0.0%"
