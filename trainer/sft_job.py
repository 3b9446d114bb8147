"""`rollhub sft CONFIG`: the warm-start phase on its own (demos -> SFT -> held-out success)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import torch

from rollhub.trainer.config import RunConfig


async def run_sft_job(config: RunConfig, *, out_dir: str | None = None, print_fn=print) -> float:
    """Fine-tune on expert demos, save the model, print and return held-out success."""
    from rollhub.rollout.engines.hf import HFEngine
    from rollhub.trainer.evaluate import evaluate_policy
    from rollhub.trainer.loop import check_env_registered, collect_demonstrations, ensure_model, make_env_factory, seed_everything
    from rollhub.trainer.metrics import MetricsLog
    from rollhub.trainer.policy import Policy
    from rollhub.trainer.sft import sft_epochs

    torch.set_num_threads(config.model.threads)
    check_env_registered(config.env.id)
    seed_everything(config.seed)
    started = time.perf_counter()
    out = Path(out_dir) if out_dir else Path(config.run_dir) / "sft_model"
    policy = Policy(ensure_model(config), device=config.model.device, micro_batch_size=config.optim.micro_batch_size,
                    temperature=config.agent.temperature if config.agent.temperature > 0 else 1.0)
    demos = await collect_demonstrations(config, policy.tokenizer)
    log = MetricsLog(out.parent, tensorboard=False, filename="sft_metrics.jsonl")
    history = await asyncio.to_thread(sft_epochs, policy, demos, epochs=config.sft.epochs, lr=config.sft.lr,
                                      batch_size=config.sft.batch_size, seed=config.seed, on_step=log.log)
    policy.save_pretrained(out)
    engine = HFEngine(out, threads=config.rollout.engine_threads, max_batch_size=config.rollout.engine_max_batch_size, seed=config.rollout.seed)
    try:
        seeds = range(config.eval.seed_offset, config.eval.seed_offset + config.eval.episodes)
        result = await evaluate_policy(engine, policy.tokenizer, make_env_factory(config), config.agent, list(seeds),
                                       temperature=config.eval.temperature, max_concurrent=config.env.max_concurrent, env_id=config.env.id)
    finally:
        await engine.close()
    print_fn(f"SFT: {len(demos)} demos, {len(history)} steps, loss {history[-1]['sft/loss']:.3f}; model at {out}")
    print_fn(f"held-out success on {len(seeds)} seeds: {100 * result.success_rate:.1f}% ({time.perf_counter() - started:.0f}s)")
    return result.success_rate
