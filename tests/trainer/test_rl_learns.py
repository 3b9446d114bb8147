"""The whole RL loop learns: env -> engine -> buffer -> advantages -> decoupled PPO -> weight push.

A two-armed bandit: SFT on demonstrations that pick `a` or `b` at random teaches the
tiny model the answer format with P(a) near one half; RL then rewards `a` only. A working
loop raises the held-out success rate well above the warm-start within a few steps. A sign
error, an advantage/token misalignment or a weight push that never reaches the engine
all fail this test (the Sokoban recipe is too slow to learn in a unit test).
"""

from pathlib import Path

import numpy as np
import yaml

from rollhub.envs.base import Env, extract_action
from rollhub.envs.registry import register
from rollhub.trainer.metrics import read_jsonl


class TwoArmsEnv(Env):
    """One step: `<action>a</action>` scores 1, `<action>b</action>` scores 0 (both count as a valid pick)."""

    action_tag = "action"

    async def reset(self, *, seed=None, options=None):
        self.rng = np.random.default_rng(seed)
        return [{"role": "user", "content": "Pick a or b."}], {"anchor": "start", "success": False}

    async def step(self, action: str):
        choice = extract_action(action, self.action_tag)
        valid = choice in ("a", "b")
        # success = a well-formed pick (so SFT keeps demonstrations of both arms); reward = arm a
        info = {"anchor": "end", "success": valid, "action_valid": valid, "format_ok": choice is not None}
        return [], float(choice == "a"), True, False, info

    def expert_action(self) -> str:  # an indifferent demonstrator: the SFT data carries no preference
        return f"<action>{'ab'[int(self.rng.integers(2))]}</action>"

    async def close(self) -> None:
        pass


register("test/TwoArms-v0", TwoArmsEnv, gymnasium_compat=False)


def test_rl_raises_the_success_rate_of_a_bandit(tiny_model_dir, tmp_path: Path):
    from rollhub.cli import main

    recipe = {
        "run_dir": str(tmp_path / "run"),
        "seed": 0,
        "model": {"path": str(tiny_model_dir), "init_tiny": None},
        "env": {"id": "test/TwoArms-v0"},
        "agent": {"max_new_tokens": 8, "temperature": 1.0},
        "rollout": {"group_size": 4, "groups_per_batch": 8, "async_ratio": 1.0},
        "algorithm": {"estimator": "gigpo"},
        "optim": {"lr": 1e-4, "warmup_steps": 2},
        "train": {"steps": 14, "checkpoint_every": 0, "log_trajectories": False},
        "sft": {"enabled": True, "episodes": 128, "epochs": 6.0, "batch_size": 16, "lr": 3e-3},
        "eval": {"episodes": 200, "temperature": 1.0},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path), "--no-progress"]) == 0
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    evals = [r for r in records if "eval/success_rate" in r]
    before, after = evals[0]["eval/mean_return"], evals[-1]["eval/mean_return"]
    assert evals[0]["eval/format_error_rate"] < 0.2, "the SFT warm-start did not learn the answer format"
    assert 0.2 < before < 0.8, f"the warm-start should be indifferent between the arms, got P(a) = {before}"
    assert after >= before + 0.2, f"RL did not learn: held-out mean reward {before:.2f} -> {after:.2f}"
