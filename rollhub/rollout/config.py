"""The run's `env:` and `rollout:` sections, defined beside the code they configure.

`EnvManager` and `RayRollout` take these sections whole (with the `agent:` section,
`rollhub.rollout.agent.AgentConfig`), so a knob has the same name in a train config, in
`rollhub rollout --set` and in the manager; `rollhub.trainer.config.RunConfig` holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ValueError(f"{key} must be >= {low}, got {value}")


@dataclass
class EnvConfig:
    id: str = "rollhub/Sokoban-v0"  # registered env id (`rollhub envs list`)
    kwargs: dict[str, Any] = field(default_factory=dict)  # env constructor arguments
    train_seed_offset: int = 0  # training tasks use seeds offset, offset+1, ...
    max_concurrent: int = 64  # env episodes running at once (coroutines)

    def validate(self) -> None:
        _at_least("env.train_seed_offset", self.train_seed_offset, 0)  # numpy refuses negative seeds
        _at_least("env.max_concurrent", self.max_concurrent, 1)  # 0 would start no episode and wait forever


@dataclass
class RolloutConfig:
    group_size: int = 8  # trajectories per task (same seed)
    groups_per_batch: int = 4  # B: groups per trainer step
    async_ratio: float = 1.0  # alpha: generation may run up to (alpha+1)*B groups ahead; 0 = on-policy
    # Two switches because they are two axes (ROLL Flash, sec. 3): `lockstep` says how envs
    # step (all of a batch together, or each on its own), `async_ratio` how far generation
    # runs ahead of training. Lockstep with async_ratio 0 is the synchronous baseline;
    # independent envs with async_ratio 0 is env-level asynchrony alone. Lockstep with a
    # positive ratio means nothing and is refused.
    lockstep: bool = False
    # Failure budget (infra vs model failures: the rule in rollhub.rollout.types). Training stops with
    # an error once more than this fraction of the last `infra_failure_window` finished trajectories
    # failed for infrastructure reasons (at 1.0: once all of them did), instead of re-rolling forever
    max_infra_failure_rate: float = 0.5
    infra_failure_window: int = 200  # finished trajectories the infra failure rate is taken over
    # ... or after this many consecutive batches in which every trajectory failed (none succeeded and
    # no group had an advantage signal); 0 = never stop for that
    max_failed_batches: int = 20
    # Redundant env rollout (ROLL Flash; costs in README "Rollout knobs"). g extra groups get
    # admission slots of their own: the first B finished make the batch, the others are kept
    # for the next one (nothing is discarded, so hard tasks are not trained on less often;
    # `rollhub bench redundancy-bias`). With async_ratio 0 such a carried group may be one
    # version old: the buffer then allows a lag of 1 (each token keeps its own version).
    redundant_groups: int = 0
    # r extra trajectories per group: N+r start, the first N to finish are kept, the rest are
    # cancelled (requests aborted, envs closed); selects the fastest samples of each task
    redundant_trajectories: int = 0
    # cap on live envs per env id, e.g. {rollhub/SWE-v0: 8} containers on this host; the
    # rest wait for a slot (null/empty = only env.max_concurrent applies)
    env_concurrency: dict[str, int] = field(default_factory=dict)
    # How a group's staleness is judged at consumption (rollhub.rollout.buffer): newest (its
    # newest token: an episode still running on current weights is never dropped, so slow,
    # hard tasks are trained on as often as they occur; `rollhub bench redundancy-bias`),
    # token_mean (the token-weighted mean version of its response tokens), oldest (its oldest
    # token, the strictest). Every token keeps its own version for the off-policy correction.
    staleness_rule: Literal["token_mean", "newest", "oldest"] = "newest"

    def validate(self) -> None:
        _at_least("rollout.group_size", self.group_size, 1)
        _at_least("rollout.groups_per_batch", self.groups_per_batch, 1)
        _at_least("rollout.redundant_groups", self.redundant_groups, 0)
        _at_least("rollout.redundant_trajectories", self.redundant_trajectories, 0)
        if self.lockstep and (self.redundant_groups or self.redundant_trajectories):
            raise ValueError(
                "lockstep steps every env of a batch to the end, so redundancy saves nothing: "
                "set rollout.redundant_groups and rollout.redundant_trajectories to 0, or lockstep: false"
            )
        for env_id, limit in (self.env_concurrency or {}).items():
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
                raise ValueError(f"rollout.env_concurrency.{env_id} must be an integer >= 1, got {limit!r}")
        if self.staleness_rule not in ("token_mean", "newest", "oldest"):
            raise ValueError(
                f"rollout.staleness_rule must be token_mean, newest or oldest, got {self.staleness_rule!r}"
            )
        if self.async_ratio < 0:
            raise ValueError(f"rollout.async_ratio must be >= 0 (0 = synchronous), got {self.async_ratio}")
        if self.lockstep and self.async_ratio != 0:
            raise ValueError(
                "lockstep runs each batch to the end before training: set async_ratio: 0 with lockstep: true"
            )
        if not 0 <= self.max_infra_failure_rate <= 1:
            raise ValueError(f"rollout.max_infra_failure_rate must be in [0, 1], got {self.max_infra_failure_rate}")
        _at_least("rollout.infra_failure_window", self.infra_failure_window, 1)
        _at_least("rollout.max_failed_batches", self.max_failed_batches, 0)
