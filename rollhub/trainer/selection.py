"""Checkpoint selection on validation seeds (`eval.select`): which weights a run hands over.

A small policy's held-out success can swing by several points within tens of RL steps, so
the policy of the last step is a noisy pick. With
`eval.select.episodes > 0` the loop scores the policy on validation seeds after the
warm-start (so RL that only hurts hands the warm-start back), every `eval.select.every`
steps and after the last; the best weights are kept in
RUN_DIR/best_model (with RUN_DIR/best.json) and become the run's final policy. The
held-out seeds take no part in the choice (their range is checked apart from the
validation range), so the final held-out reading stays one honest draw; the last step's
policy is scored on the held-out seeds too and reported beside it. Where tasks repeat across
seeds (small Sokoban rooms), distinct seeds are not enough: `eval.select.kwargs` points the
validation readings at tasks of their own (Sokoban's `split: validation`), and the run refuses
to start while they overlap training or the held-out tasks by content
(`rollhub.trainer.build.check_run_envs`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollhub.trainer.evaluate import EvalResult, evaluate_held_out
from rollhub.trainer.progress import NO_PROGRESS, JobProgress

if TYPE_CHECKING:
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.policy import Policy

BEST_MODEL_DIR = "best_model"
BEST_FILE = "best.json"


@dataclass
class Pick:
    """The best validation reading so far: its RL step and success rate."""

    step: int
    success_rate: float


class CheckpointSelector:
    """Scores the policy on the validation seeds and keeps the best weights on disk."""

    def __init__(self, config: RunConfig, run_dir: Path, *, resumed_at: int | None = None):
        self.config = config
        self.run_dir = Path(run_dir)
        select = config.eval.select
        # the held-out evaluation's settings with the validation seeds and tasks (`eval.select.kwargs`,
        # e.g. a validation split) in place of the held-out ones
        self.validation = dataclasses.replace(
            config,
            eval=dataclasses.replace(
                config.eval,
                episodes=select.episodes,
                seed_offset=select.seed_offset,
                samples_per_seed=select.samples_per_seed,
                env=dataclasses.replace(config.eval.env, id=config.eval_env_id, kwargs=config.select_env_kwargs),
            ),
        )
        self.best: Pick | None = None
        self.last: Pick | None = None
        if resumed_at is not None:
            self.best = self._load(resumed_at)

    @property
    def best_dir(self) -> Path:
        return self.run_dir / BEST_MODEL_DIR

    def _load(self, resumed_at: int) -> Pick | None:
        """The pick of an earlier process of this run; a pick from after the checkpoint it
        resumes from is dropped (the resumed run trains those steps again, differently)."""
        path = self.run_dir / BEST_FILE
        if not path.is_file() or not (self.best_dir / "config.json").is_file():
            return None
        data = json.loads(path.read_text())
        pick = Pick(int(data["step"]), float(data["success_rate"]))
        return pick if pick.step <= resumed_at else None

    def due(self, step: int) -> bool:
        every = self.config.eval.select.every
        return step % every == 0 and step < self.config.train.steps

    async def score(self, engine: Any, tokenizer: Any, *, progress: JobProgress = NO_PROGRESS) -> EvalResult:
        """Success on the validation seeds with the engine's current weights (a `validation` bar on `progress`)."""
        return await evaluate_held_out(engine, tokenizer, self.validation, progress=progress, label="validation")

    def consider(self, step: int, result: EvalResult, policy: Policy) -> bool:
        """Keep `policy` as the best if it scores at least the best so far (ties: the later
        step, which has trained more). Returns whether it was kept."""
        self.last = Pick(step, result.success_rate)
        if self.best is not None and result.success_rate < self.best.success_rate:
            return False
        policy.save_pretrained(self.best_dir)  # atomic: a kill leaves the previous best whole
        self.best = self.last
        tmp = self.run_dir / (BEST_FILE + ".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self.best)))
        tmp.replace(self.run_dir / BEST_FILE)
        return True

    def metrics(self, result: EvalResult) -> dict[str, float]:
        best = self.best
        return {
            "select/success_rate": result.success_rate,
            "select/best_success_rate": best.success_rate if best else result.success_rate,
            "select/best_step": float(best.step if best else 0),
        }

    def best_state_dict(self) -> dict[str, Any]:
        """The best weights by their HF names, as engines load them (tied weights included)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.best_dir)
        return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

    def hand_over(self, final_dir: Path) -> None:
        """The best weights become the run's final model folder."""
        staging = final_dir.with_name(final_dir.name + ".selected")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(self.best_dir, staging)
        shutil.rmtree(final_dir, ignore_errors=True)
        staging.rename(final_dir)
