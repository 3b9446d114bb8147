"""`model.path` resolves to a real model or fails with the fix: never a silent random-init model."""

import shutil
from pathlib import Path

import pytest
import yaml
from trainer_testing import tiny_recipe

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.trainer.build import ensure_model
from rollhub.trainer.config import RunConfig
from rollhub.trainer.model_source import is_hub_id

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _recipe_without_init_tiny(tmp_path: Path, model_path: str) -> Path:
    """The tiny recipe with `model.path` set and no `model.init_tiny` key (the default applies)."""
    recipe = tiny_recipe(tmp_path, Path(model_path))
    data = yaml.safe_load(recipe.read_text())
    data["model"] = {"path": model_path}
    recipe.write_text(yaml.safe_dump(data))
    return recipe


@pytest.fixture
def empty_offline_hub(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_missing_model_folder_is_an_error_not_a_random_model(tmp_path, capsys, empty_offline_hub):
    typo = tmp_path / "modles" / "tiny"
    recipe = _recipe_without_init_tiny(tmp_path, str(typo))
    assert main(["train", str(recipe), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "model.init_tiny: 5m" in err and "Traceback" not in err
    assert not typo.exists() and not (tmp_path / "run").exists()  # no model, no run folder


def test_a_hub_id_never_builds_a_random_model_in_the_checkout(tmp_path, capsys, monkeypatch, empty_offline_hub):
    monkeypatch.chdir(tmp_path)
    recipe = tiny_recipe(tmp_path, tmp_path / "unused", model={"init_tiny": "5m"})  # as configs/sokoban_tiny.yaml
    assert main(["train", str(recipe), "--no-progress", "--set", "model.path=Qwen/Qwen2.5-0.5B-Instruct"]) == 2
    err = capsys.readouterr().err
    assert "Hugging Face cache" in err and "hf download Qwen/Qwen2.5-0.5B-Instruct" in err
    assert not (tmp_path / "Qwen").exists()


def test_a_hub_id_resolves_through_the_offline_hugging_face_cache(tiny_model_dir, tmp_path, capsys, empty_offline_hub):
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = empty_offline_hub / "models--tiny-org--tiny-qwen"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)

    config = load_config(RunConfig, None, ["model.path=tiny-org/tiny-qwen"])
    assert ensure_model(config) == repo / "snapshots" / revision
    recipe = tiny_recipe(tmp_path, tiny_model_dir, eval={"episodes": 1})
    assert main(["eval", str(recipe), "--model", "tiny-org/tiny-qwen"]) == 0
    assert "success on 1 held-out seeds" in capsys.readouterr().out


def test_random_models_only_where_the_recipe_names_one(tmp_path):
    assert RunConfig().model.init_tiny is None
    for recipe in sorted(CONFIGS.glob("*.yaml")):
        model = yaml.safe_load(recipe.read_text())["model"]
        assert "init_tiny" in model, f"{recipe} must say whether it wants a random model (model.init_tiny)"
    built = load_config(RunConfig, None, [f"model.path={tmp_path / 'tiny'}", "model.init_tiny=5m"])
    assert (ensure_model(built) / "config.json").is_file()
    full = tmp_path / "notes"
    full.mkdir()
    (full / "readme.txt").write_text("not a model")
    with pytest.raises(UserError, match="folder without a model"):
        ensure_model(load_config(RunConfig, None, [f"model.path={full}", "model.init_tiny=5m"]))


def test_hub_ids_are_told_from_folders():
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct") and is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    for folder in ("runs/models/tiny-5m", "./Qwen/Qwen2.5", "/abs/path", "~/models/x", "../a/b", "tiny"):
        assert not is_hub_id(folder), folder
