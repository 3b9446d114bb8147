"""`log.trackers`: a tiny `rollhub train` run logs its step metrics to W&B (offline) and MLflow (file store)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from trainer_testing import tiny_recipe

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.trainer import trackers
from rollhub.trainer.config import RunConfig
from rollhub.trainer.metrics import read_jsonl


def wandb_history(run_dir: Path) -> dict[int, dict[str, float]]:
    """The history records (step -> scalars) of the offline W&B run under `run_dir/wandb`: its
    .wandb file is a LevelDB-style log (32 KiB blocks, 7-byte record headers) of protobuf records."""
    from wandb.proto import wandb_internal_pb2

    data = next((run_dir / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    position, block, pending, history = 7, 32768, b"", {}
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                history[record.history.step.num] = items
    return history


def test_a_tiny_run_logs_its_step_metrics_to_wandb_and_mlflow(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # restored after the test (the tracker sets it too)
    recipe = tiny_recipe(
        tmp_path, tiny_model_dir, log={"trackers": ["tensorboard", "wandb", "mlflow"], "project": "tiny-test"}
    )
    assert main(["train", str(recipe), "--no-progress"]) == 0
    run = tmp_path / "run"
    losses = {r["step"]: r["train/loss"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r}
    assert sorted(losses) == [1, 2]
    ids = json.loads((run / "trackers.json").read_text())

    history = wandb_history(run)
    assert {step: history[step]["train/loss"] for step in losses} == pytest.approx(losses)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    logged = {m.step: m.value for m in client.get_metric_history(ids["mlflow"], "train/loss")}
    assert logged == pytest.approx(losses)
    assert client.get_experiment_by_name("tiny-test") is not None
    assert client.get_run(ids["mlflow"]).data.params["env.id"] == "rollhub/Sokoban-v0"


def test_tracker_choices_are_checked_before_the_run(monkeypatch):
    with pytest.raises(UserError, match=r"log.trackers must be distinct names among .*got \['neptune'\]"):
        load_config(RunConfig, None, ["log.trackers=[neptune]"])
    monkeypatch.setitem(trackers.MODULES, "wandb", "rollhub_no_such_tracker_package")  # as if not installed
    with pytest.raises(
        UserError, match=r"log.trackers: wandb needs the 'trackers' extra: pip install -e '.\[trackers\]'"
    ):
        load_config(RunConfig, None, ["log.trackers=[tensorboard, wandb]"])
    assert load_config(RunConfig, None, []).log.trackers == ["tensorboard"]


def test_a_resumed_run_continues_the_same_tracker_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    first = trackers.build_trackers(tmp_path, ["mlflow"], project="resume-test", config={"seed": 3})
    first[0].log(1, {"train/loss": 0.5})
    first[0].close()
    again = trackers.build_trackers(tmp_path, ["mlflow"], project="resume-test")
    again[0].log(2, {"train/loss": 0.25})
    again[0].close()
    assert again[0].run_id == first[0].run_id == json.loads((tmp_path / "trackers.json").read_text())["mlflow"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    history = client.get_metric_history(first[0].run_id, "train/loss")
    assert {m.step: m.value for m in history} == {1: 0.5, 2: 0.25}
