"""gymnasium's own checker passes on the built-in envs, and the adapter's spaces hold its values."""

import subprocess
import sys
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import rollhub.envs  # noqa: F401  (registers the ids in gymnasium too)
from rollhub.envs.gym_compat import AnyText, ChatMessages

BUILTIN_IDS = [
    "rollhub/Sokoban-v0",
    "rollhub/Sokoban-Sparse-v0",
    "rollhub/Sokoban-6x6-2b-v0",
    "rollhub/Sokoban-8x8-2b-v0",
    "rollhub/Sokoban-8x8-4b-v0",
    "rollhub/Math-v0",
    "rollhub/MathTool-v0",
]


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_gymnasium_check_env_passes(env_id):
    env = gymnasium.make(env_id)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*render fps.*")  # text envs have no frame rate
            check_env(env.unwrapped)
        obs, _ = env.reset(seed=0)
        assert obs in env.observation_space
    finally:
        env.close()


def test_spaces_hold_chat_messages_and_any_text():
    messages = ChatMessages()
    assert [{"role": "user", "content": "é ☃ <x>\n"}] in messages
    assert "a string" not in messages
    assert [{"role": "user"}] not in messages
    assert [{"role": "user", "content": 3}] not in messages
    text = AnyText(action_tag="answer", seed=0)
    assert "ünïcode ☃" in text and b"bytes" not in text
    sample = text.sample()
    assert sample.startswith("<answer>") and sample.endswith("</answer>") and sample in text


def test_gymnasium_module_form_needs_no_prior_import():
    """gymnasium 1.x has no plugin discovery; its own `module:id` form imports rollhub.envs itself."""
    code = (
        "import gymnasium\n"
        "env = gymnasium.make('rollhub.envs:rollhub/Sokoban-v0')\n"
        "obs, info = env.reset(seed=1)\n"
        "assert obs in env.observation_space\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
