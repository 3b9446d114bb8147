"""Agent programs as producers of training groups: N sessions per task, handed to the GroupBuffer.

An *agent program* is anything that talks to an OpenAI base URL: an async Python function
(`AgentProgram`, given a `ProgramTask`) or a command (`command_program`: a process started
with the session in its environment, `OPENAI_BASE_URL` included, so an unmodified program that
reads it runs as is). `run_program_group` starts one session per member of a group (same env
id and seed), runs the programs concurrently, ends every session and returns the Group of
their leaves. `produce_groups` does that for a run of seeds under the buffer's admission bound,
the same `async with buffer.admit()` contract the env manager keeps, so the trainer's
staleness rule applies to programs' episodes exactly as to its own.

The program gives the reward through the session API (`POST /sessions/{id}/reward`) or, for
an async function, `ProgramTask.set_reward`. A program that raises, exits non-zero or runs
past its timeout is the machinery's failure as far as the trainer can tell: its session's
trajectories are kept but marked INFRA_FAILED (never scored), with the reason, not dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.gateway.service import Gateway
from rollhub.rollout.types import Group, TrajectoryStatus

logger = logging.getLogger(__name__)


@dataclass
class ProgramTask:
    """What one run of an agent program gets: its session and the task it plays."""

    gateway: Gateway
    session_id: str
    base_url: str  # the session's OpenAI base URL: {gateway}/sessions/{id}/v1
    env_id: str
    seed: int | None
    member: int  # index within the group

    def set_reward(self, reward: float, node_id: str | None = None) -> None:
        """The reward of the whole session (or of the leaves under one completion)."""
        self.gateway.session(self.session_id).rewards[node_id] = float(reward)


AgentProgram = Callable[[ProgramTask], Awaitable[Any]]


def command_program(command: Sequence[str], *, extra_env: dict[str, str] | None = None) -> AgentProgram:
    """An AgentProgram that runs `command` with the session in its environment: OPENAI_BASE_URL,
    OPENAI_API_KEY (a placeholder), ROLLHUB_SESSION_ID, ROLLHUB_GATEWAY_URL, ROLLHUB_ENV_ID,
    ROLLHUB_SEED. A non-zero exit raises (the session is then marked failed)."""

    async def run(task: ProgramTask) -> None:
        gateway_url = task.base_url.split("/sessions/", 1)[0]
        env = {
            **os.environ,
            **(extra_env or {}),
            "OPENAI_BASE_URL": task.base_url,
            "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "rollhub"),
            "ROLLHUB_SESSION_ID": task.session_id,
            "ROLLHUB_GATEWAY_URL": gateway_url,
            "ROLLHUB_ENV_ID": task.env_id,
            "ROLLHUB_SEED": "" if task.seed is None else str(task.seed),
        }
        process = await asyncio.create_subprocess_exec(
            *command, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        try:
            _, stderr = await process.communicate()
        except asyncio.CancelledError:  # timed out or shut down: the process must not outlive its session
            process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            tail = stderr.decode(errors="replace")[-400:]
            raise RuntimeError(f"agent program exited with {process.returncode}: {tail}")

    return run


async def run_program_group(
    gateway: Gateway,
    gateway_url: str,
    program: AgentProgram,
    *,
    env_id: str,
    seed: int | None,
    group_size: int,
    timeout_s: float = 600.0,
) -> Group:
    """One group: `group_size` sessions of the same task, their programs run concurrently (module docstring)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    sessions = [gateway.start_session(env_id, seed) for _ in range(group_size)]
    group_id = f"{env_id}:{seed}:{uuid.uuid4().hex[:8]}"  # unique: a seed may be played again later
    for session in sessions:
        session.group_id = group_id
    tasks = [
        ProgramTask(gateway, s.session_id, f"{gateway_url}/sessions/{s.session_id}/v1", env_id, seed, index)
        for index, s in enumerate(sessions)
    ]
    outcomes = await asyncio.gather(
        *(asyncio.wait_for(program(task), timeout_s) for task in tasks), return_exceptions=True
    )
    trajectories = []
    for session, outcome in zip(sessions, outcomes):
        if session.session_id in gateway.sessions:  # the program may have ended it itself
            gateway.end_session(session.session_id)
        ended = gateway.claim_trajectories(session.session_id)
        if isinstance(outcome, BaseException):
            reason = "timed out" if isinstance(outcome, TimeoutError) else repr(outcome)
            logger.warning("agent program of session %s failed: %s", session.session_id, reason)
            for trajectory in ended:
                trajectory.status = TrajectoryStatus.INFRA_FAILED
                trajectory.infra_error = f"agent program: {reason}"
        trajectories.extend(ended)
    return Group(group_id=group_id, env_id=env_id, seed=seed, trajectories=trajectories)


async def produce_groups(
    gateway: Gateway,
    gateway_url: str,
    program: AgentProgram,
    buffer: GroupBuffer,
    *,
    env_id: str,
    seeds: Sequence[int],
    group_size: int,
    timeout_s: float = 600.0,
) -> int:
    """Run one group per seed, concurrently as far as the buffer admits, each put into `buffer`; returns the count."""

    async def one(seed: int) -> None:
        async with buffer.admit() as ticket:
            group = await run_program_group(
                gateway, gateway_url, program, env_id=env_id, seed=seed, group_size=group_size, timeout_s=timeout_s
            )
            ticket.put(group)

    await asyncio.gather(*(one(seed) for seed in seeds))
    return len(seeds)
