"""Wrappers registered by env kwarg: `make` applies them, kwargs are typed against the wrapper's
factory, every contract member forwards, and evaluation refuses a training-only one."""

from __future__ import annotations

import gymnasium
import pytest

import rollhub.envs as envs
from rollhub.core.errors import UserError
from rollhub.envs.arguments import typed_env_kwargs
from rollhub.envs.checker import check_env
from rollhub.envs.registry import _REGISTRY, register
from rollhub.envs.run_checks import check_run_envs
from rollhub.envs.sokoban.env import SokobanEnv
from rollhub.envs.wrappers import EnvWrapper, wrappers_of


class Tagged(EnvWrapper):
    """A wrapper that marks every observation, to see it is in the chain."""

    async def reset(self, *, seed=None, options=None):
        obs, info = await self.env.reset(seed=seed, options=options)
        return obs, {**info, "tagged": self.tag}


def tagged(env, tag: int):
    if not tag:
        return env
    wrapper = Tagged(env)
    wrapper.tag = tag
    return wrapper


@pytest.fixture
def tagged_id():
    register("test/Tagged-v0", SokobanEnv, wrappers={"tag": tagged}, gymnasium_compat=True, max_steps=7)
    yield "test/Tagged-v0"
    _REGISTRY.pop("test/Tagged-v0", None)
    gymnasium.registry.pop("test/Tagged-v0", None)


async def test_make_applies_a_wrapper_by_its_kwarg_and_members_forward(tagged_id):
    env = envs.make(tagged_id, tag=3, action_tag="")
    assert isinstance(env, Tagged) and env.setting == "tag" and env.spec.id == tagged_id
    assert (env.max_steps, env.action_tag, env.tools, env.chat_template_tools) == (7, "", None, False)
    _, info = await env.reset(seed=1)
    assert info["tagged"] == 3 and env.board is env.unwrapped.board  # the env's own attributes forward
    assert await check_env(env) == []
    assert type(envs.make(tagged_id, tag=0)) is SokobanEnv and wrappers_of(envs.make(tagged_id)) == []


def test_wrapper_kwargs_are_typed_and_named_in_errors(tagged_id):
    spec = envs.spec(tagged_id)
    assert typed_env_kwargs(spec, {"tag": 2, "dim": 6}) == {"tag": 2, "dim": 6}
    with pytest.raises(UserError, match="tag: expected int"):
        typed_env_kwargs(spec, {"tag": "2"})
    with pytest.raises(UserError, match="did you mean tag"):
        typed_env_kwargs(spec, {"tagg": 1})


def test_gymnasium_make_passes_wrapper_kwargs(tagged_id):
    env = gymnasium.make(tagged_id, tag=5)
    try:
        _, info = env.reset(seed=0)
        assert info["tagged"] == 5
    finally:
        env.close()


def test_evaluation_refuses_only_training_only_wrappers(tagged_id):
    check_run_envs(tagged_id, {"tag": 2}, tagged_id, {"tag": 2})  # a wrapper that is not training-only
    with pytest.raises(UserError, match="training-only"):
        check_run_envs("rollhub/Sokoban-v0", {}, "rollhub/Sokoban-v0", {"min_solution_steps": 3})
    check_run_envs("rollhub/Sokoban-v0", {"min_solution_steps": 3}, "rollhub/Sokoban-v0", {"min_solution_steps": 0})
