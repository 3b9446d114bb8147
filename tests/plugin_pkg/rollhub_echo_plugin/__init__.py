"""A third-party env package in miniature: repeat the word the env says.

Installing this package makes `plugin/Echo-v0` appear in `rollhub envs list`, through the
`rollhub.envs` entry point named in its pyproject.toml; rollhub itself is not edited.
"""

import numpy as np

from rollhub.envs import Env, extract_action, register, wrap_action
from rollhub.envs.base import invalid_step_info

WORDS = ("apple", "river", "stone", "cloud", "lamp")


class EchoEnv(Env):
    max_steps = 3
    hackability_note = "the task is to repeat the word the prompt shows"

    def __init__(self):
        self._rng = np.random.default_rng()
        self.word = WORDS[0]

    async def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.word, self.steps = WORDS[int(self._rng.integers(len(WORDS)))], 0
        return [{"role": "user", "content": f"Say <action>{self.word}</action>."}], {
            "anchor": self.word,
            "success": False,
        }

    async def step(self, action):
        self.steps += 1
        said = extract_action(action, self.action_tag)
        truncated = self.steps >= self.max_steps
        if said is None:
            return (
                [{"role": "user", "content": "Use the <action> tag."}],
                0.0,
                False,
                truncated,
                invalid_step_info(self.word, "no tag", format_ok=False),
            )
        won = said == self.word
        info = {"anchor": self.word, "success": won, "action_valid": True, "format_ok": True}
        return (
            [{"role": "user", "content": "Right." if won else "Wrong."}],
            float(won),
            won,
            truncated and not won,
            info,
        )

    def expert_action(self):
        return wrap_action(self.word, self.action_tag)

    def random_action(self, rng):
        return wrap_action(WORDS[int(rng.integers(len(WORDS)))], self.action_tag)


def register_envs():
    register("plugin/Echo-v0", "rollhub_echo_plugin:EchoEnv", description="repeat a word (test plugin)")
