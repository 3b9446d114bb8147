"""`rollhub bench redundancy-bias`: does redundant rollout change WHICH tasks are trained on?

Workload: `DifficultyLatencyEnv` (rollhub/bench/sim/difficulty_env.py): task seed s has
difficulty s mod `levels`, and a level-d step lasts (1 + slope·d) times the easy one, so
the task distribution is uniform over levels but hard tasks take longer. The shipped
training loop (`rl_loop`), EnvManager and GroupBuffer, built as a training run with these
knobs builds them; SIMULATED engine (latency model, GPU-class replicas) and trainer step (a
learner that sleeps), on the virtual clock: times are simulated seconds, and a run costs
only the scheduler's CPU.

Rows (G groups per batch, g redundant groups; rule = `rollout.staleness_rule`):
  sync                 env-level async, α = 0, G groups (the unbiased reference)
  sync +g cancel       G+g started per batch, the first G kept, the rest cancelled (ROLL
                       Flash's rule; a training run never does this, so this row collects
                       each batch when the loop asks for it, `EnvManager.collect_batch`)
  sync +g carry        α = 0 with g redundant slots: late groups finish into the next batch
  async α token        async training, no redundancy, token-weighted staleness
  async α newest       the same with the newest-token rule (the default)
  async α +g RULE      g redundant slots, staleness judged by RULE (oldest, token_mean, newest)
Columns: step time and speedup over `sync`, the trained difficulty mix (% per level), its
total-variation distance from the task distribution (0 = the same mix), groups cancelled,
dropped as stale and carried over. `--set key=value` on `BiasBenchConfig`.
"""

from __future__ import annotations

import argparse
import collections
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from rollhub.bench.report import bench_setup, print_table, save_json

logger = logging.getLogger(__name__)

QUICK = ["groups=4", "group_size=2", "extra_groups=2", "steps=5", "warmup_steps=1", "turns=3"]


@dataclass
class BiasBenchConfig:
    groups: int = 8  # G
    group_size: int = 4  # N
    extra_groups: int = 4  # g
    levels: int = 4
    slope: float = 1.0  # a level-d step is (1 + slope·d) times as long as a level-0 step
    turns: int = 5
    step_mean_s: float = 5.0
    step_std_s: float = 2.0
    train_s: float = 20.0  # simulated trainer step
    alpha: float = 1.0
    replicas: int = 4
    mean_tokens: float = 40.0
    max_new_tokens: int = 128
    steps: int = 40
    warmup_steps: int = 2
    seed: int = 0

    def validate(self) -> None:
        if self.groups < 1 or self.group_size < 1 or self.extra_groups < 0 or self.levels < 1:
            raise ValueError("groups, group_size and levels must be >= 1, extra_groups >= 0")
        if self.steps <= self.warmup_steps:
            raise ValueError("steps must exceed warmup_steps")
        if self.alpha <= 0:
            raise ValueError("alpha must be > 0 (the async rows)")


@dataclass(frozen=True)
class Mode:
    name: str
    alpha: float
    extra_groups: int
    redundancy_mode: str = "carry"
    staleness_rule: str = "newest"  # a training run's default


def modes(cfg: BiasBenchConfig) -> list[Mode]:
    g, a = cfg.extra_groups, cfg.alpha
    return [
        Mode("sync", 0.0, 0),
        Mode(f"sync +{g} cancel", 0.0, g, "cancel"),
        Mode(f"sync +{g} carry", 0.0, g, "carry"),
        Mode(f"async a={a:g} token", a, 0, staleness_rule="token_mean"),
        Mode(f"async a={a:g} newest", a, 0, staleness_rule="newest"),
        Mode(f"async a={a:g} +{g} oldest", a, g, staleness_rule="oldest"),
        Mode(f"async a={a:g} +{g} token", a, g, staleness_rule="token_mean"),
        Mode(f"async a={a:g} +{g} newest", a, g, staleness_rule="newest"),
    ]


async def simulate_mode(cfg: BiasBenchConfig, mode: Mode, tokenizer: Any) -> dict[str, Any]:
    """One run of `mode` on the current (virtual-clock) loop; returns its row."""
    from rollhub.bench.sim.difficulty_env import DifficultyLatencyEnv
    from rollhub.bench.sim.latency_model import LatencyModelEngine, OutputLengths
    from rollhub.bench.sim.training import GPU_REPLICA, SleepLearner, run_buffer, train_simulated
    from rollhub.rollout.agent import AgentConfig
    from rollhub.rollout.config import EnvConfig, RolloutConfig
    from rollhub.rollout.manager import EnvManager

    engine = LatencyModelEngine(
        GPU_REPLICA,
        output_lengths=OutputLengths(kind="lognormal", mean_tokens=cfg.mean_tokens, sigma=0.5),
        replicas=cfg.replicas,
        vocab_size=len(tokenizer),
        seed=cfg.seed,
    )
    made = iter(range(1 << 30))

    def env_factory(env_id: str, **kwargs: Any) -> Any:
        return DifficultyLatencyEnv(
            levels=cfg.levels,
            slope=cfg.slope,
            turns=cfg.turns,
            step_mean_s=cfg.step_mean_s,
            step_std_s=cfg.step_std_s,
            latency_seed=cfg.seed * 1_000_003 + next(made),
        )

    rollout = RolloutConfig(
        group_size=cfg.group_size,
        groups_per_batch=cfg.groups,
        async_ratio=mode.alpha,
        redundant_groups=mode.extra_groups,
        staleness_rule=mode.staleness_rule,  # type: ignore[arg-type]
    )
    # a training run's buffer; `cancel` exists only in collect_batch (sync batches, no buffer)
    buffer = None if mode.redundancy_mode == "cancel" else run_buffer(rollout)
    manager = EnvManager(
        engine,
        tokenizer,
        env=EnvConfig(id="bench/DifficultyLatency-v0", max_concurrent=1 << 16),
        rollout=rollout,
        agent=AgentConfig(max_new_tokens=cfg.max_new_tokens, min_new_tokens=1, max_context_tokens=1 << 20),
        buffer=buffer,
        env_factory=env_factory,
        redundancy_mode=mode.redundancy_mode,  # type: ignore[arg-type]
    )
    learner = SleepLearner(cfg.train_s)
    summary: dict[str, Any] = {}

    async def count_at_last_step(state: Any, record: dict[str, Any]) -> None:
        if state.version == cfg.steps:  # before the producer stops: its cancellations are shutdown
            summary.update(manager.summary())

    try:
        ends = await train_simulated(
            learner, manager, buffer, groups=cfg.groups, steps=cfg.steps, after_step=[count_at_last_step]
        )
    finally:
        await manager.close()
    trained = [group for batch in learner.batches[cfg.warmup_steps :] for group in batch]
    levels = collections.Counter(group.seed % cfg.levels for group in trained)
    total = sum(levels.values())
    mix = [levels.get(d, 0) / total for d in range(cfg.levels)]
    row: dict[str, Any] = {
        "mode": mode.name,
        "step_s": (ends[-1] - ends[cfg.warmup_steps - 1]) / (cfg.steps - cfg.warmup_steps),
    }
    row.update({f"L{d}_%": 100 * share for d, share in enumerate(mix)})
    row["tv_distance"] = 0.5 * sum(abs(share - 1 / cfg.levels) for share in mix)
    row["groups_cancelled"] = summary.get("groups_redundant_cancelled", 0)
    row["dropped_stale"] = summary.get("buffer/dropped_stale", 0)
    row["carried"] = summary.get("groups_carried", 0) + summary.get("buffer/carried_groups", 0)
    row["trained_groups"] = total
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rollhub.bench.sim.training import make_tokenizer
    from rollhub.bench.sim.virtual_clock import run_virtual

    cfg, out = bench_setup(BiasBenchConfig, args, QUICK)
    cfg.validate()
    tokenizer = make_tokenizer("sim")
    started = time.perf_counter()
    rows = [run_virtual(simulate_mode(cfg, mode, tokenizer)) for mode in modes(cfg)]
    base = rows[0]["step_s"]
    for row in rows:
        row["speedup"] = base / row["step_s"] if row["step_s"] > 0 else 0.0
    expected = 100 / cfg.levels
    columns = ["mode", "step_s", "speedup", *[f"L{d}_%" for d in range(cfg.levels)], "tv_distance"]
    columns += ["groups_cancelled", "dropped_stale", "carried", "trained_groups"]
    print_table(
        f"redundancy-bias (SIMULATED engine and trainer): batch {cfg.groups}x{cfg.group_size}, "
        f"level-d step {cfg.step_mean_s:g}·(1+{cfg.slope:g}d) s, tasks {expected:.0f}% per level",
        rows,
        columns,
    )
    report = {
        "benchmark": "redundancy-bias",
        "simulation": True,
        "config": asdict(cfg),
        "task_distribution_%": [expected] * cfg.levels,
        "rows": rows,
        "wall_s": time.perf_counter() - started,
    }
    save_json(out / "result.json", report)
    return report
