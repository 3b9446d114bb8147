"""What one RL step records about its batch and its rollout source (beside the learner's own metrics)."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.source import RolloutSource
from rollhub.rollout.types import Group, Trajectory
from rollhub.trainer.evaluate import tool_use_rates


def batch_reward_metrics(groups: list[Group]) -> dict[str, float]:
    """Rates over the scored trajectories (an infra failure is no evidence about the policy), plus
    the failure counts of the rule in rollhub.rollout.types: infra failures, model failures by reason."""
    everything = [t for g in groups for t in g.trajectories]
    trajectories = [t for t in everything if t.scored]
    if not everything:
        return {}
    record: dict[str, float] = {"train/infra_failed_trajectories": float(len(everything) - len(trajectories))}
    if not trajectories:
        return record
    turns = sum(len(t.turns) for t in trajectories) or 1
    reasons = collections.Counter(t.model_failure for t in trajectories if t.model_failure is not None)
    record.update(
        {
            "train/success_rate": float(np.mean([t.success for t in trajectories])),
            "train/mean_return": float(np.mean([t.total_reward for t in trajectories])),
            "train/mean_turns": turns / len(trajectories),
            "train/invalid_action_rate": sum(t.info.get("invalid_actions", 0) for t in trajectories) / turns,
            "train/format_error_rate": sum(t.info.get("format_errors", 0) for t in trajectories) / turns,
            "train/model_failure_rate": sum(reasons.values()) / len(trajectories),
            **{f"train/model_failures/{reason}": float(count) for reason, count in sorted(reasons.items())},
        }
    )
    called, ran = tool_use_rates(trajectories)
    if called is not None:
        record.update({"train/tool_call_rate": called, "train/valid_call_rate": ran or 0.0})
    env_values: dict[str, list[float]] = collections.defaultdict(list)
    for trajectory in trajectories:  # the env's own counts (e.g. a sandbox's start and exec seconds)
        for key, value in trajectory.info.get("env_metrics", {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                env_values[key].append(float(value))
    record.update({f"train/env/{key}": float(np.mean(values)) for key, values in sorted(env_values.items())})
    record.update(exploit_rates(trajectories))
    return record


def exploit_rates(trajectories: list[Trajectory]) -> dict[str, float]:
    """`train/exploit/<name>`: the share of episodes whose env flagged the signal at least once
    (`info["exploit_signals"]`, rollhub.envs.base), for every signal an episode of the batch reported."""
    names = sorted({name for t in trajectories for name in t.info.get("exploit_signals", {})})
    return {
        f"train/exploit/{name}": sum(t.info.get("exploit_signals", {}).get(name, 0) > 0 for t in trajectories)
        / len(trajectories)
        for name in names
    }


def rollout_metrics(rollout: RolloutSource, buffer: GroupBuffer | None) -> dict[str, Any]:
    """The rollout source's counters, the buffer's and the batch's staleness, the last weight push."""
    out: dict[str, Any] = {}
    summary = rollout.summary()
    for key in (
        "generation_tokens_per_s",
        "generated_tokens",
        "wasted_tokens",
        "redundant_cancelled",
        "infra_failures",
    ):
        if key in summary:
            out[f"rollout/{key}"] = summary[key]
    out.update(
        {
            k: v
            for k, v in summary.items()
            if k.startswith(("cluster/", "router/", "engine/")) and isinstance(v, (int, float))
        }
    )  # Ray backend, and the in-process engine's counters
    if buffer is not None:
        for key, value in buffer.metrics().items():
            if isinstance(value, (int, float)):
                out[key] = value
        if getattr(buffer, "last_batch_staleness", None):
            hist = buffer.last_batch_staleness
            total = sum(hist.values())
            out["staleness/batch_mean"] = sum(k * v for k, v in hist.items()) / total if total else 0.0
            out["staleness/batch_histogram"] = {str(k): v for k, v in sorted(hist.items())}
    updates = summary.get("weight_updates") or []
    if updates:
        last = updates[-1]
        out["weights/pause_s"] = last.get("pause_s", 0.0)
        out["weights/update_s"] = last.get("update_s", 0.0)
    return out
