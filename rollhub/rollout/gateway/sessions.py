"""Sessions: one agent program's conversation with the policy, kept as a tree of model calls.

Each completion the gateway returns is a node: the messages the call sent (as `message_key`s),
the assistant message it answered, and the exact prompt ids, response ids, behaviour
log-probs and policy versions. A later call *extends* a node when its messages are that
node's messages plus its answer plus new messages; its prompt is then the node's prompt and
response ids followed by the template's rendering of the new messages only (the
gateway builds it), so nothing the model wrote is tokenised again.

A call that extends no node (the history was rewritten, edited, truncated) starts a new
root, rendered whole by the template; a call that extends a node that already has a child
(a retry, a fork) adds a sibling. Both are *branches*: nothing is overwritten or dropped,
and every leaf exports as one sample (`Trajectory`), its turns the nodes from its root.
Two leaves that share nodes both carry them: each leaf is a whole episode the program ran.

Completions-API calls are nodes too; one extends an earlier node when its prompt starts
with that node's prompt and completion (as ids, or as text).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from rollhub.rollout.types import Group, Trajectory, TrajectoryStatus, Turn

#: how a call related to its session: the first call, a continuation, or a branch (see module docstring)
CallKind = Literal["first", "extend", "fork", "new_root"]
BRANCH_KINDS = frozenset({"fork", "new_root"})


@dataclass
class Node:
    """One returned completion (one choice of one call)."""

    node_id: str
    parent: Node | None
    message_keys: list[str] | None  # chat calls: the request's messages; None for completions calls
    tools_key: str  # the tools the call declared (a continuation must declare the same)
    answer_key: str | None  # the assistant message returned, as `message_key` sees it (chat calls)
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    text: str
    finish_reason: str
    prompt_text: str | None = None  # completions calls with a text prompt
    children: list[Node] = field(default_factory=list)

    def path(self) -> list[Node]:
        nodes: list[Node] = []
        node: Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


@dataclass
class Session:
    """One episode of an agent program (module docstring); the env id and seed name its task."""

    session_id: str
    env_id: str = "gateway"
    seed: int | None = None
    group_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    calls: int = 0
    branched_calls: int = 0
    ended: bool = False
    success: bool = False  # the program says the task was solved (`POST /sessions/{id}/reward`)
    rewards: dict[str | None, float] = field(default_factory=dict)  # node id (None = whole session) -> reward
    started_s: float = field(default_factory=time.perf_counter)
    last_active_s: float = field(default_factory=time.monotonic)  # a call began or ended (the idle timeout)
    in_flight: int = 0  # generation calls running now
    api_key: str | None = None  # opens this session's routes only (set when the gateway has keys)
    failure: str | None = None  # why the session ended without the program ending it (exported as INFRA_FAILED)

    def find_chat_parent(self, keys: list[str], tools_key: str) -> tuple[Node | None, int]:
        """The deepest node this call extends and how many of `keys` it covers (its messages + answer)."""
        best: Node | None = None
        covered = 0
        for node in self.nodes:
            if node.message_keys is None or node.answer_key is None or node.tools_key != tools_key:
                continue
            size = len(node.message_keys) + 1
            if size <= len(keys) and size > covered and keys[: size - 1] == node.message_keys:
                if keys[size - 1] == node.answer_key:
                    best, covered = node, size
        return best, covered

    def find_completion_parent(self, prompt_ids: list[int] | None, prompt_text: str | None) -> tuple[Node | None, Any]:
        """The longest completions node this prompt continues, and the rest (ids or text) after it."""
        best: Node | None = None
        rest: Any = None
        best_size = -1
        for node in self.nodes:
            if node.message_keys is not None:
                continue
            if prompt_ids is not None:
                done = node.prompt_ids + node.response_ids
                if len(done) > best_size and prompt_ids[: len(done)] == done:
                    best, rest, best_size = node, prompt_ids[len(done) :], len(done)
            elif node.prompt_text is not None:
                done_text = node.prompt_text + node.text
                if len(done_text) > best_size and prompt_text is not None and prompt_text.startswith(done_text):
                    best, rest, best_size = node, prompt_text[len(done_text) :], len(done_text)
        return best, rest

    def record(self, parent: Node | None, nodes: list[Node]) -> CallKind:
        """Add one call's nodes (one per choice) under `parent`; returns how the call related to the session."""
        if parent is None:
            kind: CallKind = "first" if not self.nodes else "new_root"
        else:
            kind = "fork" if parent.children else "extend"
            parent.children.extend(nodes)
        self.nodes.extend(nodes)
        self.calls += 1
        if kind in BRANCH_KINDS:
            self.branched_calls += 1
        return kind

    def node(self, node_id: str) -> Node | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    def leaves(self) -> list[Node]:
        return [n for n in self.nodes if not n.children]

    def to_trajectories(self) -> list[Trajectory]:
        """One Trajectory per leaf (module docstring); the reward goes on its last turn."""
        trajectories = []
        for index, leaf in enumerate(self.leaves()):
            path = leaf.path()
            turns = [
                Turn(
                    prompt_ids=list(n.prompt_ids),
                    response_ids=list(n.response_ids),
                    behaviour_logprobs=list(n.logprobs),
                    token_versions=list(n.versions),
                    response_text=n.text,
                    finish_reason=n.finish_reason if n.finish_reason in ("stop", "length", "abort") else "stop",
                )
                for n in path
            ]
            turns[-1].reward = self._reward_for(path)
            trajectories.append(
                Trajectory(
                    env_id=self.env_id,
                    seed=self.seed,
                    turns=turns,
                    status=TrajectoryStatus.COMPLETED if self.failure is None else TrajectoryStatus.INFRA_FAILED,
                    infra_error=self.failure,
                    success=self.success,
                    group_id=self.group_id,
                    trajectory_id=f"{self.session_id}-{index}",
                    timings_s={"total": time.perf_counter() - self.started_s},
                    info={
                        "session_id": self.session_id,
                        "leaf_node_id": leaf.node_id,
                        "leaves": len(self.leaves()),
                        "calls": self.calls,
                        "branched_calls": self.branched_calls,
                        **({"metadata": self.metadata} if self.metadata else {}),
                    },
                )
            )
        return trajectories

    def _reward_for(self, path: list[Node]) -> float:
        """The reward given to the deepest node on `path`, else the session's, else 0."""
        for node in reversed(path):
            if node.node_id in self.rewards:
                return self.rewards[node.node_id]
        return self.rewards.get(None, 0.0)


def new_node_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass
class GatewayMetrics:
    """Counts behind `bridge_break_rate` (branched calls / all session calls) and branches per session."""

    calls: int = 0  # generation calls on sessions
    stateless_calls: int = 0  # calls outside any session (not recorded)
    kinds: dict[str, int] = field(default_factory=lambda: {"first": 0, "extend": 0, "fork": 0, "new_root": 0})
    rejected_busy: int = 0  # answered 429
    sessions_timed_out: int = 0  # ended by the idle timeout, exported as failed
    sessions_started: int = 0
    sessions_ended: int = 0
    leaves_exported: int = 0
    completion_tokens: int = 0

    def snapshot(self) -> dict[str, Any]:
        branched = self.kinds["fork"] + self.kinds["new_root"]
        return {
            "calls": self.calls,
            "stateless_calls": self.stateless_calls,
            "calls_by_kind": dict(self.kinds),
            "bridge_break_rate": branched / self.calls if self.calls else 0.0,
            "branches_per_session": self.leaves_exported / self.sessions_ended if self.sessions_ended else 0.0,
            "rejected_busy": self.rejected_busy,
            "sessions_started": self.sessions_started,
            "sessions_ended": self.sessions_ended,
            "sessions_timed_out": self.sessions_timed_out,
            "leaves_exported": self.leaves_exported,
            "completion_tokens": self.completion_tokens,
        }


def group_trajectories(trajectories: list[Trajectory]) -> list[Group]:
    """Ended sessions' trajectories as Groups by `group_id` (sessions of one task and seed), for the GroupBuffer."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        key = trajectory.group_id or f"{trajectory.env_id}:{trajectory.seed}"
        groups.setdefault(key, []).append(trajectory)
    return [
        Group(group_id=key, env_id=members[0].env_id, seed=members[0].seed, trajectories=members)
        for key, members in groups.items()
    ]
