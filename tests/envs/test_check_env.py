"""check_env on every registered env that can run here, and on envs that break the rules."""

import numpy as np
import pytest

import rollhub.envs as envs
from rollhub.envs.base import Env, extract_action, invalid_step_info
from rollhub.envs.checker import EnvCheckError, check_env, missing_requirements

SPECS = envs.all_specs()


@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
async def test_every_registered_env_passes_check_env(spec):
    missing = missing_requirements(spec)
    if missing:
        pytest.skip(f"{spec.id} needs what this machine lacks: {'; '.join(missing)}")
    warnings = await check_env(spec.id)
    assert isinstance(warnings, list)


def test_builtin_ids_are_registered():
    ids = {s.id for s in SPECS}
    assert {"rollhub/Sokoban-v0", "rollhub/Math-v0"} <= ids
    assert any(i.startswith("rollhub/Sokoban-") and i != "rollhub/Sokoban-v0" for i in ids)


class GuessEnv(Env):
    """A well-behaved toy env (guess a number); subclasses break one rule each."""

    max_steps = 4
    hackability_note = "a guessing game: any constant guess wins one game in ten"

    def __init__(self):
        self.rng = np.random.default_rng()
        self.secret = 0

    async def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.secret = int(self.rng.integers(10))
        self.steps = 0
        return [{"role": "user", "content": "guess 0-9"}], {"anchor": self.secret, "success": False}

    async def step(self, action):
        self.steps += 1
        guess = extract_action(action, "action")
        truncated = self.steps >= self.max_steps
        if guess is None or not guess.isdigit():
            return (
                [{"role": "user", "content": "say <action>N</action>"}],
                0.0,
                False,
                truncated,
                invalid_step_info(self.secret, "bad", format_ok=guess is not None),
            )
        won = int(guess) == self.secret
        info = {"anchor": self.secret, "success": won, "action_valid": True, "format_ok": True}
        return [{"role": "user", "content": "yes" if won else "no"}], float(won), won, truncated and not won, info

    def random_action(self, rng):
        return f"<action>{int(rng.integers(10))}</action>"


class UnseededEnv(GuessEnv):
    async def reset(self, *, seed=None, options=None):
        # Ignores the seed. The secret comes from a huge range so that two unseeded resets
        # cannot coincide by chance (with 0-9 they did in 1 run out of 10, and CI failed).
        obs, info = await super().reset(seed=None)
        self.secret = int(np.random.default_rng().integers(10, 2**62))
        return obs, {**info, "anchor": self.secret}


class RaisingEnv(GuessEnv):
    async def step(self, action):
        if extract_action(action, "action") is None:
            raise ValueError("cannot parse")
        return await super().step(action)


class NeverEndingEnv(GuessEnv):
    async def step(self, action):
        obs, reward, _, _, info = await super().step(action)
        return obs, reward, False, False, info


class BadTypesEnv(GuessEnv):
    async def step(self, action):
        obs, reward, terminated, truncated, info = await super().step(action)
        return (
            "text, not messages",
            str(reward),
            terminated,
            truncated,
            {k: v for k, v in info.items() if k != "format_ok"},
        )


class FragileCloseEnv(GuessEnv):
    async def close(self):
        if getattr(self, "closed", False):
            raise RuntimeError("closed twice")
        self.closed = True


async def test_a_conforming_env_passes():
    assert await check_env(GuessEnv()) == []


@pytest.mark.parametrize(
    "env_cls,message",
    [
        (UnseededEnv, "not deterministic"),
        (RaisingEnv, "unparseable action raised ValueError"),
        (NeverEndingEnv, "neither terminated nor truncated"),
        (BadTypesEnv, "list of chat messages"),
        (FragileCloseEnv, "not idempotent"),
    ],
)
async def test_broken_envs_are_caught(env_cls, message):
    with pytest.raises(EnvCheckError, match=message):
        await check_env(env_cls())


class ToolsAsTextEnv(GuessEnv):
    tools = "guess(n)"  # not a list of tool specs


class TemplateToolsWithoutToolsEnv(GuessEnv):
    chat_template_tools = True


class TaskListOfNamesEnv(GuessEnv):
    def task_set(self):
        return ["game-1", "game-2"]  # a list, not key -> name


class DrawsUnaskedKeysEnv(GuessEnv):
    def could_draw(self, keys):
        return set(keys) | {"a task nobody asked about"}


class StepLimitAsTextEnv(GuessEnv):
    max_steps = "4"


@pytest.mark.parametrize(
    "env_cls,message",
    [
        (ToolsAsTextEnv, "tools must be None or a non-empty list"),
        (TemplateToolsWithoutToolsEnv, "chat_template_tools is True but the env declares no tools"),
        (TaskListOfNamesEnv, r"task_set\(\) must return None or a dict"),
        (DrawsUnaskedKeysEnv, r"could_draw\(keys\) must return None or a subset of keys"),
        (StepLimitAsTextEnv, "max_steps must be an int >= 1"),
    ],
)
async def test_broken_optional_members_are_caught(env_cls, message):
    with pytest.raises(EnvCheckError, match=message):
        await check_env(env_cls())


def test_every_optional_member_has_a_default_on_the_base_class():
    """Callers read these directly (no getattr), so a bare env must answer every one."""

    class Bare(Env):
        async def reset(self, *, seed=None, options=None):
            return [], {}

        async def step(self, action):
            return [], 0.0, True, False, {}

    env = Bare()
    assert (env.action_tag, env.tools, env.max_steps, env.spec, env.chat_template_tools) == (
        "action",
        None,
        50,
        None,
        False,
    )
    assert Bare.CHECK_BY_BUILDING is False and env.unwrapped is env
    assert env.task_set() is None and env.could_draw({"k"}) is None and env.render_text() == ""


async def test_bad_types_list_every_problem():
    with pytest.raises(EnvCheckError) as caught:
        await check_env(BadTypesEnv())
    text = str(caught.value)
    assert "reward must be a float" in text and "info lacks format_ok" in text


def test_missing_requirements(monkeypatch):
    from rollhub.envs import checker
    from rollhub.envs.registry import EnvSpec

    monkeypatch.setattr(checker, "_docker_status", False)
    spec = EnvSpec(id="t/Docker-v0", entry_point="x:y", requires=("docker",))
    assert "Docker" in missing_requirements(spec)[0]
    monkeypatch.setattr(checker, "_missing_extra_packages", lambda extra: ["somepkg"])
    spec = EnvSpec(id="t/Extra-v0", entry_point="x:y", extra="alfworld")
    assert "pip install -e '.[alfworld]'" in missing_requirements(spec)[0]
    assert missing_requirements(EnvSpec(id="t/Plain-v0", entry_point="x:y")) == []


class CloseBeforeResetEnv(GuessEnv):
    async def close(self):
        if not hasattr(self, "steps"):
            raise RuntimeError("close() before reset() crashed")


async def test_close_before_reset_is_checked_for_registered_ids():
    from rollhub.envs.registry import _REGISTRY, register

    register("test/CloseEarly-v0", CloseBeforeResetEnv, gymnasium_compat=False)
    register("test/Guess-v0", GuessEnv, gymnasium_compat=False)
    try:
        with pytest.raises(EnvCheckError, match="close\\(\\) before reset\\(\\) crashed"):
            await check_env("test/CloseEarly-v0")
        assert await check_env("test/Guess-v0") == []
    finally:
        _REGISTRY.pop("test/CloseEarly-v0", None)
        _REGISTRY.pop("test/Guess-v0", None)
