"""The two sides of `rollhub bench peer-trl`: one leg of TRL's `GRPOTrainer` and one of ours.

A leg trains from the model folder for the step budget and returns what the comparison reads:
the training time of every step, the held-out readings placed on the training clock, and the
held-out problems each reading played. Both sides read held-out success through the same
`evaluate_held_out` (same problems, greedy, same agent settings), and the clock of both
leaves evaluation out, so the curves compare learning per second of training.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.evaluate import EvalResult

logger = logging.getLogger(__name__)

#: our loss aggregation for each TRL `loss_type` that has one (one batch per optimizer step, so
#: TRL's batch-token normalisations "dapo" and "bnpo" are both a mean over the batch's tokens)
TRL_LOSS_AGGREGATION = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "bnpo": "token-mean"}


def reading(result: EvalResult, step: int, train_s: float) -> dict[str, Any]:
    """One held-out reading on the training clock, with the problems it played (seed order)."""
    played = sorted((t for t in result.trajectories if t.turns), key=lambda t: t.seed or 0)
    return {
        "step": step,
        "train_s": train_s,
        "success": result.success_rate,
        "format_error_rate": result.format_error_rate,
        "problems": [str(t.turns[0].anchor) for t in played],
    }


# --- ours -----------------------------------------------------------------------------------


def run_ours(config: RunConfig) -> dict[str, Any]:
    """Our trainer (`rollhub train`'s job) on `config`; its metrics file gives the clock.

    A step's training time is the wait for its batch plus the update and weight push
    (`time/wait_for_batch_s` + `time/train_s`): the after-step hooks, the periodic held-out
    reading among them, are left out. Asynchronous generation keeps running during a reading,
    so the step after one waits less than a steady step would; the summary leaves such steps out.
    """
    from rollhub.trainer.job import run_training
    from rollhub.trainer.metrics import read_jsonl

    summary = asyncio.run(run_training(config, progress=False, print_fn=logger.info))
    records = read_jsonl(Path(config.run_dir) / "metrics.jsonl")
    steps = sorted((r for r in records if "time/step_s" in r), key=lambda r: r["policy/version"])
    step_s = [float(r["time/wait_for_batch_s"]) + float(r["time/train_s"]) for r in steps]
    clock = [0.0]
    for seconds in step_s:
        clock.append(clock[-1] + seconds)
    readings = []
    if summary.warmstart is not None:
        readings.append(reading(summary.warmstart, 0, 0.0))
    for record in steps:  # periodic readings: their problems are the same seeds, not kept per reading
        version = int(record["policy/version"])
        if "eval/success_rate" in record and version < len(steps):
            readings.append(
                {
                    "step": version,
                    "train_s": clock[version],
                    "success": float(record["eval/success_rate"]),
                    "format_error_rate": float(record["eval/format_error_rate"]),
                    "problems": readings[0]["problems"] if readings else [],
                }
            )
    if summary.final is not None:
        readings.append(reading(summary.final, len(steps), clock[-1]))
    return {
        "steps": len(steps),
        "step_s": step_s,
        "train_success": [float(r.get("train/success_rate", 0.0)) for r in steps],
        "readings": readings,
    }


# --- TRL ------------------------------------------------------------------------------------


def training_prompts(config: RunConfig, count: int) -> tuple[list[list[dict[str, str]]], list[int]]:
    """The first `count` training problems our rollout draws (seeds config.train_seed_start, +1, ...), as
    the chat messages our agent sends: TRL's unshuffled dataset plays them in the same order."""
    from rollhub.envs.registry import make

    seeds = list(range(config.train_seed_start, config.train_seed_start + count))

    async def opening(seed: int) -> list[dict[str, str]]:
        env = make(config.env.id, **config.env.kwargs)
        try:
            observation, _ = await env.reset(seed=seed)
        finally:
            await env.close()
        return prompt_messages(observation, config.agent.system_prompt)

    async def all_openings() -> list[list[dict[str, str]]]:
        return [await opening(seed) for seed in seeds]

    return asyncio.run(all_openings()), seeds


def prompt_messages(observation: list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    """The opening messages with agent.system_prompt applied as our agent does (None keeps the
    env's, "" drops it, other text replaces or adds it)."""
    messages = [dict(m) for m in observation]
    if system_prompt is None:
        return messages
    rest = [m for m in messages if m["role"] != "system"]
    return rest if system_prompt == "" else [{"role": "system", "content": system_prompt}, *rest]


class EnvReward:
    """TRL reward function: each completion is played as the action of a fresh env reset to its
    prompt's seed, and the env's reward is the reward (what our agent gets for a single turn)."""

    def __init__(self, config: RunConfig) -> None:
        self.env_id, self.env_kwargs = config.env.id, dict(config.env.kwargs)
        self.batches: list[float] = []  # success rate of each scored batch

    def __call__(self, prompts: list[Any], completions: list[Any], seed: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        scored = asyncio.run(self._score(texts, [int(s) for s in seed]))
        self.batches.append(sum(success for _, success in scored) / max(1, len(scored)))
        return [reward for reward, _ in scored]

    async def _score(self, texts: list[str], seeds: list[int]) -> list[tuple[float, bool]]:
        from rollhub.envs.registry import make

        async def one(text: str, seed: int) -> tuple[float, bool]:
            env = make(self.env_id, **self.env_kwargs)
            try:
                await env.reset(seed=seed)
                _, reward, _, _, info = await env.step(text)
                return float(reward), bool(info.get("success", False))
            finally:
                await env.close()

        return list(await asyncio.gather(*(one(t, s) for t, s in zip(texts, seeds))))


def evaluate_weights(model: Any, tokenizer: Any, config: RunConfig, threads: int) -> EvalResult:
    """Held-out success of `model`'s current weights through our evaluator: a copy of the model
    in an in-process engine, so the training model and its optimizer state are never touched."""
    from rollhub.inference.engines.hf import HFEngine
    from rollhub.trainer.evaluate import evaluate_held_out

    snapshot = copy.deepcopy(model).eval()
    device = str(next(snapshot.parameters()).device)
    engine = HFEngine(snapshot, tokenizer, threads=threads, max_batch_size=config.engine.max_batch_size, device=device)

    async def play() -> EvalResult:
        try:
            return await evaluate_held_out(engine, tokenizer, config)
        finally:
            await engine.close()

    return asyncio.run(play())


def trl_arguments(config: RunConfig, out_dir: Path, *, steps: int, loss_type: str, use_cpu: bool) -> Any:
    """TRL's GRPOConfig for the settings the comparison holds equal; the rest stay TRL's defaults.

    One generation per optimizer step (prompts x group completions, no gradient accumulation),
    a constant learning rate without warmup (ours has no decay in this comparison either), no
    KL term (beta 0, TRL's default), one update per batch, PPO clip `loss.clip_low` both sides,
    gradient checkpointing as `model.gradient_checkpointing` says.
    """
    from trl import GRPOConfig

    batch = config.rollout.groups_per_batch * config.rollout.group_size
    return GRPOConfig(
        output_dir=str(out_dir),
        max_steps=steps,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=config.rollout.group_size,
        max_completion_length=config.agent.max_new_tokens,
        temperature=config.agent.temperature,
        top_p=config.agent.top_p,
        learning_rate=config.optim.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=config.optim.weight_decay,
        adam_beta1=config.optim.beta1,
        adam_beta2=config.optim.beta2,
        adam_epsilon=config.optim.eps,
        max_grad_norm=config.optim.max_grad_norm,
        beta=0.0,
        num_iterations=1,
        epsilon=config.loss.clip_low_bound,
        loss_type=loss_type,
        shuffle_dataset=False,
        seed=config.seed,
        gradient_checkpointing=config.model.gradient_checkpointing,
        use_cpu=use_cpu,
        bf16=False,
        fp16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        torch_compile=False,
    )


def run_trl(
    config: RunConfig, model_dir: Path, out_dir: Path, *, steps: int, loss_type: str, threads: int
) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same model folder, problems (in order), batch and budget as `config`.

    The clock: a step runs from the end of the previous one (or of the reading before it) to
    TRL's `on_step_end`, so it holds generation, scoring, the update and TRL's own bookkeeping;
    held-out readings (at the start, every eval.every steps and at the end) stand outside it.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    use_cpu = not torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eval_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eval_tokenizer.padding_side = "left"
    prompts, seeds = training_prompts(config, steps * config.rollout.groups_per_batch)
    reward = EnvReward(config)
    every = config.eval.every

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.readings: list[dict[str, Any]] = []
            self.mark = time.perf_counter()

        def read(self, step: int) -> None:
            result = evaluate_weights(model, eval_tokenizer, config, threads)
            self.readings.append(reading(result, step, sum(self.step_s)))

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.read(0)
            self.mark = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_s.append(time.perf_counter() - self.mark)
            if every and state.global_step % every == 0 and state.global_step < steps:
                self.read(state.global_step)
            self.mark = time.perf_counter()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.read(state.global_step)

    clock = Clock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=trl_arguments(config, out_dir, steps=steps, loss_type=loss_type, use_cpu=use_cpu),
        train_dataset=Dataset.from_dict({"prompt": prompts, "seed": seeds}),
        processing_class=trainer_tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    return {
        "steps": len(clock.step_s),
        "step_s": clock.step_s,
        "train_success": reward.batches,
        "readings": clock.readings,
    }
