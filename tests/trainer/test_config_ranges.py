"""A bad recipe value is refused at load time, naming its key, before any model is built."""

import dataclasses
import json
import types
import typing
from pathlib import Path

import pytest

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.core.errors import MissingExtraError, UserError
from rollhub.envs.arguments import typed_env_kwargs
from rollhub.envs.registry import spec
from rollhub.envs.run_checks import check_env_kwargs
from rollhub.rollout.manager import EnvManager
from rollhub.trainer.config import TRAIN_SEED_SLACK, RunConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SOKOBAN = str(CONFIGS / "sokoban_tiny.yaml")


def _float_fields(cls: type, prefix: str = "") -> list[str]:
    """Dotted keys of every float field (float or float | None) in a config tree."""
    keys = []
    for name, tp in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(tp):
            keys += _float_fields(tp, f"{prefix}{name}.")
        elif tp is float or (isinstance(tp, types.UnionType) and float in typing.get_args(tp)):
            keys.append(f"{prefix}{name}")
    return keys


def _run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def _isolated(model: Path, run: Path) -> list[str]:
    """Overrides that keep a CLI run inside tmp dirs (and this test process at one torch thread)."""
    return ["--set", f"model.path={model}", "--set", f"run_dir={run}", "--set", "model.threads=1"]


@pytest.fixture
def empty_dirs(tmp_path):
    """An empty model dir and a run dir that does not exist yet; nothing may appear in either."""
    model = tmp_path / "model"
    model.mkdir()
    return model, tmp_path / "run"


@pytest.mark.parametrize(
    "override,key",
    [
        ("optim.lr=.nan", "optim.lr"),
        ("rollout.async_ratio=.nan", "rollout.async_ratio"),
        ("env.max_concurrent=0", "env.max_concurrent"),
        ("optim.max_grad_norm=-1", "optim.max_grad_norm"),
        ("env.kwargs.dim=banana", "env.kwargs.dim"),
        ("env.kwargs.dimm=6", "env.kwargs.dimm"),
        ("env.kwargs.progress_reward=.nan", "env.kwargs.progress_reward"),
        ("eval.seed_offset=100", "eval.seed_offset"),
    ],
)
def test_train_refuses_bad_values_before_building_a_model(capsys, empty_dirs, override, key):
    model, run = empty_dirs
    argv = ["train", SOKOBAN, *_isolated(model, run), "--set", override]
    code, err = _run_cli(argv, capsys)
    assert code == 2
    assert err.startswith("rollhub: error: ") and err.count("\n") == 1  # one line
    assert key in err
    assert list(model.iterdir()) == [] and not run.exists()


def test_sft_and_eval_check_env_kwargs_before_loading_the_model(capsys, empty_dirs, tmp_path):
    model, run = empty_dirs
    bad = ["--set", "env.kwargs.dim=banana", *_isolated(model, run)]
    code, err = _run_cli(["sft", SOKOBAN, "--out", str(tmp_path / "out"), *bad], capsys)
    assert code == 2 and "env.kwargs.dim" in err and "banana" in err
    assert list(model.iterdir()) == [] and not (tmp_path / "out").exists()
    (model / "config.json").write_text("{}")  # passes the model-dir check; loading it would fail
    code, err = _run_cli(["eval", SOKOBAN, "--model", str(model), *bad], capsys)
    assert code == 2 and "env.kwargs.dim" in err and "banana" in err


@pytest.mark.parametrize("key", _float_fields(RunConfig))
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_every_float_of_a_run_config_must_be_finite(key, value):
    with pytest.raises(UserError) as caught:
        load_config(RunConfig, SOKOBAN, [f"{key}={value}"])
    assert str(caught.value).startswith(f"{key}: ") and "finite" in str(caught.value)


def test_the_float_walk_finds_the_fields_of_every_section():
    keys = set(_float_fields(RunConfig))
    assert {
        "optim.lr",
        "rollout.async_ratio",
        "train.max_wall_s",
        "loss.dual_clip",
        "cluster.startup_timeout_s",
    } <= keys


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("seed=-1", "seed must be in [0, 2**32)"),
        (f"seed={2**32}", "seed must be in [0, 2**32)"),
        ("run_dir=' '", "run_dir"),
        ("model.threads=0", "model.threads must be >= 1"),
        ("model.path=''", "model.path"),
        ("env.train_seed_offset=-1", "env.train_seed_offset must be >= 0"),
        ("env.max_concurrent=-3", "env.max_concurrent must be >= 1"),
        ("rollout.group_size=0", "rollout.group_size must be >= 1"),
        ("rollout.async_ratio=-0.5", "rollout.async_ratio must be >= 0"),
        ("optim.lr=0", "optim.lr must be > 0"),
        ("optim.weight_decay=-0.1", "optim.weight_decay must be >= 0"),
        ("optim.beta1=1", "optim.beta1 must be in [0, 1)"),
        ("optim.beta2=-0.1", "optim.beta2 must be in [0, 1)"),
        ("optim.eps=0", "optim.eps must be > 0"),
        ("optim.max_grad_norm=0", "optim.max_grad_norm must be > 0"),
        ("optim.warmup_steps=-1", "optim.warmup_steps must be >= 0"),
        ("optim.lr_end_factor=1.5", "optim.lr_end_factor must be in [0, 1]"),
        ("optim.minibatches=0", "optim.minibatches must be >= 1"),
        ("train.steps=-1", "train.steps must be >= 0"),
        ("train.checkpoint_every=-1", "train.checkpoint_every must be >= 0"),
        ("train.keep_checkpoints=-1", "train.keep_checkpoints must be >= 0"),
        ("train.max_wall_s=0", "train.max_wall_s must be > 0"),
        ("train.max_job_wall_s=-60", "train.max_job_wall_s must be > 0"),
        ("sft.episodes=0", "sft.episodes must be >= 1"),
        ("sft.epochs=0", "sft.epochs must be > 0"),
        ("sft.lr=-1e-3", "sft.lr must be > 0"),
        ("sft.batch_size=0", "sft.batch_size must be >= 1"),
        ("sft.seed_offset=-5", "sft.seed_offset must be >= 0"),
        ("sft.noise=1", "sft.noise must be in [0, 1)"),
        ("eval.seed_offset=-1", "eval.seed_offset must be >= 0"),
        ("eval.temperature=-0.1", "eval.temperature must be >= 0"),
        ("eval.every=-1", "eval.every must be >= 0"),
        ("engine.seed=-1", "engine.seed must be >= 0"),
        ("agent.max_turns=0", "max_turns must be >= 1"),
        ("agent.temperature=-1", "temperature must be >= 0"),
        ("agent.top_p=0", "top_p must be in (0, 1]"),
        ("agent.top_k=0", "top_k must be -1 (off) or >= 1"),
        ("agent.format_penalty=0.5", "format_penalty is a penalty"),
        ("algorithm.gamma=1.5", "gamma must be in [0, 1]"),
        ("loss.is_cap=0", "is_cap must be > 0"),
        ("cluster.local_num_cpus=0", "cluster.local_num_cpus must be >= 1"),
        ("cluster.startup_timeout_s=0", "cluster.startup_timeout_s must be > 0"),
        ("cluster.shard_resources={sandbox_host: -1}", "sandbox_host=-1"),
    ],
)
def test_numeric_ranges_are_checked(override, fragment):
    with pytest.raises(UserError) as caught:
        load_config(RunConfig, SOKOBAN, [override])
    assert fragment in str(caught.value)


def test_sft_episodes_may_be_zero_when_sft_is_off():
    assert load_config(RunConfig, SOKOBAN, ["sft.enabled=false", "sft.episodes=0"]).sft.episodes == 0


def test_env_manager_ranges():
    """The manager's own arguments (its sections are checked above, as parts of a RunConfig)."""
    with pytest.raises(ValueError, match="max_infra_retries must be >= 0"):
        EnvManager(None, None, max_infra_retries=-1)
    with pytest.raises(ValueError, match="redundancy_mode must be"):
        EnvManager(None, None, redundancy_mode="drop")


def test_training_seed_range_is_bounded_by_steps_batch_and_async_ratio():
    config = load_config(RunConfig, None, ["train.steps=20", "rollout.groups_per_batch=4", "rollout.async_ratio=1.5"])
    assert config.train_seed_bound == 20 * 4 * (1 + 2) + TRAIN_SEED_SLACK
    assert config.train_seeds == range(0, config.train_seed_bound)


def test_overlap_is_checked_as_ranges_not_by_start():
    """The old check only asked whether a range's first seed was held out: training from 0 ran into eval."""
    base = ["train.steps=20", "rollout.groups_per_batch=4", "rollout.async_ratio=1", "sft.enabled=false"]
    end = 20 * 4 * 2 + TRAIN_SEED_SLACK  # the training range is [0, end)
    assert load_config(RunConfig, None, [*base, f"eval.seed_offset={end}"]).eval.seed_offset == end
    with pytest.raises(UserError) as caught:
        load_config(RunConfig, None, [*base, f"eval.seed_offset={end - 1}"])
    message = str(caught.value)
    assert "training seeds" in message and f"[0, {end})" in message
    assert "evaluation seeds" in message and f"[{end - 1}, {end - 1 + 100})" in message
    with pytest.raises(UserError, match="training seeds .* overlap evaluation seeds"):  # a long run reaches eval
        load_config(RunConfig, None, ["train.steps=200000"])


def test_sft_range_overlaps():
    with pytest.raises(UserError, match=r"SFT seeds .*\[999950, 1000150\) overlap evaluation seeds"):
        load_config(RunConfig, None, ["sft.seed_offset=999950"])
    near_training = ["sft.seed_offset=100", "train.steps=1"]
    with pytest.raises(UserError, match="training seeds .* overlap SFT seeds"):
        load_config(RunConfig, None, [*near_training, "sft.enabled=true"])
    # without the warm-start the demos never meet the training tasks; eval still must stay apart
    assert not load_config(RunConfig, None, [*near_training, "sft.enabled=false"]).sft.enabled


@pytest.mark.parametrize("recipe", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_recipes_load_and_their_env_kwargs_check(recipe):
    config = load_config(RunConfig, recipe)
    assert not set(config.train_seeds) & set(config.eval.seeds)
    try:
        typed = check_env_kwargs(config.env.id, config.env.kwargs)
    except MissingExtraError:
        pytest.skip(f"{config.env.id} needs an extra that is not installed")
    assert json.loads(json.dumps(typed)) == json.loads(json.dumps(config.env.kwargs))  # a list may become a tuple


def test_env_kwargs_are_typed_as_the_constructor_says():
    sokoban = spec("rollhub/Sokoban-v0")
    assert typed_env_kwargs(sokoban, {"progress_reward": 1, "dim": 6}) == {"progress_reward": 1.0, "dim": 6}
    assert isinstance(check_env_kwargs("rollhub/Sokoban-v0", {"progress_reward": 1})["progress_reward"], float)
    with pytest.raises(UserError, match=r"^--set dim: 'banana' matches none of"):
        typed_env_kwargs(sokoban, {"dim": "banana"}, key_prefix="--set ")
    with pytest.raises(UserError, match=r"^env.kwargs.num_box: .*did you mean num_boxes"):
        check_env_kwargs("rollhub/Sokoban-v0", {"num_box": 2})
    with pytest.raises(UserError, match="not registered"):
        check_env_kwargs("rollhub/NoSuchEnv-v0", {})


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.max_infra_failure_rate=1.5", "rollout.max_infra_failure_rate"),
        ("rollout.infra_failure_window=0", "rollout.infra_failure_window"),
        ("rollout.max_failed_batches=-1", "rollout.max_failed_batches"),
    ],
)
def test_failure_budget_fields_are_range_checked(override, key):
    from rollhub.trainer.config import RunConfig

    with pytest.raises(UserError, match=key):
        load_config(RunConfig, None, [override])
