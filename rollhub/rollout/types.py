"""Turn, Trajectory, Group: the records that flow from the env manager to the trainer.

Every generated token keeps the behaviour log-prob the engine reported and the policy
version that produced it, so the trainer can correct for staleness per token. Prompt ids
are kept exactly as sent to the engine (built incrementally, never re-tokenised), which is
what makes `packed_sequences()` reproduce precisely what the model saw.

Failure rule (the agent and the env manager follow it; the trainer relies on it). A failure
is the machinery's (status INFRA_FAILED: never scored, left out of every group statistic,
re-rolled by the env manager) only when nothing the model wrote can have caused it:
  1. the env says so: `info["infra_failure"]` from `reset` or `step` (rollhub.envs.base);
  2. it happened before the model acted: building the env or `env.reset` raised;
  3. the machinery itself raised: the inference engine (connection or server error), or a
     `SandboxError` / `ConnectionError` escaping `env.step` (MACHINERY_ERRORS).
Every other way an episode cannot go on is the model's failure: the trajectory stays
trainable (status TRUNCATED, scored with the rewards it earned; the turn that failed earns 0)
and `info["model_failure"]` names the reason (MODEL_FAILURE_REASONS):
  * "env_error": any other exception from `env.step`: the env received the model's action
    and could not process it, so the turn also counts as an invalid action;
  * "context": the conversation outgrew `max_context_tokens`;
  * "max_resubmits": a turn's generation was aborted (by weight updates) more than
    `max_resubmits` times, i.e. it ran on across that many policy versions.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from rollhub.core.errors import UserError
from rollhub.sandbox.base import SandboxError

#: exceptions from `env.step` that are the machinery's, not the action's (see the failure rule above)
MACHINERY_ERRORS: tuple[type[BaseException], ...] = (SandboxError, ConnectionError)
#: values of `Trajectory.info["model_failure"]`
MODEL_FAILURE_REASONS = ("env_error", "context", "max_resubmits")


class TrajectoryStatus(str, enum.Enum):
    COMPLETED = "completed"  # the env terminated the episode
    TRUNCATED = "truncated"  # step limit, context-length guard or another model failure (see above)
    INFRA_FAILED = "infra_failed"  # the machinery failed; never train on it as a model failure
    CANCELLED = "cancelled"  # redundant straggler or shutdown


#: statuses that carry no score: such a trajectory is never part of a group's statistics
UNSCORED_STATUSES = frozenset({TrajectoryStatus.INFRA_FAILED, TrajectoryStatus.CANCELLED})


class RolloutFailureError(UserError):
    """Rollout keeps failing (infra failure budget spent, or batch after batch where every trajectory
    failed): training stops with the cause, the counts and what to check, instead of looping forever."""


@dataclass
class Turn:
    """One model call and the env's answer to it."""

    prompt_ids: list[int]  # the full prompt sent to the engine for this turn
    response_ids: list[int]  # generated tokens (including the end-of-turn token when produced)
    behaviour_logprobs: list[float]  # log μ(token) as reported by the engine, one per response token
    token_versions: list[int]  # policy version that generated each response token
    response_text: str = ""
    reward: float = 0.0
    anchor: Hashable = None  # history-free key of the state the prompt showed (GiGPO)
    action_valid: bool = True
    format_ok: bool = True
    finish_reason: str = "stop"
    observation: list[dict[str, str]] = field(default_factory=list)  # env reply after this turn
    timings_s: dict[str, float] = field(default_factory=dict)  # e.g. {"generate": .., "env_step": ..}

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.behaviour_logprobs) != n or len(self.token_versions) != n:
            raise ValueError(
                f"turn has {n} response tokens but {len(self.behaviour_logprobs)} log-probs "
                f"and {len(self.token_versions)} versions"
            )


@dataclass
class Trajectory:
    """One episode of one env."""

    env_id: str
    seed: int | None
    turns: list[Turn] = field(default_factory=list)
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED
    success: bool = False
    group_id: str = ""
    trajectory_id: str = ""
    infra_error: str | None = None
    timings_s: dict[str, float] = field(default_factory=dict)  # reset, generate, env, total
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        """Whether the trajectory's rewards say something about the model (not infra-failed, not cancelled)."""
        return self.status not in UNSCORED_STATUSES

    @property
    def model_failure(self) -> str | None:
        """Why the model's own output ended the episode early (MODEL_FAILURE_REASONS), or None."""
        return self.info.get("model_failure")

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.turns)

    @property
    def num_response_tokens(self) -> int:
        return sum(len(t.response_ids) for t in self.turns)

    @property
    def oldest_version(self) -> int | None:
        per_turn = [min(t.token_versions) for t in self.turns if t.token_versions]
        return min(per_turn) if per_turn else None

    @property
    def newest_version(self) -> int | None:
        per_turn = [max(t.token_versions) for t in self.turns if t.token_versions]
        return max(per_turn) if per_turn else None

    def version_sum_and_count(self) -> tuple[int, int]:
        """Sum of the response tokens' policy versions and their number (token-weighted staleness)."""
        return sum(sum(t.token_versions) for t in self.turns), sum(len(t.token_versions) for t in self.turns)

    def packed_sequences(self) -> list[PackedSequence]:
        """Merge turns into as few training sequences as possible.

        With full history, turn k+1's prompt starts with turn k's prompt + response, so the
        whole episode is one sequence; with a history window it splits where the prefix
        breaks. Each sequence carries a response mask, per-token behaviour log-probs,
        versions and the index of the turn each response token belongs to.
        """
        sequences: list[PackedSequence] = []
        current: PackedSequence | None = None
        for index, turn in enumerate(self.turns):
            if current is not None and turn.prompt_ids[: len(current.input_ids)] == current.input_ids:
                extra = turn.prompt_ids[len(current.input_ids) :]
            else:
                current = PackedSequence()
                sequences.append(current)
                extra = turn.prompt_ids
            current.extend(extra, mask=False, turn_index=-1)
            current.extend(
                turn.response_ids,
                mask=True,
                turn_index=index,
                logprobs=turn.behaviour_logprobs,
                versions=turn.token_versions,
            )
        return sequences


@dataclass
class PackedSequence:
    """One contiguous token sequence for the trainer; only masked tokens are trained."""

    input_ids: list[int] = field(default_factory=list)
    response_mask: list[bool] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)  # 0.0 where mask is False
    token_versions: list[int] = field(default_factory=list)  # -1 where mask is False
    turn_index: list[int] = field(default_factory=list)  # -1 where mask is False

    def extend(
        self,
        ids: list[int],
        *,
        mask: bool,
        turn_index: int,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        self.input_ids.extend(ids)
        self.response_mask.extend([mask] * len(ids))
        self.behaviour_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.token_versions.extend(versions if versions is not None else [-1] * len(ids))
        self.turn_index.extend([turn_index] * len(ids))


@dataclass
class Group:
    """N trajectories of the same task and seed: the unit GRPO/GiGPO normalise over."""

    group_id: str
    env_id: str
    seed: int | None
    trajectories: list[Trajectory]
    created_version: int = 0  # trainer version when the group was admitted
    admission_index: int = 0  # order in which its buffer slot was granted (oldest-first ties)

    @property
    def oldest_version(self) -> int | None:
        versions = [v for t in self.trajectories if (v := t.oldest_version) is not None]
        return min(versions) if versions else None

    @property
    def newest_version(self) -> int | None:
        versions = [v for t in self.trajectories if (v := t.newest_version) is not None]
        return max(versions) if versions else None

    @property
    def token_mean_version(self) -> float | None:
        """The token-weighted mean policy version of the group's response tokens (None without tokens).

        A long episode that ran on across weight updates (partial rollouts resumed on the new
        weights) is judged by the versions most of its tokens carry, not by its first turn."""
        total = count = 0
        for trajectory in self.trajectories:
            version_sum, tokens = trajectory.version_sum_and_count()
            total, count = total + version_sum, count + tokens
        return total / count if count else None
