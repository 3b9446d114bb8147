"""Every shipped recipe loads and validates; each env recipe runs one tiny step where its env exists."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from rollhub.core.config import load_config
from rollhub.inference.models import build_tokenizer
from rollhub.trainer.config import RunConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(CONFIGS.glob("*.yaml"))


def test_recipes_exist():
    names = {p.name for p in RECIPES}
    assert {"sokoban_tiny.yaml", "math_tiny.yaml", "alfworld_smollm2.yaml", "swe_smollm2.yaml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads(recipe):
    config = load_config(RunConfig, recipe)
    assert config.train.steps > 0
    assert config.eval.episodes > 0


def _registered(env_id: str) -> bool:
    from rollhub.envs.registry import all_specs

    return env_id in {getattr(s, "id", s) for s in all_specs()}


def _tiny_overrides(tmp_path: Path, model_dir: Path, env_kwargs: str) -> list[str]:
    return [
        f"run_dir={tmp_path / 'run'}",
        f"model.path={model_dir}",
        "model.init_tiny=null",
        "model.device=cpu",
        "rollout.group_size=2",
        "rollout.groups_per_batch=1",
        "rollout.async_ratio=0",
        "rollout.lockstep=true",
        "train.steps=1",
        "train.checkpoint_every=0",
        "sft.enabled=false",
        "eval.episodes=1",
        "eval.select.episodes=0",
        "agent.max_new_tokens=8",
        "optim.micro_batch_size=8",
        f"env.kwargs={env_kwargs}",
    ]


def _smoke(recipe: str, tmp_path: Path, model_dir: Path, env_kwargs: str, extra: tuple[str, ...] = ()) -> None:
    from rollhub.cli import main

    assert (
        main(
            [
                "train",
                str(CONFIGS / recipe),
                "--no-progress",
                *(f"--set={o}" for o in [*_tiny_overrides(tmp_path, model_dir, env_kwargs), *extra]),
            ]
        )
        == 0
    )
    assert (tmp_path / "run" / "summary.json").is_file()


def test_sokoban_recipe_smoke_keeps_its_one_token_answers(tiny_model_dir, tmp_path):
    """The main job's own env and agent settings (bare moves, no system message, deadlock stop)
    through SFT and one RL step: every turn, demo or sampled, is one token."""
    from rollhub.cli import main

    overrides = [
        o
        for o in _tiny_overrides(tmp_path, tiny_model_dir, "")
        if not o.startswith(("env.kwargs", "agent.max_new_tokens", "sft.enabled"))
    ]
    overrides += ["sft.episodes=4", "sft.epochs=1.0", "sft.batch_size=4", "eval.samples_per_seed=1"]
    assert main(["train", str(CONFIGS / "sokoban_tiny.yaml"), "--no-progress", *(f"--set={o}" for o in overrides)]) == 0
    trajectories = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    turns = [turn for t in trajectories for turn in t["turns"]]
    assert turns and all(len(turn["response_ids"]) == 1 for turn in turns)
    tokenizer = build_tokenizer()
    assert all(
        tokenizer.decode(turn["prompt_ids"]).startswith("<|im_start|>user\n") for turn in turns
    )  # no system message
    assert all(turn["response_text"] in ("up", "down", "left", "right") or not turn["format_ok"] for turn in turns)


def test_math_recipe_smoke(tiny_model_dir, tmp_path):
    _smoke("math_tiny.yaml", tmp_path, tiny_model_dir, "{kinds: [arithmetic], difficulty: 1, split: train}")


def test_alfworld_recipe_smoke(tiny_model_dir, tmp_path):
    if not _registered("rollhub/ALFWorld-v0"):
        pytest.skip("rollhub/ALFWorld-v0 is not registered in this checkout")
    if importlib.util.find_spec("alfworld") is None or importlib.util.find_spec("textworld") is None:
        pytest.skip("ALFWorld needs the 'alfworld' extra: pip install -e '.[alfworld]'")
    from rollhub.envs.alfworld.generate import generate_games

    games = tmp_path / "train_games"  # one generated game stands in for the train split (make-games)
    generate_games(1, games, progress=False)
    _smoke(
        "alfworld_smollm2.yaml",
        tmp_path,
        tiny_model_dir,
        f"{{game_dir: {games}, max_steps: 2}}",
        extra=["eval.env.kwargs={split: valid_unseen, game_dir: null}"],
    )


@pytest.mark.slow
@pytest.mark.docker
def test_swe_recipe_smoke(tiny_model_dir, tmp_path):
    if not _registered("rollhub/SWE-v0"):
        pytest.skip("rollhub/SWE-v0 is not registered in this checkout")
    if importlib.util.find_spec("swebench") is None or shutil.which("docker") is None:
        pytest.skip("SWE needs Docker and the 'swe' extra: pip install -e '.[swe]'")
    _smoke("swe_smollm2.yaml", tmp_path, tiny_model_dir, "{split: train, max_steps: 2}")
