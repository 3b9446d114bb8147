"""SWE train/eval splits by package, and the trainer's refusal of overlapping sets (no Docker needed)."""

import json

import pytest

from rollhub.core.errors import UserError


def _run_config(env_kwargs, eval_kwargs=None, eval_id=""):
    from rollhub.trainer.config import EvalEnvConfig, RunConfig

    config = RunConfig()
    config.env.id = "rollhub/SWE-v0"
    config.env.kwargs = dict(env_kwargs)
    config.eval.env = EvalEnvConfig(id=eval_id, kwargs=dict(eval_kwargs or {}))
    return config


def test_shipped_splits_are_disjoint_packages_covering_every_task():
    from rollhub.envs.swe.tasks import SHIPPED_TASKS, load_tasks, package_of, read_package_splits

    splits = read_package_splits(SHIPPED_TASKS)
    train = load_tasks(SHIPPED_TASKS, "train")
    held_out = load_tasks(SHIPPED_TASKS, "eval")
    every = load_tasks(SHIPPED_TASKS)
    train_packages = {package_of(t.row) for t in train}
    eval_packages = {package_of(t.row) for t in held_out}
    assert train_packages == set(splits["train"]) and eval_packages == set(splits["eval"])
    assert not train_packages & eval_packages
    assert len(train) + len(held_out) == len(every)  # no package left in neither split
    assert {t.instance_id for t in train}.isdisjoint(t.instance_id for t in held_out)


def test_training_and_evaluating_on_the_same_split_is_refused_in_one_line():
    from rollhub.trainer.build import check_run_envs

    with pytest.raises(UserError) as caught:
        check_run_envs(_run_config({"split": "train"}))  # eval.env defaults to the training env
    message = str(caught.value)
    assert "evaluation overlaps training" in message and "\n" not in message


def test_train_and_eval_splits_pass_and_eval_inherits_the_other_kwargs():
    from rollhub.trainer.build import check_run_envs, make_eval_env_factory

    config = _run_config({"split": "train", "max_steps": 7}, {"split": "eval"})
    check_run_envs(config)
    env = make_eval_env_factory(config)()
    assert env.max_steps == 7 and {t.row["rollhub"]["package"] for t in env.tasks} == {
        "parse",
        "toolz",
        "python-slugify",
    }


def test_a_shared_package_is_an_overlap_even_with_different_tasks(tmp_path):
    from rollhub.envs.swe.tasks import SHIPPED_TASKS, read_rows
    from rollhub.trainer.build import check_run_envs

    rows = [r for r in read_rows(SHIPPED_TASKS) if r["rollhub"]["package"] == "parse"]
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    second.write_text("".join(json.dumps(r) + "\n" for r in rows[3:6]))
    with pytest.raises(UserError, match="package parse"):
        check_run_envs(_run_config({"tasks": str(first)}, {"tasks": str(second)}))


def test_a_splits_file_naming_a_package_twice_is_refused(tmp_path):
    from rollhub.envs.swe.tasks import SHIPPED_TASKS, load_tasks

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(SHIPPED_TASKS.read_text())
    (tmp_path / "splits.json").write_text(json.dumps({"train": ["parse", "inflection"], "eval": ["Parse"]}))
    with pytest.raises(UserError, match="in both train and eval"):
        load_tasks(tasks, "train")
    (tmp_path / "splits.json").unlink()
    with pytest.raises(UserError, match="splits.json"):
        load_tasks(tasks, "eval")


def test_the_train_command_refuses_an_overlapping_run_before_any_model_loads(tmp_path, capsys):
    from rollhub.cli import main

    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "configs/swe_smollm2.yaml",
            "--set",
            f"run_dir={run_dir}",
            "--set",
            "eval.env.kwargs.split=train",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "evaluation overlaps training" in err and "Traceback" not in err
    assert not (run_dir / "sft_model").exists()
