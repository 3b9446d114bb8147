"""`check_run_envs` builds cheap envs once, so a bad env value is a one-line error before any
model loads, and refuses an evaluation env with a training-only argument on (an easier reading
than the env's own distribution would be an inflated number nobody sees as an error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.trainer.build import check_run_envs
from rollhub.trainer.config import RunConfig

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "sokoban_6x6_2b.yaml"


def _config(*overrides: str) -> RunConfig:
    return load_config(RunConfig, None, ["env.id=rollhub/Sokoban-6x6-2b-v0", *overrides])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.kwargs={solution_start: 1.5}"], r"env.kwargs: solution_start must be in \[0, 1\]"),
        (["sft.env_kwargs={min_solution_steps: 99}"], "sft.env_kwargs: min_solution_steps must be in"),
        (["eval.env.kwargs={solution_start_distance: [0, 3]}"], "eval.env.kwargs: solution_start_distance must be"),
        (["env.kwargs={solution_start: 0.5}"], "eval.env.kwargs.solution_start is 0.5"),  # eval inherits it
        (["eval.env.kwargs={solution_start: 1.0}"], "evaluation would read an inflated success"),
    ],
)
def test_bad_values_and_training_only_eval_arguments_are_refused(overrides, message):
    with pytest.raises(UserError, match=message):
        check_run_envs(_config(*overrides))


def test_a_curriculum_for_training_with_evaluation_switched_off_passes():
    config = _config(
        "env.kwargs={solution_start: 0.75, solution_start_distance: [8, 12]}", "eval.env.kwargs={solution_start: 0}"
    )
    check_run_envs(config)
    assert config.env.kwargs["solution_start"] == 0.75 and config.eval.env.kwargs["solution_start"] == 0


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    code = main(
        [
            "train",
            str(RECIPE),
            "--set",
            f"run_dir={tmp_path}/run",
            "--set",
            "env.kwargs.solution_start=2",
        ]
    )
    error = capsys.readouterr().err
    assert code == 2 and "solution_start must be in [0, 1]" in error and "Traceback" not in error
    assert not (tmp_path / "run" / "sft_model").exists()
