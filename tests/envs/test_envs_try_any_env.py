"""`rollhub envs try` plays every listed env: the README's own example, the adapters' samples, an
env with neither a random agent nor an expert; a model plays from a folder or a URL; an env
that raises in `reset` is one line naming it."""

import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from rollhub.cli import main
from rollhub.envs import Env, register
from rollhub.envs.players import example_action
from rollhub.envs.registry import _REGISTRY
from tests.envs.chat_server import MODEL_NAME, chat_server

README = Path(__file__).resolve().parents[2] / "README.md"


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def readme_coin(monkeypatch):
    """`mine/Coin-v0` registered by the README's example code, exactly as written there."""
    match = re.search(r"# my_envs/__init__.py\n(.*?)```", README.read_text(), re.DOTALL)
    module = types.ModuleType("my_envs")
    monkeypatch.setitem(sys.modules, "my_envs", module)
    exec(compile(match.group(1), "README.md", "exec"), module.__dict__)
    module.register_envs()
    yield "mine/Coin-v0"
    _REGISTRY.pop("mine/Coin-v0", None)


def test_readme_example_plays_with_the_default_agent(capsys, readme_coin):
    code, out, err = run(capsys, "envs", "try", readme_coin, "--json")
    assert code == 0, err
    assert re.search(r"\[agent\] <action>\w+</action>", out)
    assert last_json(out)["steps"] >= 1


def test_an_example_agent_wins_the_readme_env_on_some_seed(capsys, readme_coin):
    wins = []
    for seed in range(6):
        code, out, _ = run(capsys, "envs", "try", readme_coin, "--seed", str(seed), "--json")
        assert code == 0
        wins.append(last_json(out)["success"])
    assert any(wins)  # the example's own content, "heads", is among what it draws


def listed_envs_playable_here(capsys):
    code, out, _ = run(capsys, "envs", "list", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    # docker and ALFWorld envs play too, but take minutes here; every other listed env is tried. Ids in
    # the test/ namespace are fixtures other test modules register in this process (some crash on purpose)
    return [
        r["id"]
        for r in rows
        if r["available"] and not {"docker", "extra:alfworld"} & set(r["needs"]) and not r["id"].startswith("test/")
    ]


def test_every_listed_env_plays_with_the_default_agent(capsys):
    ids = listed_envs_playable_here(capsys)
    assert "rollhub/Math-v0" in ids and "rollhub/MathTool-v0" in ids
    for env_id in ids:
        code, out, err = run(capsys, "envs", "try", env_id, "--max-steps", "3", "--json")
        assert code == 0, f"{env_id}: {err}"
        assert last_json(out)["env"] == env_id


def test_adapter_samples_play_where_their_extra_is_installed(capsys):
    samples = [
        ("gem", "gem:rg:basic_arithmetic"),
        ("verifiers", "verifiers:rollhub.envs.adapters.samples_verifiers:load_environment"),
        ("openenv", "openenv:rollhub.envs.adapters.samples_openenv:CountdownEnvironment"),
    ]
    from rollhub.envs.checker import missing_requirements
    from rollhub.envs.registry import spec

    played = 0
    for _, env_id in samples:
        if missing_requirements(spec(env_id)):
            continue
        code, out, err = run(capsys, "envs", "try", env_id, "--json")
        assert code == 0, f"{env_id}: {err}"
        played += 1
    if played == 0:
        pytest.skip("no adapter extra installed")


class _NoAgents(Env):
    """Declares a tool, ships no random agent and no expert."""

    max_steps = 2
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "number"}, "why": {"type": "string"}},
                },
            },
        }
    ]

    async def reset(self, *, seed=None, options=None):
        return [{"role": "user", "content": "Add 3 and 4."}], {"anchor": 0, "success": False}

    async def step(self, action):
        self.last = action
        return [{"role": "user", "content": "ok"}], 0.0, False, False, {"anchor": 0, "success": False}


def test_example_action_of_tools_and_of_shown_markup():
    rng = np.random.default_rng(0)
    call = example_action(_NoAgents(), [{"role": "user", "content": "Add 3 and 4."}], rng)
    payload = json.loads(re.fullmatch(r"<tool_call>(.*)</tool_call>", call).group(1))
    assert payload["name"] == "add" and payload["arguments"]["a"] in (3, 4)
    assert isinstance(payload["arguments"]["b"], float) and isinstance(payload["arguments"]["why"], str)

    class Guess(_NoAgents):
        tools = None

    guess = example_action(Guess(), [{"role": "user", "content": "Answer with <guess>N</guess> from 1 to 16."}], rng)
    assert re.fullmatch(r"<guess>(N|Answer|with|from|1|to|16)</guess>", guess)
    boxed = example_action(Guess(), [{"role": "user", "content": "Reply as \\boxed{up} or \\boxed{down}."}], rng)
    assert re.fullmatch(r"\\boxed\{\w+\}", boxed)


class _ResetRaises(Env):
    async def reset(self, *, seed=None, options=None):
        raise KeyError("level file missing")

    async def step(self, action):
        raise AssertionError("never reached")


class _StepRaises(_NoAgents):
    tools = None

    async def step(self, action):
        raise ZeroDivisionError("division by zero\nsecond line")


@pytest.fixture
def broken_envs():
    register("test/ResetRaises-v0", _ResetRaises, gymnasium_compat=False)
    register("test/StepRaises-v0", _StepRaises, gymnasium_compat=False)
    register("test/NoAgents-v0", _NoAgents, gymnasium_compat=False)
    yield
    for key in ("test/ResetRaises-v0", "test/StepRaises-v0", "test/NoAgents-v0"):
        _REGISTRY.pop(key, None)


def test_env_errors_are_one_line_naming_env_and_exception(capsys, broken_envs):
    code, _, err = run(capsys, "envs", "try", "test/ResetRaises-v0")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert "test/ResetRaises-v0" in lines[0] and "KeyError" in lines[0] and "level file missing" in lines[0]
    code, _, err = run(capsys, "envs", "try", "test/StepRaises-v0")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert "test/StepRaises-v0" in lines[0] and "ZeroDivisionError: division by zero" in lines[0]


def test_tool_env_without_agents_plays_and_expert_error_points_at_random(capsys, broken_envs):
    code, out, _ = run(capsys, "envs", "try", "test/NoAgents-v0", "--json")
    assert code == 0 and "[agent] <tool_call>" in out and last_json(out)["steps"] == 2
    code, _, err = run(capsys, "envs", "try", "test/NoAgents-v0", "--agent", "expert")
    assert code == 2 and "--agent random (plays any env)" in err


def test_model_agent_plays_a_local_checkpoint(capsys, tiny_model_dir):
    code, out, err = run(capsys, "envs", "try", "rollhub/Math-v0", "--agent", "model", "--model", str(tiny_model_dir))
    assert code == 0, err
    assert "[agent]" in out and "episode: 1 steps" in out


def test_model_agent_plays_an_openai_compatible_url(capsys, readme_coin):
    with chat_server(lambda messages: "I pick <action>heads</action>") as (url, requests):
        code, out, err = run(capsys, "envs", "try", readme_coin, "--agent", "model", "--model", url, "--json")
    assert code == 0, err
    assert last_json(out)["success"] is True
    assert requests[0]["model"] == MODEL_NAME
    assert requests[0]["messages"][-1]["content"] == "Say <action>heads</action>."


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--agent", "model"], "--model PATH_OR_URL"),
        (["--model", "x"], "--model is for --agent model"),
        (["--agent", "model", "--model", "/no/such/folder"], "neither an http(s) URL nor a model folder"),
        (["--agent", "model", "--model", "http://127.0.0.1:9"], "cannot reach the model endpoint"),
    ],
)
def test_model_agent_mistakes_are_one_line(capsys, argv, fragment):
    code, _, err = run(capsys, "envs", "try", "rollhub/Math-v0", *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err
