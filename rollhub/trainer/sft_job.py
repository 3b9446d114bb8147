"""The SFT warm-start: scripted-expert demonstrations through the real agent loop, then SFT epochs.

`warm_start` is the training job's phase (the model saved to the run's sft_model/, then its
marker); `rollhub sft CONFIG` runs the phase on its own and reads the held-out success.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rollhub.rollout.agent import run_episode
from rollhub.rollout.prompting import ChatSegments
from rollhub.trainer.build import build_policy, check_run_envs, ensure_model, make_sft_env_factory, seed_everything
from rollhub.trainer.checkpoint import atomic_write_text
from rollhub.trainer.config import RunConfig
from rollhub.trainer.evaluate import evaluate_model_dir
from rollhub.trainer.metrics import MetricsLog
from rollhub.trainer.policy import Policy
from rollhub.trainer.progress import NO_PROGRESS, JobProgress, silence_library_progress
from rollhub.trainer.run_dir import SFT_DONE_FILE
from rollhub.trainer.run_lock import hold_run_dir
from rollhub.trainer.sft import ExpertEngine, sft_epochs, sft_sequence_count, sft_step_count

logger = logging.getLogger(__name__)


async def collect_demonstrations(
    config: RunConfig, tokenizer: Any, *, progress: JobProgress = NO_PROGRESS
) -> list[Any]:
    """Scripted-expert episodes through the real agent loop (identical token layout)."""
    make_env = make_sft_env_factory(config)
    segments = ChatSegments(tokenizer)
    demos = []
    with progress.phase("SFT demos", total=config.sft.episodes) as bar:
        for k in range(config.sft.episodes):
            env = make_env()
            seed = config.sft.seed_offset + k
            expert = ExpertEngine(env, tokenizer, noise=config.sft.noise, rng=random.Random(seed))
            try:
                demos.append(
                    await run_episode(
                        env, expert, tokenizer, config.agent, seed, env_id=config.env.id, segments=segments
                    )
                )
            finally:
                await env.close()
            bar.advance(1, info=f"solved {sum(d.success for d in demos)}/{len(demos)}")
    solved = sum(d.success for d in demos)
    logger.info("collected %d expert demonstrations (%d solved)", len(demos), solved)
    return [d for d in demos if d.success] or demos


async def fine_tune_on_demos(
    config: RunConfig, policy: Policy, log_dir: Path, *, progress: JobProgress = NO_PROGRESS
) -> tuple[list[Any], list[dict]]:
    """Collect the expert demos and run the SFT epochs (log in log_dir/sft_metrics.jsonl, started
    empty: lines of an interrupted attempt would be counted twice); returns (demos, history)."""
    demos = await collect_demonstrations(config, policy.tokenizer, progress=progress)
    sft_log = MetricsLog(log_dir, tensorboard=False, filename="sft_metrics.jsonl")
    sft_log.truncate_after(-1)
    steps = sft_step_count(sft_sequence_count(demos), config.sft.epochs, config.sft.batch_size)
    with progress.phase("SFT", total=steps) as bar:

        def on_step(step: int, metrics: dict[str, float]) -> None:
            sft_log.log(step, metrics)
            bar.update(completed=step, info=f"loss {metrics['sft/loss']:.3f}")

        history = await asyncio.to_thread(
            _with_threads,
            config.sft.torch_threads(config),
            sft_epochs,
            policy,
            demos,
            epochs=config.sft.epochs,
            lr=config.sft.lr,
            batch_size=config.sft.batch_size,
            seed=config.seed,
            on_step=on_step,
        )
    return demos, history


def _with_threads(threads: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` with `threads` torch threads, the previous count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_num_threads(before)


async def warm_start(
    config: RunConfig,
    policy: Policy,
    sft_dir: Path,
    *,
    print_fn: Callable[[str], None],
    progress: JobProgress = NO_PROGRESS,
) -> float:
    """SFT of `policy` on scripted-expert demos, saved to `sft_dir`; returns its wall time.

    The model folder is saved atomically (`Policy.save_pretrained`), and `SFT_DONE_FILE` is
    written after it: the job trusts the SFT model only when that marker exists. An
    interrupted SFT is redone from scratch, so its metrics log starts empty too.
    """
    started = time.perf_counter()
    demos, history = await fine_tune_on_demos(config, policy, sft_dir.parent, progress=progress)
    policy.save_pretrained(sft_dir)
    wall = time.perf_counter() - started
    done = {"demos": len(demos), "steps": len(history), "final_loss": history[-1]["sft/loss"], "wall_s": wall}
    atomic_write_text(sft_dir.parent / SFT_DONE_FILE, json.dumps(done))
    print_fn(
        f"SFT warm-start: {len(demos)} demos, {len(history)} steps, "
        f"final loss {history[-1]['sft/loss']:.3f} ({wall:.0f}s)"
    )
    return wall


async def run_sft_job(
    config: RunConfig, *, out_dir: str | None = None, print_fn=print, progress: bool = False
) -> float:
    """Fine-tune on expert demos, save the model, print and return held-out success. Without `out_dir`
    the model goes to RUN_DIR/sft_model, and the run folder is locked meanwhile (rollhub.trainer.run_lock)."""
    torch.set_num_threads(config.model.threads)
    check_run_envs(config)  # both envs' kwargs and train/eval overlap, before the model loads
    seed_everything(config.seed)
    silence_library_progress()
    started = time.perf_counter()
    out = Path(out_dir) if out_dir else Path(config.run_dir) / "sft_model"
    lock = contextlib.nullcontext() if out_dir else hold_run_dir(config.run_dir)
    with lock, JobProgress(progress) as display:
        policy = build_policy(config, ensure_model(config, progress=display))
        demos, history = await fine_tune_on_demos(config, policy, out.parent, progress=display)
        policy.save_pretrained(out)
        result = await evaluate_model_dir(config, out, progress=display)
    print_fn(f"SFT: {len(demos)} demos, {len(history)} steps, loss {history[-1]['sft/loss']:.3f}; model at {out}")
    print_fn(f"success on {config.eval.label}: {result.describe()} ({time.perf_counter() - started:.0f}s)")
    return result.success_rate
