"""Success rate on held-out seeds: the number a training run is judged by.

Evaluation plays one episode per seed with the current engine weights, concurrently, and
never feeds anything back into training. Seeds come from a range disjoint from the
training and SFT seeds (checked by RunConfig.validate).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollhub.inference.engines.sglang import SGLangError
from rollhub.rollout.agent import AgentConfig, run_episode
from rollhub.rollout.types import Trajectory, TrajectoryStatus
from rollhub.trainer.progress import NO_PROGRESS, JobProgress, PhaseBar

if TYPE_CHECKING:
    from rollhub.trainer.config import RunConfig


@dataclass
class EvalResult:
    success_rate: float
    mean_return: float
    mean_turns: float
    invalid_action_rate: float
    format_error_rate: float
    infra_failures: int
    # success among scored episodes without a format error: a gain that only comes from
    # learning the answer format shows as a falling format_error_rate and a flat well_formed_accuracy
    well_formed_accuracy: float = 0.0
    well_formed_episodes: int = 0
    # envs with tools: episodes with at least one readable tool call, and with one the env ran
    # (its `valid_calls` metric); None for an env without tools
    tool_call_rate: float | None = None
    valid_call_rate: float | None = None
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        return {
            f"{prefix}{k}": v
            for k, v in dataclasses.asdict(self).items()
            if k not in ("trajectories", "infra_reason") and v is not None
        }

    @property
    def all_infra_failed(self) -> bool:
        """No episode was scored because the machinery failed on every one: the rates say nothing."""
        return self.infra_failures > 0 and not any(t.scored for t in self.trajectories)

    @property
    def infra_reason(self) -> str:
        """The first infra failure's reason ('' without one)."""
        return next((t.infra_error or "" for t in self.trajectories if not t.scored and t.infra_error), "")

    def describe(self) -> str:
        """One line: success, and for a tool env the call rates and mean turns; a reading whose every
        episode failed on infrastructure says so, never 0%."""
        if self.all_infra_failed:
            reason = self.infra_reason or "no reason recorded"
            return f"all {self.infra_failures} episodes failed for infra reasons: {reason}"
        text = f"{100 * self.success_rate:.1f}%"
        if self.tool_call_rate is not None:
            valid = 0.0 if self.valid_call_rate is None else self.valid_call_rate
            text += (
                f" (tool calls in {100 * self.tool_call_rate:.1f}% of episodes, valid calls in "
                f"{100 * valid:.1f}%, {self.mean_turns:.2f} turns)"
            )
        return text


def tool_use_rates(trajectories: Sequence[Trajectory]) -> tuple[float | None, float | None]:
    """(episodes with a readable tool call, episodes with a call the env ran) over `trajectories`;
    (None, None) where the agent was given no tools (it then never counts calls)."""
    if not trajectories or not any("tool_calls" in t.info for t in trajectories):
        return None, None
    called = sum(t.info.get("tool_calls", 0) > 0 for t in trajectories)
    ran = sum(t.info.get("env_metrics", {}).get("valid_calls", 0) > 0 for t in trajectories)
    return called / len(trajectories), ran / len(trajectories)


async def evaluate_policy(
    engine: Any,
    tokenizer: Any,
    make_env: Callable[[], Any],
    agent: AgentConfig,
    seeds: Sequence[int],
    *,
    temperature: float = 0.0,
    max_concurrent: int = 64,
    env_id: str = "",
    on_done: Callable[[Trajectory], None] | None = None,
    samples_per_seed: int = 1,
    helpers: Sequence[Any] = (),
) -> EvalResult:
    """Play `samples_per_seed` episodes per seed (at `temperature`, 0 = greedy) and summarise.

    `on_done`: called with each episode as it ends (a progress bar's count).
    `helpers`: more engines with the same weights; every engine plays up to `max_concurrent`
    episodes at once and an engine with a free slot takes the next episode, so a faster engine
    plays more of them.

    At T > 0 one episode per seed is one draw of a Bernoulli per seed: on 100 seeds its
    sampling noise alone is ~4.5 points. Several samples per seed estimate the policy's
    success probability on those same seeds, so a before/after difference on fixed seeds
    is no longer dominated by which moves happened to be drawn.
    """
    if samples_per_seed < 1:
        raise ValueError(f"samples_per_seed must be >= 1, got {samples_per_seed}")
    from rollhub.rollout.prompting import ChatSegments

    config = dataclasses.replace(agent, temperature=temperature)
    segments = ChatSegments(tokenizer)

    async def one(player: Any, seed: int, sample: int) -> Trajectory:
        env = make_env()
        # <seed>-<sample>: a server engine keeps the samples of one seed on one replica (prefix cache)
        name = f"eval-{seed}-{sample}"
        try:
            return await run_episode(
                env, player, tokenizer, config, seed, env_id=env_id, trajectory_id=name, segments=segments
            )
        except SGLangError as exc:  # the engine servers failed (after the router's re-send): infra
            failed = Trajectory(env_id=env_id, seed=seed, trajectory_id=name, status=TrajectoryStatus.INFRA_FAILED)
            failed.infra_error = repr(exc)
            return failed
        finally:
            await env.close()

    episodes = [(seed, sample) for seed in seeds for sample in range(samples_per_seed)]
    engines = [engine, *helpers]
    slots = max(1, min(max_concurrent, math.ceil(len(episodes) / len(engines))))
    pending = iter(enumerate(episodes))  # shared: a worker with nothing to do takes the next episode
    played: list[Trajectory | None] = [None] * len(episodes)

    async def worker(player: Any) -> None:
        for index, (seed, sample) in pending:
            played[index] = await one(player, seed, sample)
            if on_done is not None:
                on_done(played[index])

    await asyncio.gather(*(worker(player) for player in engines for _ in range(slots)))
    trajectories = [t for t in played if t is not None]
    # the failure rule of rollhub.rollout.types: infra failures say nothing about the policy and are
    # left out of every rate (counted apart); model failures are scored like any other episode
    scored = [t for t in trajectories if t.scored]
    turns = sum(len(t.turns) for t in scored) or 1
    well_formed = [t for t in scored if not t.info.get("format_errors", 0)]
    tool_call_rate, valid_call_rate = tool_use_rates(scored)
    return EvalResult(
        success_rate=statistics.fmean(t.success for t in scored) if scored else 0.0,
        mean_return=statistics.fmean(t.total_reward for t in scored) if scored else 0.0,
        mean_turns=statistics.fmean(len(t.turns) for t in scored) if scored else 0.0,
        invalid_action_rate=sum(t.info.get("invalid_actions", 0) for t in scored) / turns,
        format_error_rate=sum(t.info.get("format_errors", 0) for t in scored) / turns,
        infra_failures=len(trajectories) - len(scored),
        well_formed_accuracy=statistics.fmean(t.success for t in well_formed) if well_formed else 0.0,
        well_formed_episodes=len(well_formed),
        tool_call_rate=tool_call_rate,
        valid_call_rate=valid_call_rate,
        trajectories=trajectories,
    )


async def evaluate_model_dir(config: RunConfig, model_dir: Path, *, progress: JobProgress = NO_PROGRESS) -> EvalResult:
    """Evaluate an HF checkpoint dir with a RunConfig's engine, env, agent and eval settings."""
    import torch

    from rollhub.core.errors import UserError
    from rollhub.inference.engines.launcher import start_engine
    from rollhub.trainer.build import build_engine, check_run_envs

    if not (model_dir / "config.json").is_file():
        raise UserError(f"{model_dir} is not a model dir (no config.json)")
    check_run_envs(config)  # both envs' kwargs and train/eval overlap, before the model loads
    torch.set_num_threads(config.model.threads)
    engine = build_engine(config, model_dir)  # model.device and engine.backend, as in training
    try:
        await start_engine(engine)
        return await evaluate_held_out(engine, engine.tokenizer, config, progress=progress)
    finally:
        await engine.close()


async def evaluate_held_out(
    engine: Any,
    tokenizer: Any,
    config: RunConfig,
    *,
    greedy: bool = False,
    baseline: str | None = None,
    helpers: Sequence[Any] = (),
    progress: JobProgress = NO_PROGRESS,
    label: str = "held-out",
) -> EvalResult:
    """A RunConfig's held-out evaluation (`eval.env`, by default its env; agent; `eval:`) with `engine`.

    greedy: one episode per seed at temperature 0 instead of eval.temperature x samples_per_seed.
    baseline: the same seeds with the env of reading `eval.baselines.<baseline>`.
    progress: a bar `eval <label>` counts the episodes played and the success so far."""
    from rollhub.trainer.build import make_baseline_env_factory, make_eval_env_factory

    samples = 1 if greedy else config.eval.samples_per_seed
    with progress.phase(f"eval {label}", total=len(config.eval.seeds) * samples) as bar:
        return await evaluate_policy(
            engine,
            tokenizer,
            make_eval_env_factory(config) if baseline is None else make_baseline_env_factory(config, baseline),
            config.agent,
            config.eval.seeds,
            temperature=0.0 if greedy else config.eval.temperature,
            max_concurrent=config.env.max_concurrent,
            env_id=config.eval_env_id,
            samples_per_seed=samples,
            helpers=helpers,
            on_done=ReadingTally(bar),
        )


class ReadingTally:
    """A reading's running count on its bar: episodes done, success among the scored ones, infra failures."""

    def __init__(self, bar: PhaseBar):
        self.bar = bar
        self.scored = self.successes = self.infra_failed = 0

    def __call__(self, trajectory: Trajectory) -> None:
        if trajectory.scored:
            self.scored += 1
            self.successes += bool(trajectory.success)
        else:
            self.infra_failed += 1
        self.bar.advance(1, info=self.info())

    def info(self) -> str:
        text = f"success {self.successes}/{self.scored}" if self.scored else "success -"
        return text + (f"  infra failures {self.infra_failed}" if self.infra_failed else "")
