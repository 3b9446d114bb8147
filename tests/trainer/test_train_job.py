"""The real entry points on tiny budgets: `rollhub train` smoke run, alpha=0 parity, kill-and-resume."""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainer_testing import tiny_recipe as _recipe

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.trainer.config import RunConfig
from rollhub.trainer.metrics import read_jsonl


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_rollhub_train_two_steps(tiny_model_dir, tmp_path, capsys):
    recipe = _recipe(tmp_path, tiny_model_dir, sft={"enabled": True, "episodes": 2, "batch_size": 4})
    assert main(["train", str(recipe), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "warm-start success" in out and "final success" in out
    run = tmp_path / "run"
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r]
    assert steps == [1, 2]
    record = read_jsonl(run / "metrics.jsonl")[2]
    for key in (
        "trainer/idle_fraction",
        "staleness/mean",
        "buffer/dropped_stale",
        "train/offpolicy/w_abs_dev_mean",
        "rollout/generation_tokens_per_s",
    ):
        assert key in record, key
    assert (run / "learning_curve.png").stat().st_size > 0
    assert list((run / "tensorboard").iterdir())
    assert (run / "checkpoints" / "step-000002" / "state.pt").is_file()
    # the SFT phase changed the weights, and RL changed them again
    assert not torch.equal(
        _weights(tiny_model_dir)["model.embed_tokens.weight"], _weights(run / "sft_model")["model.embed_tokens.weight"]
    )
    assert not torch.equal(
        _weights(run / "sft_model")["model.embed_tokens.weight"],
        _weights(run / "final_model")["model.embed_tokens.weight"],
    )
    assert main(["view", str(run)]) == 0
    assert "<details>" in (run / "trajectories.html").read_text()


@pytest.mark.parametrize("estimator", ["k3", "full"])
def test_train_with_kl_minibatches_and_lr_decay(tiny_model_dir, tmp_path, capsys, estimator):
    """The optional parts of a step: KL to the frozen warm-start, PPO mini-batches, lr decay."""
    recipe = _recipe(
        tmp_path,
        tiny_model_dir,
        loss={"kl_coef": 0.1, "kl_estimator": estimator},
        optim={"lr": 1e-3, "micro_batch_size": 32, "minibatches": 2, "lr_end_factor": 0.0},
    )
    assert main(["train", str(recipe), "--no-progress"]) == 0
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/loss" in r]
    assert [r["train/optimizer_steps"] for r in records] == [2.0, 2.0]
    assert all(f"train/kl_reference_{estimator}" in r for r in records)
    assert records[1][f"train/kl_reference_{estimator}"] > 0  # the policy has left the reference after a step
    assert [r["train/lr"] for r in records] == pytest.approx([1e-3, 0.0])
    assert main(["train", str(recipe), "--set", "optim.minibatches=0", "--set", f"run_dir={tmp_path / 'bad'}"]) == 2
    assert "minibatches" in capsys.readouterr().err


def test_train_rejects_unknown_keys_and_env_ids(tiny_model_dir, tmp_path, capsys):
    recipe = _recipe(tmp_path, tiny_model_dir)
    assert main(["train", str(recipe), "--set", "optim.learning_rate=1"]) == 2
    assert "unknown config key 'optim.learning_rate'" in capsys.readouterr().err
    assert main(["train", str(recipe), "--set", "env.id=rollhub/NoSuchEnv-v0"]) == 2
    assert "not registered" in capsys.readouterr().err


def test_alpha0_lockstep_loop_equals_a_plain_synchronous_step(tiny_model_dir, tmp_path):
    """The loop with alpha = 0 and lockstep rollout performs exactly a plain sync update."""
    from rollhub.inference.engines.build import build_engine
    from rollhub.rollout.manager import EnvManager
    from rollhub.trainer.batch import build_training_batch
    from rollhub.trainer.build import build_optimizer, build_seeds, seed_everything
    from rollhub.trainer.job import run_training
    from rollhub.trainer.policy import Policy
    from rollhub.trainer.update import policy_update

    recipe = _recipe(
        tmp_path,
        tiny_model_dir,
        rollout={"async_ratio": 0.0, "lockstep": True},
        train={"steps": 1},
        eval={"episodes": 0},
    )
    config = load_config(RunConfig, recipe)
    asyncio.run(run_training(config, progress=False, print_fn=lambda _: None))
    loop_weights = _weights(Path(config.run_dir) / "final_model")

    async def plain_sync_step():
        seed_everything(config.seed)
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=config.optim.micro_batch_size)
        optimizer = build_optimizer(policy, config)
        engine = build_engine(config.engine_config, tiny_model_dir)  # the run's: its sampling seed and tasks
        manager = EnvManager(
            engine,
            policy.tokenizer,
            env=config.env,
            rollout=config.rollout,
            agent=config.agent,
            seeds=build_seeds(config),
        )
        try:
            groups = await manager.collect_batch(config.rollout.groups_per_batch)
        finally:
            await engine.close()
        batch, _ = build_training_batch(groups, policy.tokenizer.pad_token_id, config.algorithm)
        policy_update(
            policy,
            optimizer,
            batch,
            policy.compute_logprobs(batch),
            config.loss,
            max_grad_norm=config.optim.max_grad_norm,
        )
        return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}

    plain_weights = asyncio.run(plain_sync_step())
    initial = _weights(tiny_model_dir)
    assert not torch.equal(initial["model.norm.weight"], plain_weights["model.norm.weight"])  # the step did something
    for name, tensor in plain_weights.items():
        if name in loop_weights:
            assert torch.allclose(loop_weights[name], tensor, atol=1e-6, rtol=1e-5), name
    metrics = [r for r in read_jsonl(Path(config.run_dir) / "metrics.jsonl") if "train/loss" in r]
    assert metrics[0]["train/offpolicy/w_abs_dev_p95"] < 1e-3  # on-policy: mu == pi_prox up to float noise


def _kill_when(proc: subprocess.Popen, path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended before {path.name} appeared: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"{path} never appeared")


def test_killed_run_resumes_without_losing_or_double_counting(tiny_model_dir, tmp_path):
    recipe = _recipe(
        tmp_path,
        tiny_model_dir,
        rollout={"async_ratio": 0.0, "lockstep": True},
        train={"steps": 4, "checkpoint_every": 1, "keep_checkpoints": 10},
    )
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "rollhub.cli", "train", str(recipe), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    _kill_when(proc, run / "checkpoints" / "step-000002", timeout_s=600)
    assert not (run / "summary.json").exists()

    # two resumes from the same checkpoint behave identically on the next step
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    for folder in (run, twin):
        for newer in (folder / "checkpoints").glob("step-00000[34]"):
            shutil.rmtree(newer)  # the kill may land just after a later checkpoint; compare from step 2
    done = subprocess.run(
        [sys.executable, "-m", "rollhub.cli", "train", "--resume", str(run), "--no-progress"],
        capture_output=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "resumed" in done.stdout.decode()
    records = read_jsonl(run / "metrics.jsonl")
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == [1, 2, 3, 4]  # nothing lost, nothing counted twice
    assert sum(1 for r in records if r["step"] == 0) == 1  # one warm-start evaluation
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4

    twin_done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollhub.cli",
            "train",
            "--resume",
            str(twin),
            "--no-progress",
            "--set",
            "train.steps=3",
        ],
        capture_output=True,
        env=env,
        timeout=600,
    )
    assert twin_done.returncode == 0, twin_done.stderr.decode()[-2000:]
    step3_run = torch.load(run / "checkpoints" / "step-000003" / "state.pt", weights_only=True)["model"]
    step3_twin = torch.load(twin / "checkpoints" / "step-000003" / "state.pt", weights_only=True)["model"]
    for name, tensor in step3_twin.items():
        assert torch.equal(tensor, step3_run[name]), name


def test_rollhub_sft_learns_the_answer_format(tiny_model_dir, tmp_path, capsys):
    recipe = _recipe(
        tmp_path,
        tiny_model_dir,
        sft={"enabled": True, "episodes": 6, "epochs": 3.0, "batch_size": 4, "lr": 3e-3},
        eval={"episodes": 1},
    )
    assert main(["sft", str(recipe), "--out", str(tmp_path / "sft")]) == 0
    assert "success on 1 held-out seeds" in capsys.readouterr().out
    losses = [r["sft/loss"] for r in read_jsonl(tmp_path / "sft_metrics.jsonl")]
    assert len(losses) >= 4 and losses[-1] < losses[0]  # likelihood of the demonstrations went up
    assert (tmp_path / "sft" / "config.json").is_file()


def test_missing_model_is_built_or_explained(tmp_path):
    from rollhub.core.errors import UserError
    from rollhub.trainer.build import ensure_model

    config = load_config(RunConfig, None, [f"model.path={tmp_path / 'tiny'}", "model.init_tiny=5m"])
    assert (ensure_model(config) / "config.json").is_file()
    config = load_config(RunConfig, None, [f"model.path={tmp_path / 'absent'}", "model.init_tiny=null"])
    with pytest.raises(UserError, match="init_tiny"):
        ensure_model(config)


def test_rollhub_eval_reports_success(tiny_model_dir, tmp_path, capsys):
    recipe = _recipe(tmp_path, tiny_model_dir, eval={"episodes": 2})
    assert main(["eval", str(recipe), "--model", str(tiny_model_dir)]) == 0
    assert "success on 2 held-out seeds" in capsys.readouterr().out
    assert main(["eval", str(recipe), "--model", str(tmp_path / "nothing")]) == 2


def test_collapse_warning_names_the_cause():
    from rollhub.trainer.learner import collapse_warning

    healthy = {"batch/groups": 8, "batch/zero_advantage_groups": 3, "train/format_error_rate": 0.9}
    assert collapse_warning(healthy) is None
    collapsed = {"batch/groups": 8, "batch/zero_advantage_groups": 8, "train/format_error_rate": 0.97}
    assert "collapsed" in collapse_warning(collapsed) and "97%" in collapse_warning(collapsed)
    solved_alike = {"batch/groups": 8, "batch/zero_advantage_groups": 8, "train/format_error_rate": 0.0}
    assert "taught nothing" in collapse_warning(solved_alike)
    assert collapse_warning(solved_alike, trained=False) is None  # the skipped update was already reported
    assert "collapsed" in collapse_warning(collapsed, trained=False)
    assert collapse_warning({}) is None
    # as many format errors from the first step on: not a collapse, a policy never taught the format
    never_taught = collapse_warning(collapsed, start_format_errors=0.9)
    assert "collapsed" not in never_taught and "does not know the answer format" in never_taught
    assert "collapsed" in collapse_warning(collapsed, start_format_errors=0.1)
    # as many format errors as at the start, but earlier steps had groups that scored unalike: a batch
    # of hard tasks all failed, not a policy that cannot write the format (MathTool: ~50% of turns)
    hard_batch = {"batch/groups": 4, "batch/zero_advantage_groups": 4, "train/format_error_rate": 0.5}
    assert "does not know" in collapse_warning(hard_batch, start_format_errors=0.54)
    assert collapse_warning(hard_batch, trained=False, start_format_errors=0.54, had_signal=True) is None
    assert "taught nothing" in collapse_warning(hard_batch, start_format_errors=0.54, had_signal=True)
    assert "collapsed" in collapse_warning(collapsed, start_format_errors=0.1, had_signal=True)


def test_eval_samples_per_seed_plays_every_seed_that_many_times(tiny_model_dir, tmp_path, capsys):
    from rollhub.trainer.evaluate import evaluate_model_dir

    recipe = _recipe(tmp_path, tiny_model_dir, eval={"episodes": 2, "samples_per_seed": 3, "temperature": 1.0})
    config = load_config(RunConfig, recipe)
    result = asyncio.run(evaluate_model_dir(config, tiny_model_dir))
    seeds = sorted(t.seed for t in result.trajectories)
    assert seeds == sorted(config.eval.seeds * 3)
    assert len({t.trajectory_id for t in result.trajectories}) == 6  # distinct draws, not one episode counted thrice
    assert result.success_rate == sum(t.success for t in result.trajectories) / 6
    assert main(["eval", str(recipe), "--model", str(tiny_model_dir)]) == 0
    assert "2 held-out seeds x 3 samples" in capsys.readouterr().out
    from rollhub.core.errors import UserError

    with pytest.raises(UserError, match="eval: samples_per_seed must be >= 1"):
        load_config(RunConfig, recipe, ["eval.samples_per_seed=0"])


def test_eval_greedy_adds_a_greedy_reading_of_the_warm_start_and_the_final_policy(tiny_model_dir, tmp_path, capsys):
    from rollhub.trainer.evaluate import evaluate_model_dir

    eval_section = {"episodes": 3, "samples_per_seed": 2, "temperature": 1.0, "greedy": True}
    recipe = _recipe(tmp_path, tiny_model_dir, eval=eval_section)
    assert main(["train", str(recipe), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "warm-start success on 3 held-out seeds x 1 greedy" in out and "greedy success (3 held-out" in out
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    warm = json.loads((run / "warmstart.json").read_text())
    assert summary["warmstart_greedy_success_rate"] == warm["greedy_success_rate"]
    # the reading is the final policy played greedily, one episode a seed: the same number as
    # evaluating final_model/ at T = 0 apart from the job
    config = load_config(RunConfig, recipe, ["eval.temperature=0", "eval.samples_per_seed=1"])
    alone = asyncio.run(evaluate_model_dir(config, run / "final_model"))
    assert len(alone.trajectories) == 3
    assert summary["final_greedy_success_rate"] == alone.success_rate
    final_row = [r for r in read_jsonl(run / "metrics.jsonl") if "eval/greedy_success_rate" in r][-1]
    assert final_row["eval/greedy_success_rate"] == alone.success_rate
    # at T = 0 the main reading is already greedy: no second one
    assert not load_config(RunConfig, recipe, ["eval.temperature=0"]).eval.greedy_reading
    assert not load_config(RunConfig, recipe, ["eval.greedy=false"]).eval.greedy_reading


def test_eval_baselines_read_the_same_seeds_with_other_env_kwargs_before_and_after(tiny_model_dir, tmp_path, capsys):
    from rollhub.core.errors import UserError

    env = {"id": "rollhub/MathTool-v0", "kwargs": {"split": "train", "tools": "python", "max_turns": 2}}
    eval_section = {"episodes": 3, "env": {"kwargs": {"split": "test"}}, "baselines": {"no_tool": {"tools": "none"}}}
    recipe = _recipe(tmp_path, tiny_model_dir, env=env, eval=eval_section, agent={"max_new_tokens": 8})
    assert main(["train", str(recipe), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "warm-start success on the same seeds, no_tool (tools=none)" in out
    assert "the same seeds, no_tool: warm-start" in out and "tool use on 3 held-out seeds" in out
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    reading = summary["baselines"]["no_tool"]
    assert set(reading) == {"warmstart", "final"} and reading["final"]["success_rate"] is not None
    # the main reading had the tool (its call rate is counted), the baseline had none (no call rate)
    assert "tool_call_rate" in summary["final_eval"] and "tool_call_rate" not in reading["final"]
    assert "tool_call_rate" in summary["warmstart_eval"] and "tool_call_rate" not in reading["warmstart"]
    rows = read_jsonl(run / "metrics.jsonl")
    assert "eval/no_tool/success_rate" in rows[0] and "eval/no_tool/success_rate" in rows[-1]
    assert "train/tool_call_rate" in rows[1] and "train/env/tool_calls" in rows[1]  # the env's own counts
    # a baseline's kwargs are checked like evaluation's own, before any model loads
    with pytest.raises(UserError, match="eval.baselines.no_tool.toolz"):
        from rollhub.trainer.build import check_run_envs

        check_run_envs(load_config(RunConfig, recipe, ["eval.baselines.no_tool={toolz: none}"]))
    with pytest.raises(UserError, match="train"):  # a reading on training problems is no held-out reading
        check_run_envs(load_config(RunConfig, recipe, ["eval.baselines.no_tool={split: train}"]))
    with pytest.raises(UserError, match="eval.baselines"):
        load_config(RunConfig, recipe, ["eval.baselines.no_tool={}"])
