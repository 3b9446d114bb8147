"""The training job, phase by phase: prepare -> SFT -> build -> restore -> evaluate -> reinforce
-> finish -> report.

  prepare    the model dir (rollhub.trainer.model_source), then lock the run folder
             (rollhub.trainer.run_lock), refuse to overwrite another run or to resume with a
             changed config, find the checkpoint to resume (rollhub.trainer.run_dir)
  SFT        the warm-start on scripted-expert demonstrations, if enabled and not done yet
             (rollhub.trainer.sft_job)
  build      everything the job trains with, once (`rollhub.trainer.build.build_run`)
  restore    a checkpoint over all of it, when resuming
  evaluate   the warm-start on the held-out seeds
  reinforce  the rollout source (`EnvManager`, or `RayRollout` on Ray) feeds `rl_loop`, which
             drives the `PolicyLearner` (rollhub.trainer.rl_loop, rollhub.trainer.learner)
  finish     the same held-out seeds again (the policy eval.select picked, if on), final_model/
  report     summary.json, the learning curve, the before/after lines (rollhub.trainer.report)

Generation never stops while the trainer computes: the env manager keeps filling the buffer up
to (alpha+1)*B groups, and the heavy tensor work runs in a worker thread so the event loop keeps
stepping envs. Sync training is the same loop with alpha = 0 and `lockstep: true` (each batch is
generated, then trained on; nothing runs ahead).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import torch

from rollhub.rollout.source import RolloutSource
from rollhub.trainer.build import (
    build_policy,
    build_rollout,
    build_run,
    check_run_envs,
    ensure_model,
    seed_everything,
    start_engine,
    unsharded_config,
)
from rollhub.trainer.config import RunConfig
from rollhub.trainer.evaluate import EvalResult, evaluate_held_out
from rollhub.trainer.learner import PolicyLearner
from rollhub.trainer.logprob_check import version0_check
from rollhub.trainer.memory_plan import check_run_memory
from rollhub.trainer.progress import JobProgress, PhaseBar, silence_library_progress
from rollhub.trainer.ranks.group import RankGroup
from rollhub.trainer.report import TrainingSummary, greedy_metrics, report
from rollhub.trainer.rl_loop import AfterStep, LoopState, rl_loop
from rollhub.trainer.run import Run
from rollhub.trainer.run_dir import SFT_MODEL_DIR, WARMSTART_FILE, open_run_dir, restore, save, sft_model_ready
from rollhub.trainer.run_lock import hold_run_dir
from rollhub.trainer.selection import CheckpointSelector
from rollhub.trainer.sft_job import warm_start
from rollhub.trainer.step_metrics import rollout_metrics
from rollhub.trainer.update import ppo_update

logger = logging.getLogger(__name__)


async def run_training(
    config: RunConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool | JobProgress = True,
    print_fn: Callable[[str], None] = print,
    ranks: RankGroup | None = None,
) -> TrainingSummary:
    """The whole job (see module docstring). Returns warm-start and final evaluations.

    The run folder is locked for the job's life (rollhub.trainer.run_lock): a second run on it is
    refused. `overwrite`: a fresh run may replace the files of an earlier run in the folder.
    `progress`: bars for every long phase (rollhub.trainer.progress), or a display of the caller's.
    `ranks`: this process is rank 0 of a group of trainer ranks (rollhub.trainer.ranks);
    everything but the tensor work of the policy (updates, weight gathers, checkpoints) stays here.
    """
    job_started = time.perf_counter()
    # prepare
    torch.set_num_threads(config.model.threads)
    check_run_envs(config)  # both envs' names and types, and train/eval overlap, before the model loads
    if "ray" in (config.cluster.backend, config.engine.placement):  # fail before the warm-start, not after it
        from rollhub.rollout.cluster.backend import import_ray

        import_ray()
    silence_library_progress()
    display = progress if isinstance(progress, JobProgress) else JobProgress(progress)
    with display:
        seed_everything(config.seed)
        t = time.perf_counter()
        model_dir = ensure_model(config, progress=display)  # a model path that resolves to nothing: no run folder
        check_run_memory(config, model_dir, print_fn=print_fn)  # a GPU run that cannot fit stops here, knobs named
        prepare_s = time.perf_counter() - t
        with hold_run_dir(config.run_dir):
            return await _locked_job(
                config,
                model_dir,
                resume=resume,
                overwrite=overwrite,
                progress=display,
                print_fn=print_fn,
                ranks=ranks,
                job_started=job_started,
                prepare_s=prepare_s,
            )


async def _locked_job(
    config: RunConfig,
    model_dir: Path,
    *,
    resume: bool,
    overwrite: bool,
    progress: JobProgress,
    print_fn: Callable[[str], None],
    ranks: RankGroup | None,
    job_started: float,
    prepare_s: float,
) -> TrainingSummary:
    """`run_training` from its run folder on, while this process holds the folder's lock."""
    t = time.perf_counter()
    checkpoint = open_run_dir(config, resume=resume, overwrite=overwrite)
    run_dir = Path(config.run_dir)
    sft_dir = run_dir / SFT_MODEL_DIR
    sft_done = config.sft.enabled and sft_model_ready(run_dir)  # a half-written sft_model/ is removed
    phases = {"prepare_s": prepare_s + time.perf_counter() - t}

    # SFT, unless done: the policy it trains is the one RL trains on (with ranks SFT runs on rank 0
    # alone, on an unsharded policy, and every rank then loads its shard of the SFT model). With LoRA
    # SFT trains adapters too, its merged model is RL's base, and RL starts fresh adapters on it, so the
    # KL reference (the base with adapters off) is the warm-start
    sft_policy = None
    if checkpoint is None and config.sft.enabled and not sft_done:
        sft_policy = build_policy(config if ranks is None else unsharded_config(config), model_dir)
        phases["sft_s"] = await warm_start(config, sft_policy, sft_dir, print_fn=print_fn, progress=progress)
        sft_done = True

    # build, from the warm-start
    t = time.perf_counter()
    policy = sft_policy if ranks is None and config.model.lora is None else None
    sft_policy = None  # with LoRA the RL policy loads the merged SFT model: this one is freed
    run = build_run(config, sft_dir if sft_done else model_dir, policy=policy, ranks=ranks, started=job_started)
    run.phases = phases
    run.progress = progress
    phases["prepare_s"] += time.perf_counter() - t
    if checkpoint is None:
        run.metrics_log.truncate_after(-1)  # a resume without a complete checkpoint starts over
    else:
        await restore(run, checkpoint, print_fn=print_fn)
    selector = (
        CheckpointSelector(config, run_dir, resumed_at=run.state.version if checkpoint is not None else None)
        if config.eval.select.enabled
        else None
    )

    warmstart: EvalResult | None = None
    try:
        await start_engine(run.engine)  # launched servers up and ready before the first evaluation
        if checkpoint is None:
            check = await version0_check(run)  # engine vs trainer log-probs at version 0, in the first record
            warmstart = await evaluate_warm_start(run, print_fn=print_fn, check=check)
            if selector is not None:  # the warm-start is a candidate too: RL that only hurts hands it back
                run.metrics_log.log(0, await validate(run, selector, 0, force=True))
            run.state.final_reserve_s = final_reserve_s(run.phases, select=selector is not None)
        await reinforce(run, selector=selector)
        # final evaluation on the same held-out seeds (of the policy eval.select picked, if on)
        final, last, selected_step = await finish(run, selector)
        # the engine holds the final policy's weights (the picked one's with eval.select)
        final_greedy = await evaluate(run, "final_greedy", greedy=True) if config.eval.greedy_reading else None
        final_baselines = await evaluate_baselines(run, "final")
        if last is None:
            record = {**final.metrics(), **greedy_metrics(final_greedy), **baseline_metrics(final_baselines)}
        else:  # the curve's point at the last step is the last step's policy; the picked one is final/
            picked = {
                **final.metrics(prefix="final/"),
                **greedy_metrics(final_greedy, prefix="final/"),
                **{f"final/{key[len('eval/') :]}": value for key, value in baseline_metrics(final_baselines).items()},
            }
            record = {**last.metrics(), **picked, "final/selected_step": selected_step}
        run.metrics_log.log(run.state.version, {**record, "policy/version": run.state.version})
    finally:
        await run.engine.close()
        run.metrics_log.close()
    return report(
        run,
        warmstart,
        final,
        print_fn=print_fn,
        last=last,
        selected_step=selected_step,
        final_greedy=final_greedy,
        final_baselines=final_baselines,
    )


# --- reinforce ----------------------------------------------------------------------------


async def reinforce(run: Run, *, selector: CheckpointSelector | None = None) -> None:
    """The RL phase: start the rollout source, run `rl_loop`, stop everything it started. A stop
    before train.steps (a wall-clock cap) is written on the RL bar, with its reason."""
    config = run.config
    deadline = job_deadline(run)
    if deadline is not None and time.perf_counter() > deadline:  # before any rollout worker starts
        reason = f"no RL: the warm-start used up train.max_job_wall_s={config.train.max_job_wall_s}"
        logger.warning("%s (%.0f s so far)", reason, run.wall_s())
        with run.progress.phase("RL", total=config.train.steps, completed=run.state.version) as bar:
            bar.stop(reason)
        return
    rollout = build_rollout(
        config,
        run.engine,
        run.policy.tokenizer,
        model_dir=run.engine_model_dir,
        buffer=run.buffer,
        seeds=run.seeds,
        run_dir=run.run_dir,
    )
    if config.cluster.backend == "ray" and run.state.version:  # fresh remote engines load the base weights
        await rollout.update_weights(run.policy.engine_state_dict(), run.state.version)
    update = run.ranks.ppo_update if run.ranks is not None else ppo_update
    learner = PolicyLearner(config, run.policy, run.optimizer, reference=run.reference, update=update)
    stop = asyncio.Event()
    producer = None if run.buffer is None else asyncio.ensure_future(rollout.run(stop))
    started = time.perf_counter()
    with run.progress.phase("RL", total=config.train.steps, completed=run.state.version) as bar:
        try:
            stopped = await rl_loop(
                learner,
                rollout,
                run.buffer,
                run.state,
                groups_per_batch=config.rollout.groups_per_batch,
                steps=config.train.steps,
                after_step=_after_step(run, rollout, selector, bar),
                max_wall_s=config.train.max_wall_s,
                deadline=deadline,
            )
            if stopped is not None:
                bar.stop(stopped)
        finally:
            learner.close()
            stop.set()
            if producer is not None:
                await asyncio.gather(producer, return_exceptions=True)
            await rollout.close()
    run.phases["rl_s"] = time.perf_counter() - started
    every = config.train.checkpoint_every
    if run.state.version and (not every or run.state.version % every):
        save(run, run.state)


def _after_step(
    run: Run, rollout: RolloutSource, selector: CheckpointSelector | None, bar: PhaseBar
) -> list[AfterStep]:
    """After each step, in order: the rollout's metrics, the periodic held-out reading (eval.every),
    the validation reading (eval.select), the log line and progress bar, the checkpoint."""
    config = run.config

    async def describe_rollout(state: LoopState, record: dict[str, Any]) -> None:
        record.update(rollout_metrics(rollout, run.buffer))

    async def periodic_eval(state: LoopState, record: dict[str, Any]) -> None:
        every = config.eval.every
        if every and state.version % every == 0 and state.version < config.train.steps:
            record.update((await evaluate(run, "periodic")).metrics())

    async def select(state: LoopState, record: dict[str, Any]) -> None:
        if selector is not None:
            record.update(await validate(run, selector, state.version))

    async def log(state: LoopState, record: dict[str, Any]) -> None:
        run.metrics_log.log(state.version, record)
        info = f"success {record.get('train/success_rate', 0):.2f}  idle {record['trainer/idle_fraction']:.2f}"
        bar.update(completed=state.version, info=info)
        logger.info("step %d: %s", state.version, {k: v for k, v in record.items() if isinstance(v, float)})

    async def checkpoint(state: LoopState, record: dict[str, Any]) -> None:
        if config.train.checkpoint_every and state.version % config.train.checkpoint_every == 0:
            save(run, run.state)

    return [describe_rollout, periodic_eval, select, log, checkpoint]


RESERVE_MARGIN = 1.25  # the final readings' reserve over the warm-start's (see final_reserve_s)


def final_reserve_s(phases: dict[str, float], *, select: bool = True) -> float:
    """What the final readings will cost, from the warm-start's: the held-out reading (twice with
    eval.select: the last step and the picked one), one validation reading and the greedy one.
    The eval.baselines readings are taken again at the end. Times RESERVE_MARGIN: a trained policy
    may play longer episodes than its warm-start (a MathTool agent that learned to call its tool
    took 1.18x the warm-start's reading time)."""
    return RESERVE_MARGIN * (
        (2 if select else 1) * phases.get("eval_warmstart_s", 0.0)
        + phases.get("eval_warmstart_greedy_s", 0.0)
        + phases.get("select_s", 0.0)
        + sum(seconds for key, seconds in phases.items() if key.startswith("eval_baseline_"))
    )


def job_deadline(run: Run) -> float | None:
    """The `time.perf_counter()` reading after which RL must stop for the job to end within
    train.max_job_wall_s (earlier processes of a resumed run count too); None without one."""
    budget = run.config.train.max_job_wall_s
    if budget is None:
        return None
    return run.started + budget - run.prior_wall_s - run.state.final_reserve_s


# --- readings -----------------------------------------------------------------------------


async def evaluate(run: Run, label: str, *, greedy: bool = False, baseline: str | None = None) -> EvalResult:
    """Success on the held-out seeds with the current weights (timed under `eval_{label}_s`);
    greedy: one episode per seed at T = 0 (eval.greedy); baseline: reading eval.baselines.<name>."""
    started = time.perf_counter()
    if run.engine.weight_version != run.state.version:  # an engine that missed a push (a resumed run's fresh one)
        await run.engine.update_weights(run.policy.engine_state_dict(), run.state.version)
    async with trainer_players(run) as helpers:
        result = await evaluate_held_out(
            run.engine,
            run.policy.tokenizer,
            run.config,
            greedy=greedy,
            baseline=baseline,
            helpers=helpers,
            progress=run.progress,
            label=label,
        )
    key = f"eval_{label}_s"
    run.phases[key] = run.phases.get(key, 0.0) + time.perf_counter() - started
    return result


@contextlib.asynccontextmanager
async def trainer_players(run: Run) -> AsyncIterator[list[Any]]:
    """eval.in_trainer: an in-process engine over the trainer's own model (the weights the servers
    were just given) for one reading; closed after it, the model back in training mode."""
    if not run.config.eval.in_trainer:
        yield []
        return
    from rollhub.inference.engines.hf import HFEngine

    model, config = run.policy.model, run.config
    device = str(next(model.parameters()).device)
    player = HFEngine(
        model,
        run.policy.tokenizer,
        threads=config.model.threads,
        max_batch_size=config.engine.max_batch_size,
        device=device,
    )
    try:
        yield [player]
    finally:
        await player.close()
        model.train()


async def validate(run: Run, selector: CheckpointSelector, step: int, *, force: bool = False) -> dict[str, float]:
    """eval.select: score the current weights on the validation seeds when due; keep the best."""
    if not (force or selector.due(step)):
        return {}
    started = time.perf_counter()
    if run.engine.weight_version != run.state.version:
        await run.engine.update_weights(run.policy.engine_state_dict(), run.state.version)
    result = await selector.score(run.engine, run.policy.tokenizer, progress=run.progress)
    selector.consider(step, result, run.policy)
    run.phases["select_s"] = run.phases.get("select_s", 0.0) + time.perf_counter() - started
    return selector.metrics(result)


async def evaluate_warm_start(
    run: Run, *, print_fn: Callable[[str], None], check: dict[str, float] | None = None
) -> EvalResult:
    result = await evaluate(run, "warmstart")
    greedy = await evaluate(run, "warmstart_greedy", greedy=True) if run.config.eval.greedy_reading else None
    baselines = await evaluate_baselines(run, "warmstart")
    run.state.warmstart_success = result.success_rate
    record = result.metrics(prefix="") | greedy_metrics(greedy, prefix="")
    record["baselines"] = {name: reading.metrics(prefix="") for name, reading in baselines.items()}
    (run.run_dir / WARMSTART_FILE).write_text(json.dumps(record))
    log = {**(check or {}), **result.metrics(), **greedy_metrics(greedy), **baseline_metrics(baselines)}
    run.metrics_log.log(0, {**log, "policy/version": 0})
    print_fn(f"warm-start success on {run.config.eval.label}: {result.describe()}")
    if greedy is not None:
        print_fn(f"warm-start success on {run.config.eval.greedy_label}: {100 * greedy.success_rate:.1f}%")
    for name, reading in baselines.items():
        print_fn(f"warm-start success on the same seeds, {name} ({baseline_label(run, name)}): {reading.describe()}")
    return result


async def evaluate_baselines(run: Run, when: str) -> dict[str, EvalResult]:
    """The eval.baselines readings with the current weights, each timed under eval_baseline_{name}_{when}_s."""
    return {name: await evaluate(run, f"baseline_{name}_{when}", baseline=name) for name in run.config.eval.baselines}


def baseline_metrics(readings: dict[str, EvalResult]) -> dict[str, float]:
    return {key: value for name, reading in readings.items() for key, value in reading.metrics(f"eval/{name}/").items()}


def baseline_label(run: Run, name: str) -> str:
    return ", ".join(f"{key}={value}" for key, value in run.config.eval.baselines[name].items())


async def finish(run: Run, selector: CheckpointSelector | None) -> tuple[EvalResult, EvalResult | None, int | None]:
    """The final held-out evaluation and final_model/: the last step's policy, or with
    eval.select the best one on the validation seeds (then the last one is scored too).
    Returns (final, last step's result if another policy was picked, the picked step)."""
    state, final_dir = run.state, run.run_dir / "final_model"
    final = await evaluate(run, "final")
    if selector is not None:
        if selector.last is None or selector.last.step != state.version:
            run.metrics_log.log(state.version, await validate(run, selector, state.version, force=True))
        best = selector.best
        if best is not None and best.step != state.version:
            await run.engine.update_weights(selector.best_state_dict(), state.version)
            selected = await evaluate(run, "selected")
            selector.hand_over(final_dir)
            return selected, final, best.step
    run.policy.save_pretrained(final_dir)
    return final, None, (state.version if selector is not None else None)
