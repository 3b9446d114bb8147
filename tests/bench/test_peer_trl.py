"""`rollhub bench peer-trl`: TRL's GRPOTrainer and ours, interleaved, on the same task and budget."""

import argparse
import json
import sys

import pytest

from rollhub.bench.peer_trl import leg_order, recipe_overrides, steady_step_s
from rollhub.cli import main
from rollhub.core.errors import MissingExtraError


def refused(capsys, *argv: str) -> str:
    """The one-line error `rollhub` prints for a UserError (exit code 2, no traceback)."""
    assert main(["bench", "peer-trl", *argv]) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    return error


@pytest.mark.parametrize(
    "setting, message",
    [
        ("model=gpt2", "model must be one of tiny, smollm2"),
        ("group=1", "group must be >= 2"),
        ("steps=0", "steps must be >= 1"),
        ("trainers=[trl,trl]", "trainers must be distinct"),
        ("trainers=[ppo]", "trainers must be distinct"),
        ("loss_type=dr_grpo", "loss_type must be one of"),
        ("lr=0", "lr, temperature and alpha must be > 0"),
        ("no_such_option=1", "unknown config key"),
    ],
)
def test_bad_options_are_user_errors(tmp_path, capsys, setting, message):
    assert message in refused(capsys, "--out", str(tmp_path / "out"), "--set", setting)
    assert not (tmp_path / "out").exists()  # refused before anything was built


def test_bad_model_target_is_a_user_error(tmp_path, capsys):
    assert "model must be one of" in refused(capsys, "qwen", "--out", str(tmp_path / "out"))


def test_missing_trl_names_the_extra(tmp_path, capsys, monkeypatch):
    """Without trl the bench says which extra to install (trl is hidden here if it is installed)."""
    monkeypatch.setitem(sys.modules, "trl", None)
    assert "pip install -e '.[trl]'" in refused(capsys, "--out", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    from rollhub.bench.peer_trl import run

    with pytest.raises(MissingExtraError):  # the error's type, as the CLI receives it
        run(argparse.Namespace(overrides=[], quick=False, target=None, out=str(tmp_path / "out")))


def test_a_multi_turn_recipe_is_refused(tmp_path, capsys):
    pytest.importorskip("trl")
    assert "single-turn" in refused(capsys, "--out", str(tmp_path / "out"), "--set", "recipe=configs/sokoban_tiny.yaml")


def test_the_tool_recipe_is_refused_for_the_reason_trl_gives(tmp_path, capsys):
    pytest.importorskip("trl")
    from trl.chat_template_utils import add_response_schema

    from tests.smollm2_testing import smollm2_tokenizer

    error = refused(capsys, "--out", str(tmp_path / "out"), "--set", "recipe=configs/mathtool_smollm2.yaml")
    assert "no tool leg" in error and "SmolLM2's template is not one of them" in error
    # the reason, from TRL itself: its tool loop cannot parse a call in SmolLM2's chat format
    with pytest.raises(ValueError, match="Unrecognized chat template"):
        add_response_schema(smollm2_tokenizer())


def test_an_unrelated_out_folder_is_never_wiped(tmp_path, capsys):
    pytest.importorskip("trl")
    (tmp_path / "keep.txt").write_text("mine")
    assert "holds no earlier peer-trl output" in refused(capsys, "--out", str(tmp_path))
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_legs_share_the_settings(tmp_path):
    from rollhub.bench.peer_trl import PeerTrlConfig
    from rollhub.core.config import load_config
    from rollhub.trainer.config import RunConfig

    cfg = load_config(PeerTrlConfig, None, ["threads=2", "prompts=3", "group=4", "lr=3e-6"])
    configs = {
        trainer: load_config(
            RunConfig, cfg.recipe, recipe_overrides(cfg, tmp_path / trainer, tmp_path / "model", trainer)
        )
        for trainer in ("trl", "sync", "async")
    }
    for config in configs.values():
        assert (config.rollout.groups_per_batch, config.rollout.group_size) == (3, 4)
        assert config.optim.lr == 3e-6 and config.agent.max_new_tokens == 64 and config.agent.temperature == 1.0
        assert config.loss.clip_low == config.loss.clip_high == 0.2 and config.loss.kl_coef == 0
        assert config.loss.aggregation == "token-mean"  # TRL's default loss_type, dapo
        assert config.eval.temperature == 0 and config.env.id == "rollhub/Math-v0"
    assert configs["sync"].rollout.lockstep and configs["sync"].rollout.async_ratio == 0
    assert not configs["async"].rollout.lockstep and configs["async"].rollout.async_ratio == 1.0
    for config in configs.values():
        assert (config.model.threads, config.engine.threads) == (2, 2)


def test_rounds_rotate_and_steady_steps_skip_warm_up_and_readings():
    assert [leg_order(["trl", "sync", "async"], r) for r in range(3)] == [
        ["trl", "sync", "async"],
        ["sync", "async", "trl"],
        ["async", "trl", "sync"],
    ]
    leg = {"step_s": [9.0, 1.0, 2.0, 0.1, 3.0]}
    assert steady_step_s(leg, 0) == [1.0, 2.0, 0.1, 3.0]
    assert steady_step_s(leg, 2) == [1.0, 0.1]  # steps 3 and 5 follow the readings after steps 2 and 4
    assert steady_step_s({"step_s": [5.0]}, 0) == [5.0]


@pytest.mark.slow
def test_quick_run_trains_both_on_the_same_held_out_problems(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "peer"
    assert main(["bench", "peer-trl", "--quick", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert (out / "peer_trl.png").stat().st_size > 0
    legs = {leg["trainer"]: leg for leg in result["legs"]}
    assert set(legs) == {"trl", "sync", "async"}
    for leg in legs.values():
        assert leg["steps"] == 2 and len(leg["step_s"]) == 2 and all(s > 0 for s in leg["step_s"])
        assert [r["step"] for r in leg["readings"]] == [0, 1, 2]  # start, eval_every=1, end
        clock = [r["train_s"] for r in leg["readings"]]
        assert clock[0] == 0 and clock == sorted(clock) and clock[-1] == pytest.approx(sum(leg["step_s"]))
    problems = legs["trl"]["readings"][0]["problems"]
    assert len(problems) == 4 and len(set(problems)) == 4
    for leg in legs.values():
        assert leg["readings"][0]["problems"] == problems and leg["readings"][-1]["problems"] == problems
    assert set(result["ratios"]) == {"ours sync speed-up over TRL (s/step)", "ours async speed-up over TRL (s/step)"}
    assert all(ratio["median"] > 0 for ratio in result["ratios"].values())
