"""`rollhub eval ENV --model PATH_OR_URL`: success rate with n and a 95% Wilson interval, mean turns."""

import json

import pytest

from rollhub.cli import main
from rollhub.core.intervals import wilson_interval
from rollhub.envs import Env, register
from rollhub.envs.registry import _REGISTRY
from tests.envs.chat_server import chat_server


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


class _Parity(Env):
    """Say whether the seed is even: a model that always says "even" wins exactly the even seeds."""

    max_steps = 2

    async def reset(self, *, seed=None, options=None):
        self.seed = seed
        return [{"role": "user", "content": f"Is {seed} even or odd? Answer <action>even</action> or odd."}], {
            "anchor": seed,
            "success": False,
        }

    async def step(self, action):
        won = ("even" in action) == (self.seed % 2 == 0)
        info = {"anchor": self.seed, "success": won, "action_valid": True, "format_ok": True}
        return [{"role": "user", "content": "right" if won else "wrong"}], float(won), True, False, info


@pytest.fixture
def parity_env():
    register("test/Parity-v0", _Parity, gymnasium_compat=False)
    yield "test/Parity-v0"
    _REGISTRY.pop("test/Parity-v0", None)


def test_wilson_interval_known_values():
    low, high = wilson_interval(50, 100)
    assert abs(low - 0.4038) < 1e-4 and abs(high - 0.5962) < 1e-4
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(0, 0) == (0.0, 1.0)


def test_eval_env_with_an_openai_compatible_url_reports_rate_interval_and_turns(capsys, parity_env):
    with chat_server(lambda messages: "<action>even</action>") as (url, requests):
        code, out, err = run(
            capsys, "eval", parity_env, "--model", url, "--episodes", "6", "--split", "train", "--json"
        )
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["n"] == 6 and result["seeds"] == [0, 5] and result["successes"] == 3
    assert result["success_rate"] == 0.5 and result["mean_turns"] == 1.0
    assert result["ci95"] == pytest.approx(list(wilson_interval(3, 6)))
    assert len(requests) == 6


def test_eval_env_test_split_plays_held_out_seeds_and_prints_a_line(capsys, parity_env):
    with chat_server(lambda messages: "odd") as (url, _):
        code, out, err = run(capsys, "eval", parity_env, "--model", url, "--episodes", "4")
    assert code == 0, err
    line = out.strip().splitlines()[-1]
    assert "seeds 1000000..1000003" in line and "success 50.0%" in line and "n=4" in line and "95% interval" in line


def test_eval_env_with_a_local_checkpoint_and_the_env_split(capsys, tiny_model_dir):
    code, out, err = run(capsys, "eval", "rollhub/Math-v0", "--model", str(tiny_model_dir), "--episodes", "2", "--json")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["n"] == 2 and result["split"] == "test" and 0 <= result["ci95"][0] <= result["ci95"][1] <= 1


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["rollhub/Math-v0", "--model", "http://127.0.0.1:9", "--episodes", "0"], "--episodes must be >= 1"),
        (["rollhub/Math-v0", "--model", "/no/such/dir"], "neither an http(s) URL"),
        (["rollhub/Math-v0", "--model", "http://127.0.0.1:9", "--episodes", "1"], "cannot reach"),
        (["rollhub/Nope-v0", "--model", "http://127.0.0.1:9"], "unknown env id"),
        (["rollhub/Math-v0", "--model", "http://127.0.0.1:9", "--set", "difficulty=9"], "difficulty"),
    ],
)
def test_eval_env_mistakes_are_one_line(capsys, argv, fragment):
    code, _, err = run(capsys, "eval", *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err


def test_env_flags_with_a_recipe_are_one_line(capsys, tiny_model_dir):
    code, _, err = run(capsys, "eval", "configs/sokoban_tiny.yaml", "--model", str(tiny_model_dir), "--episodes", "5")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--episodes" in err and "eval.episodes" in err
