"""Experiment trackers beside TensorBoard: Weights & Biases and MLflow, chosen by `log.trackers`.

    log:
      trackers: [tensorboard, wandb, mlflow]
      project: my-project        # W&B project, MLflow experiment

Each tracker receives the same finite scalars as TensorBoard, at the same step (the policy
version), from `MetricsLog.log`. Both packages are optional (`pip install -e '.[trackers]'`); a
tracker that is asked for but not installed is a one-line error when the config is checked,
before any model loads. Their own settings come from their usual environment variables:
`WANDB_MODE=offline` keeps W&B on disk (`WANDB_DIR`, default the run folder), and MLflow writes
to `MLFLOW_TRACKING_URI` or, without one, to `mlruns/` inside the run folder (MLflow's file
backend, which needs no server or database; rollhub sets `MLFLOW_ALLOW_FILE_STORE` for it). A
tracker that fails to start (not logged in, a server down) is a one-line error.

A resumed run continues the same tracker run: the first start writes each tracker's run id to
`trackers.json` in the run folder, and a resume reopens that id. Steps a resume redoes are
logged again there (TensorBoard and metrics.jsonl drop them; W&B keeps the later value).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Protocol

from rollhub.core.errors import MissingExtraError, UserError

TRACKERS = ("tensorboard", "wandb", "mlflow")
#: tracker -> the module it needs (tensorboard comes with torch)
MODULES = {"wandb": "wandb", "mlflow": "mlflow"}
IDS_FILE = "trackers.json"


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def check_installed(trackers: list[str]) -> None:
    """A one-line error naming the extra when a chosen tracker's package is missing."""
    for name in trackers:
        module = MODULES.get(name)
        if module and importlib.util.find_spec(module) is None:
            raise MissingExtraError("trackers", f"log.trackers: {name}")


class WandbTracker:
    """One W&B run per rollhub run (resumed by id)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict[str, Any], run_id: str | None):
        import os

        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            resume="allow" if run_id else None,
            dir=os.environ.get("WANDB_DIR", str(run_dir)),
            config=config,
        )
        self.run_id = self.run.id

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """One MLflow run per rollhub run, in the experiment named `project`."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict[str, Any], run_id: str | None):
        import os

        import mlflow

        self._mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):  # MLflow's file backend: no server, no database
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_id=run_id, run_name=None if run_id else name)
        self.run_id = self.run.info.run_id
        if not run_id:
            flat = _flatten(config)
            for start in range(0, len(flat), 100):  # MLflow takes at most 100 params per call
                mlflow.log_params(dict(list(flat.items())[start : start + 100]))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        # MLflow metric names allow letters, digits and _ - . / and spaces only
        self._mlflow.log_metrics({_mlflow_key(k): v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


def build_trackers(
    run_dir: str | Path, trackers: list[str], *, project: str, run_name: str = "", config: dict[str, Any] | None = None
) -> list[Tracker]:
    """The chosen trackers other than TensorBoard (MetricsLog writes that one), started now."""
    check_installed(trackers)
    run_dir = Path(run_dir)
    ids_path = run_dir / IDS_FILE
    ids = json.loads(ids_path.read_text()) if ids_path.is_file() else {}
    name = run_name or run_dir.resolve().name
    started: list[Tracker] = []
    for tracker in trackers:
        kind = {"wandb": WandbTracker, "mlflow": MlflowTracker}.get(tracker)
        if kind is None:
            continue
        try:
            instance = kind(run_dir, project, name, config or {}, ids.get(tracker))
        except Exception as exc:  # not logged in, a tracking server that is down, a bad URI
            for other in started:
                other.close()
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise UserError(f"log.trackers: {tracker} could not start: {type(exc).__name__}: {first_line}") from None
        ids[tracker] = instance.run_id
        started.append(instance)
    if started:
        run_dir.mkdir(parents=True, exist_ok=True)
        ids_path.write_text(json.dumps(ids, indent=2) + "\n")
    return started


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)[:500]  # MLflow's limit on a param value
    return flat


def _mlflow_key(key: str) -> str:
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)
