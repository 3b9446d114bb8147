"""`check_run_envs` builds cheap envs once, so a bad env value is a one-line error before any
model loads, and refuses an evaluation env wrapped by a training-only wrapper (a reading on
another distribution than the env's own would be an altered number nobody sees as an error)."""

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
        (["env.kwargs={num_boxes: 0}"], "env.kwargs: num_boxes, max_steps and search_depth must all be >= 1"),
        (["sft.env_kwargs={min_solution_steps: 99}"], "sft.env_kwargs: min_solution_steps must be in"),
        (["eval.env.kwargs={min_solution_steps: 99}"], "eval.env.kwargs: min_solution_steps must be in"),
        (["env.kwargs={min_solution_steps: 8}"], "eval.env.kwargs.min_solution_steps is 8"),  # eval inherits it
        (["eval.env.kwargs={min_solution_steps: 8}"], "evaluation would read another distribution"),
    ],
)
def test_bad_values_and_training_only_eval_arguments_are_refused(overrides, message):
    with pytest.raises(UserError, match=message):
        check_run_envs(_config(*overrides))


def test_a_floor_for_training_with_evaluation_switched_off_passes():
    config = _config("env.kwargs={min_solution_steps: 8}", "eval.env.kwargs={min_solution_steps: 0}")
    check_run_envs(config)
    assert config.env.kwargs["min_solution_steps"] == 8 and config.eval.env.kwargs["min_solution_steps"] == 0


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    code = main(
        [
            "train",
            str(RECIPE),
            "--set",
            f"run_dir={tmp_path}/run",
            "--set",
            "env.kwargs.min_solution_steps=99",
        ]
    )
    error = capsys.readouterr().err
    assert code == 2 and "min_solution_steps must be in [0, " in error and "Traceback" not in error
    assert not (tmp_path / "run" / "sft_model").exists()
