"""One training job's collaborators (built once by `rollhub.trainer.build.build_run`) and its state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollhub.inference.engines.base import InferenceEngine
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.seed_sources import SeedSource
from rollhub.trainer.config import RunConfig
from rollhub.trainer.metrics import MetricsLog
from rollhub.trainer.policy import Policy
from rollhub.trainer.progress import NO_PROGRESS, JobProgress
from rollhub.trainer.ranks.group import RankGroup
from rollhub.trainer.rl_loop import LoopState


@dataclass
class JobState(LoopState):
    """The loop's state and the job's, checkpointed together (`as_dict`, restored with `JobState(**d)`)."""

    warmstart_success: float | None = None
    wall_s: float = 0.0  # job wall time up to the last checkpoint, across resumes
    final_reserve_s: float = 0.0  # what the final readings will cost (train.max_job_wall_s), from the warm-start's

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Run:
    """The collaborators of one training job."""

    config: RunConfig
    run_dir: Path
    policy: Policy
    optimizer: torch.optim.Optimizer
    engine: InferenceEngine
    reference: Policy | None
    buffer: GroupBuffer | None
    seeds: SeedSource
    metrics_log: MetricsLog
    engine_model_dir: Path  # what the engine loaded: the SFT model, or the base model
    state: JobState = field(default_factory=JobState)
    phases: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    prior_wall_s: float = 0.0  # wall time of earlier processes of a resumed run
    ranks: RankGroup | None = None  # trainer ranks this process leads (rollhub.trainer.ranks)
    progress: JobProgress = NO_PROGRESS  # the job's bars (rollhub.trainer.progress); none by default

    def wall_s(self) -> float:
        return self.prior_wall_s + time.perf_counter() - self.started
