"""`rollhub sft CONFIG`: the warm-start phase on its own (demos -> SFT -> held-out success)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from rollhub.trainer.config import RunConfig


async def run_sft_job(config: RunConfig, *, out_dir: str | None = None, print_fn=print) -> float:
    """Fine-tune on expert demos, save the model, print and return held-out success."""
    from rollhub.trainer.build import build_policy, check_run_envs, ensure_model
    from rollhub.trainer.evaluate import evaluate_model_dir
    from rollhub.trainer.loop import fine_tune_on_demos, seed_everything

    torch.set_num_threads(config.model.threads)
    check_run_envs(config)  # both envs' kwargs and train/eval overlap, before the model loads
    seed_everything(config.seed)
    started = time.perf_counter()
    out = Path(out_dir) if out_dir else Path(config.run_dir) / "sft_model"
    policy = build_policy(config, ensure_model(config))
    demos, history = await fine_tune_on_demos(config, policy, out.parent)
    policy.save_pretrained(out)
    result = await evaluate_model_dir(config, out)
    print_fn(f"SFT: {len(demos)} demos, {len(history)} steps, loss {history[-1]['sft/loss']:.3f}; model at {out}")
    print_fn(f"success on {config.eval.label}: {100 * result.success_rate:.1f}% ({time.perf_counter() - started:.0f}s)")
    return result.success_rate
