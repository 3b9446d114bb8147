"""`sft.env_kwargs`: the demonstrations' env arguments laid over the training env's.

Why it exists: a training-only difficulty floor (`min_solution_steps`) should not thin out the
demonstrations, which teach every room.
"""

from __future__ import annotations

import pytest

from rollhub.core.config import load_config
from rollhub.trainer.build import check_run_envs, make_sft_env_factory
from rollhub.trainer.config import RunConfig


def sokoban_config(*overrides: str) -> RunConfig:
    return load_config(
        RunConfig,
        None,
        [
            "env.id=rollhub/Sokoban-v0",
            "env.kwargs={dim: 6, num_boxes: 1, max_steps: 10, min_solution_steps: 6}",
            "eval.env.kwargs={min_solution_steps: 0}",  # evaluation plays the env unwrapped
            *overrides,
        ],
    )


async def test_demo_envs_take_sft_env_kwargs_over_the_training_ones():
    config = sokoban_config("sft.env_kwargs={min_solution_steps: 0}")
    check_run_envs(config)
    demo_env, train_kwargs = make_sft_env_factory(config)(), config.env.kwargs
    assert train_kwargs["min_solution_steps"] == 6 and demo_env is demo_env.unwrapped  # no floor
    lengths = []
    for seed in range(40):
        await demo_env.reset(seed=seed)
        lengths.append(demo_env.distance_to_go(demo_env.board))
    assert min(lengths) < 6  # easy rooms come back for the demos only


async def test_without_sft_env_kwargs_demos_use_the_training_env():
    config = sokoban_config()
    env = make_sft_env_factory(config)()
    assert env.minimum == 6 and env.training_only  # the floor's wrapper


def test_bad_sft_env_kwargs_are_refused_before_any_model_loads():
    config = sokoban_config("sft.env_kwargs={no_such_argument: 1}")
    with pytest.raises(Exception, match="no_such_argument"):
        check_run_envs(config)
