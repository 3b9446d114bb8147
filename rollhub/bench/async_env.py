"""`rollhub bench async ENV_ID`: env-level asynchrony measured on any registered env.

    rollhub bench async rollhub/Sokoban-v0 --set repeats=3

The real rollout path (`EnvManager.collect_batch`, the agent loop, the env from the registry)
collects the same batch of `groups` x `group_size` episodes (same seeds) in two modes, one
after the other in one process, the order alternating repeat by repeat (ABBA) so a busy
machine shifts both alike:

  lockstep   every env of the batch waits for the whole batch's generations, then all step
             together (`rollout.lockstep`, async_ratio 0): the synchronous baseline
  env-async  one coroutine per trajectory: each env steps as soon as its own reply is back

Wall time per batch is reported for each (median over repeats); the measured gain is the median
over repeats of lockstep / env-async of the repeat's two back-to-back batches.
No training step runs: training is the same in both modes, so it would only dilute the ratio
(`rollhub bench async-real` measures whole training steps on ALFWorld and SWE).

The model is the real tiny Qwen3 (random init) on the in-process HFEngine (`engine=tiny`), or
the latency-model engine (`engine=latency-model`, SIMULATED timing fit to that engine: no
text, so the env sees unparseable replies; labelled in the output). Beside the measured ratio
the prediction of rollhub.bench.async_gain is printed, fed with this run's own env latencies
and each turn's generation time (its reply's tokens at the measured pace): `predicted_gain`.
`predicted_env_only` gives every turn the mean pace, as `rollhub bench env ID` does without a
model; the two differ by the barrier of unequal reply lengths, which lockstep also pays.

`agent=mathtool-script` (MathTool only) replaces the model's text with what a trained policy
writes, a `python` call on the question and then the tool's output as the answer, at the real
engine's pace (rollhub.bench.scripted_tool): a random model never calls the tool, so without it
the sandbox backend's container latency is never exercised.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rollhub.bench.report import print_table, save_json
from rollhub.core.config import load_config
from rollhub.core.errors import UserError

logger = logging.getLogger(__name__)

MODES = ("lockstep", "env-async")
AGENTS = ("model", "mathtool-script")


@dataclass
class AsyncEnvConfig:
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # the env's arguments
    engine: Literal["tiny", "latency-model"] = "tiny"
    agent: Literal["model", "mathtool-script"] = "model"  # whose text the env gets (see the module docstring)
    model: str = ""  # an HF model folder instead of the random tiny model (engine=tiny)
    groups: int = 4
    group_size: int = 4
    repeats: int = 3  # batches per mode, interleaved
    max_new_tokens: int = 32
    max_turns: int = 8  # cap on top of the env's own step limit
    threads: int = 1
    seed: int = 0

    def validate(self) -> None:
        if self.engine not in ("tiny", "latency-model"):
            raise ValueError(f"engine must be 'tiny' or 'latency-model', got {self.engine!r}")
        if self.agent not in AGENTS:
            raise ValueError(f"agent must be one of {', '.join(AGENTS)}, got {self.agent!r}")
        if self.agent == "mathtool-script" and self.engine != "tiny":
            raise ValueError("agent=mathtool-script times its replies on the real engine: use engine=tiny")
        for name in ("groups", "group_size", "repeats", "max_new_tokens", "max_turns", "threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.model and not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"model={self.model!r} is not a model folder (no config.json there)")


QUICK = ["groups=2", "group_size=2", "repeats=1", "max_new_tokens=8", "max_turns=2"]


def episode_latencies(groups: list[Any]) -> tuple[list[list[float]], list[list[int]], list[float]]:
    """Per trajectory: [reset_s, env step seconds...], its reply tokens per turn, and its generation
    seconds per generated token (the agent times each generation call)."""
    episodes, tokens, pace = [], [], []
    for group in groups:
        for trajectory in group.trajectories:
            turns = [t for t in trajectory.turns if "env_step" in t.timings_s]
            episodes.append([float(trajectory.timings_s.get("reset", 0.0)), *(t.timings_s["env_step"] for t in turns)])
            tokens.append([len(t.response_ids) for t in turns])
            if sum(tokens[-1]):
                pace.append(float(trajectory.timings_s.get("generate", 0.0)) / sum(tokens[-1]))
    return episodes, tokens, pace


async def collect_once(engine: Any, tokenizer: Any, env_id: str, cfg: AsyncEnvConfig, mode: str) -> dict[str, Any]:
    """One batch through the real env manager in `mode`; its wall time and latencies."""
    from rollhub.rollout.agent import AgentConfig
    from rollhub.rollout.config import EnvConfig, RolloutConfig
    from rollhub.rollout.manager import EnvManager

    manager = EnvManager(
        engine,
        tokenizer,
        env=EnvConfig(id=env_id, kwargs=dict(cfg.env_kwargs), max_concurrent=256),
        rollout=RolloutConfig(group_size=cfg.group_size, lockstep=mode == "lockstep", async_ratio=0),
        agent=AgentConfig(
            max_new_tokens=cfg.max_new_tokens,
            max_turns=cfg.max_turns,
            max_context_tokens=4096,
            temperature=1.0,
        ),
        seeds=iter(range(cfg.seed, cfg.seed + cfg.groups)),  # both modes play the same tasks
    )
    try:
        started = time.perf_counter()
        groups = await manager.collect_batch(cfg.groups)
        elapsed = time.perf_counter() - started
    finally:
        await manager.close()
    episodes, tokens, pace = episode_latencies(groups)
    trajectories = [t for group in groups for t in group.trajectories]
    return {
        "mode": mode,
        "batch_s": elapsed,
        "episodes": episodes,
        "tokens": tokens,
        "s_per_token": pace,
        "tool_calls": sum(int(t.info.get("tool_calls", 0)) for t in trajectories),
        "successes": sum(bool(t.success) for t in trajectories),
        "trajectories": len(trajectories),
    }


def _engine(cfg: AsyncEnvConfig, folder: Path) -> tuple[Any, Any, str]:
    """(engine, tokenizer, label) for the configured model."""
    from rollhub.inference.models import build_tokenizer, init_tiny_model

    if cfg.engine == "latency-model":
        from rollhub.bench.async_gain import tiny_cpu_latency_params
        from rollhub.bench.sim.latency_model import LatencyModelEngine, OutputLengths

        tokenizer = build_tokenizer()
        params = tiny_cpu_latency_params()
        engine = LatencyModelEngine(
            params,
            output_lengths=OutputLengths(kind="fixed", mean_tokens=cfg.max_new_tokens),
            vocab_size=len(tokenizer),
            seed=cfg.seed,
        )
        return engine, tokenizer, "SIMULATED latency-model engine (fit: HFEngine tiny-5m CPU)"
    from rollhub.inference.engines.hf import HFEngine

    model_dir = Path(cfg.model) if cfg.model else init_tiny_model(folder / "model", "5m", seed=cfg.seed)
    engine = HFEngine(model_dir, threads=cfg.threads, max_batch_size=64, prefix_cache_tokens=65536, seed=cfg.seed)
    label = f"real HFEngine, {cfg.model or 'tiny-5m (random init)'}, {cfg.threads} thread(s)"
    if cfg.agent == "mathtool-script":
        from rollhub.bench.scripted_tool import ScriptedReplyEngine

        scripted = ScriptedReplyEngine(engine, engine.tokenizer)
        return scripted, engine.tokenizer, label + ", replies scripted (python call, then its output) at its pace"
    return engine, engine.tokenizer, label


def check_scripted_env(env_id: str, cfg: AsyncEnvConfig) -> None:
    """agent=mathtool-script reads MathTool's arithmetic questions only: any other env or kind is a
    one-line error before a model loads."""
    from rollhub.bench.scripted_tool import SCRIPTED_KINDS
    from rollhub.envs import make
    from rollhub.envs.mathtool.env import MathToolEnv

    try:
        env = make(env_id, **cfg.env_kwargs)
    except (TypeError, ValueError) as exc:
        raise UserError(f"bench async: {env_id} with env_kwargs={cfg.env_kwargs}: {exc}") from None
    try:
        inner = getattr(env, "unwrapped", env)
        if not isinstance(inner, MathToolEnv):
            raise UserError(f"bench async: agent=mathtool-script plays MathTool only, not {env_id}")
        if "python" not in inner.tool_names or not set(inner.kinds) <= set(SCRIPTED_KINDS):
            raise UserError(
                "bench async: agent=mathtool-script needs the python tool and kinds among "
                f"{list(SCRIPTED_KINDS)} (e.g. --set 'env_kwargs={{\"kinds\": {list(SCRIPTED_KINDS)}}}'), "
                f"got tools={inner.tool_choice!r}, kinds={list(inner.kinds)}"
            )
    finally:
        asyncio.run(env.close())


async def measure(env_id: str, cfg: AsyncEnvConfig) -> dict[str, Any]:
    """Interleaved lockstep / env-async batches on `env_id`; the result (see the module docstring)."""
    from rollhub.bench.async_gain import predicted_gain

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="rollhub-bench-async-") as folder:
        engine, tokenizer, label = _engine(cfg, Path(folder))
        try:
            await collect_once(engine, tokenizer, env_id, cfg, "env-async")  # warm-up: imports, first env, caches
            for repeat in range(cfg.repeats):
                order = MODES if repeat % 2 == 0 else MODES[::-1]
                for mode in order:
                    result = await collect_once(engine, tokenizer, env_id, cfg, mode)
                    logger.info("bench async: %s %s %.2fs", env_id, mode, result["batch_s"])
                    runs[mode].append(result)
        finally:
            await engine.close()
    if getattr(engine, "cut", 0):  # the scripted agent's broken calls would measure a different episode
        raise UserError(
            f"bench async: {engine.cut} scripted replies were longer than max_new_tokens={cfg.max_new_tokens} "
            f"(the longest {engine.longest} tokens) and were cut; set max_new_tokens={engine.longest} or more"
        )
    lockstep_s = statistics.median(r["batch_s"] for r in runs["lockstep"])
    async_s = statistics.median(r["batch_s"] for r in runs["env-async"])
    # each repeat's two batches ran back to back: their ratio cancels slower drifts of a shared machine
    paired = [a["batch_s"] / b["batch_s"] for a, b in zip(runs["lockstep"], runs["env-async"]) if b["batch_s"] > 0]
    # the prediction's inputs, from this run: env latencies of every episode played, and each turn's
    # generation time: its reply's tokens at the pace a request decodes while the batch decodes
    # together (lockstep's requests)
    episodes = [e for mode in MODES for r in runs[mode] for e in r["episodes"]]
    tokens = [t for mode in MODES for r in runs[mode] for t in r["tokens"]]
    s_per_token = statistics.median([p for r in runs["lockstep"] for p in r["s_per_token"]] or [0.0])
    generations = [[s_per_token * n for n in turn_tokens] for turn_tokens in tokens]
    generation_s = statistics.fmean([g for turns in generations for g in turns] or [0.0])
    batch = cfg.groups * cfg.group_size
    prediction = predicted_gain(episodes, generation_s, batch, generations=generations, seed=cfg.seed)
    steps = [s for e in episodes for s in e[1:]]
    played = [r for mode in MODES for r in runs[mode]]
    trajectories = sum(r["trajectories"] for r in played)
    return {
        "benchmark": "async",
        "env": env_id,
        "engine": label,
        "config": asdict(cfg),
        "lockstep_batch_s": lockstep_s,
        "env_async_batch_s": async_s,
        "measured_gain": statistics.median(paired) if paired else float("nan"),
        "ratio_of_medians": lockstep_s / async_s if async_s > 0 else float("nan"),
        "predicted_gain": prediction["predicted_gain"],
        # what `bench env` predicts: the same env latencies with every reply at the mean pace
        "predicted_gain_env_only": predicted_gain(episodes, generation_s, batch, seed=cfg.seed)["predicted_gain"],
        "amdahl_bound": prediction["amdahl_bound"],
        "env_share_lockstep": prediction["env_share_lockstep"],
        "generation_s_per_turn": generation_s,
        "env_step_p50_s": statistics.median(steps) if steps else 0.0,
        "env_step_max_s": max(steps, default=0.0),
        # by mode: where steps contend for one resource (a Docker daemon starting containers), lockstep's
        # simultaneous steps are slower than env-async's staggered ones, a gain no fixed latency predicts
        "env_step_p50_s_by_mode": {
            mode: statistics.median([s for r in runs[mode] for e in r["episodes"] for s in e[1:]] or [0.0])
            for mode in MODES
        },
        "env_step_mean_s_by_mode": {
            mode: statistics.fmean([s for r in runs[mode] for e in r["episodes"] for s in e[1:]] or [0.0])
            for mode in MODES
        },
        "turns_per_episode": statistics.fmean(len(e) - 1 for e in episodes) if episodes else 0.0,
        "tool_calls_per_episode": sum(r["tool_calls"] for r in played) / trajectories if trajectories else 0.0,
        "success_rate": sum(r["successes"] for r in played) / trajectories if trajectories else 0.0,
        "batches_s": {mode: [r["batch_s"] for r in runs[mode]] for mode in MODES},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import os

    env_id = getattr(args, "target", None)
    if not env_id:
        raise UserError("bench async needs an env id: rollhub bench async rollhub/Sokoban-v0")
    from rollhub.envs.registry import spec

    spec(env_id)  # an unknown id is a one-line error before any model loads
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    overrides = [*QUICK, *args.overrides] if args.quick else list(args.overrides)
    cfg = load_config(AsyncEnvConfig, None, overrides)
    try:
        cfg.validate()
    except ValueError as exc:
        raise UserError(f"bench async: {exc}") from None
    if cfg.agent == "mathtool-script":
        check_scripted_env(env_id, cfg)
    import torch

    torch.set_num_threads(cfg.threads)
    result = asyncio.run(measure(env_id, cfg))
    print_table(
        f"bench async {env_id}: {result['engine']}, batch {cfg.groups}x{cfg.group_size}, "
        f"{cfg.max_new_tokens} new tokens/turn, median of {cfg.repeats} interleaved batches",
        [
            {
                "lockstep s": result["lockstep_batch_s"],
                "async s": result["env_async_batch_s"],
                "measured": result["measured_gain"],
                "predicted": result["predicted_gain"],
                "env only": result["predicted_gain_env_only"],
                "bound": result["amdahl_bound"],
                "gen s/turn": result["generation_s_per_turn"],
                "step p50 ms": 1e3 * result["env_step_p50_s"],
                "turns": result["turns_per_episode"],
                "tool calls/ep": result["tool_calls_per_episode"],
                "success": result["success_rate"],
            }
        ],
    )
    print(
        f"{env_id}: measured gain {result['measured_gain']:.2f}x (lockstep / env-async, median of {cfg.repeats} "
        f"back-to-back pairs), predicted {result['predicted_gain']:.2f}x, Amdahl bound {result['amdahl_bound']:.2f}x"
    )
    out = Path(args.out)
    path = out if out.suffix == ".json" else out / "result.json"
    save_json(path, result)
    print(f"wrote {path}")
    return result
