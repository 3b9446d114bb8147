"""Agent programs as producers of training groups: N sessions per task, handed to the GroupBuffer.

An *agent program* is anything that talks to an OpenAI base URL: an async Python function
(`AgentProgram`, given a `ProgramTask`) or a command (`command_program`: a process started
with the session in its environment, `OPENAI_BASE_URL` included, so an unmodified program that
reads it runs as is). `run_program_group` starts one session per member of a group (same env
id and seed), runs the programs concurrently, ends every session and returns the Group of
their leaves. `produce_groups` does that for a run of seeds under the buffer's admission bound,
the same `async with buffer.admit()` contract the env manager keeps, so the trainer's
staleness rule applies to programs' episodes exactly as to its own.

A command runs in its own process group, and the whole group is killed when the command
ends, fails or times out, so no process it started outlives its session; only the last bytes
of its stderr are kept (a program printing without end costs no memory). An async function
that ignores its cancellation is given `grace_s`, then abandoned: its session is ended
anyway, so its later calls get 409 and it can hold up nothing.

The program gives the reward through the session API (`POST /sessions/{id}/reward`) or, for
an async function, `ProgramTask.set_reward`. A program that raises, exits non-zero or runs
past its timeout is the machinery's failure as far as the trainer can tell: its session's
trajectories are kept but marked INFRA_FAILED (never scored), with the reason, not dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.gateway.errors import ApiError
from rollhub.rollout.gateway.rewards import checked_reward
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
    api_key: str | None = None  # the session's own key when the gateway has keys (OPENAI_API_KEY)

    def set_reward(self, reward: float, node_id: str | None = None) -> None:
        """The reward of the whole session (or of the leaves under one completion); a reward that is
        not a finite number within `max_abs_reward` raises ValueError (never trained on)."""
        try:
            value = checked_reward(reward, self.gateway.config.max_abs_reward)
        except ApiError as exc:
            raise ValueError(exc.message) from None
        self.gateway.session(self.session_id).rewards[node_id] = value


AgentProgram = Callable[[ProgramTask], Awaitable[Any]]


def command_program(command: Sequence[str], *, extra_env: dict[str, str] | None = None) -> AgentProgram:
    """An AgentProgram that runs `command` with the session in its environment: OPENAI_BASE_URL,
    OPENAI_API_KEY (the session's own key, or a placeholder), ROLLHUB_SESSION_ID, ROLLHUB_GATEWAY_URL, ROLLHUB_ENV_ID,
    ROLLHUB_SEED. A non-zero exit raises (the session is then marked failed)."""

    async def run(task: ProgramTask) -> None:
        gateway_url = task.base_url.split("/sessions/", 1)[0]
        env = {
            **os.environ,
            **(extra_env or {}),
            "OPENAI_BASE_URL": task.base_url,
            "OPENAI_API_KEY": task.api_key or os.environ.get("OPENAI_API_KEY", "rollhub"),
            "ROLLHUB_SESSION_ID": task.session_id,
            "ROLLHUB_GATEWAY_URL": gateway_url,
            "ROLLHUB_ENV_ID": task.env_id,
            "ROLLHUB_SEED": "" if task.seed is None else str(task.seed),
        }
        process = await asyncio.create_subprocess_exec(
            *command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: everything it starts is killed with it
        )
        tail = bytearray()
        reader = asyncio.ensure_future(_read_tail(process.stderr, tail))
        try:
            await _exited(process)
            _kill_group(process.pid)  # its children exit with it, closing their copies of stderr
            await asyncio.wait({reader}, timeout=5.0)  # one that left the group keeps it open: not waited on
        finally:  # ended, failed, timed out or cancelled: nothing it started may outlive the session
            await _stop_group(process)
            reader.cancel()
            await _exited(process)
        if process.returncode != 0:
            text = bytes(tail).decode(errors="replace")
            raise RuntimeError(f"agent program exited with {process.returncode}: {text}")

    return run


_STDERR_TAIL_BYTES = 400


async def _exited(process: asyncio.subprocess.Process) -> None:
    """Wait for the process itself to exit. Not `process.wait()`: on Python 3.11 that also waits for
    its pipes to close, which a child it left running keeps open (the group kill comes after)."""
    while process.returncode is None:
        await asyncio.sleep(0.05)


async def _read_tail(stream: asyncio.StreamReader | None, tail: bytearray) -> None:
    """Read a process's stderr to its end, keeping only its last bytes in `tail` (bounded memory)."""
    while stream is not None and (chunk := await stream.read(65536)):
        tail += chunk
        del tail[:-_STDERR_TAIL_BYTES]


_TERM_GRACE_S = 5.0


async def _stop_group(process: asyncio.subprocess.Process) -> None:
    """End a program still running (timed out or cancelled) with SIGTERM first, so it can release what
    it holds outside its process group (sandbox containers), then SIGKILL its whole group."""
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(_exited(process), timeout=_TERM_GRACE_S)
    _kill_group(process.pid)


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (a program's children and grandchildren included)."""
    _signal_group(pid, signal.SIGKILL)


async def _bounded(program: AgentProgram, task: ProgramTask, timeout_s: float, grace_s: float) -> Any:
    """The program's run, cancelled after `timeout_s`; one that will not stop within `grace_s` of its
    cancellation is abandoned (TimeoutError either way), so a group never waits on it."""
    run = asyncio.ensure_future(program(task))
    done, _ = await asyncio.wait({run}, timeout=timeout_s)
    if run in done:
        return run.result()
    run.cancel()
    done, _ = await asyncio.wait({run}, timeout=grace_s)
    if run not in done:
        logger.warning("agent program of session %s ignores its cancellation: abandoned", task.session_id)
        run.add_done_callback(lambda t: t.cancelled() or t.exception())  # no "never retrieved" warning
    raise TimeoutError(f"ran past its timeout of {timeout_s:g} s")


async def run_program_group(
    gateway: Gateway,
    gateway_url: str,
    program: AgentProgram,
    *,
    env_id: str,
    seed: int | None,
    group_size: int,
    timeout_s: float = 600.0,
    grace_s: float = 5.0,
) -> Group:
    """One group: `group_size` sessions of the same task, their programs run concurrently (module docstring)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    sessions = [gateway.start_session(env_id, seed) for _ in range(group_size)]
    group_id = f"{env_id}:{seed}:{uuid.uuid4().hex[:8]}"  # unique: a seed may be played again later
    for session in sessions:
        session.group_id = group_id
    tasks = [
        ProgramTask(gateway, s.session_id, f"{gateway_url}/sessions/{s.session_id}/v1", env_id, seed, index, s.api_key)
        for index, s in enumerate(sessions)
    ]
    outcomes = await asyncio.gather(
        *(_bounded(program, task, timeout_s, grace_s) for task in tasks), return_exceptions=True
    )
    trajectories = []
    for session, outcome in zip(sessions, outcomes):
        if session.session_id in gateway.sessions:  # the program may have ended it itself
            gateway.end_session(session.session_id)
        ended = gateway.claim_trajectories(session.session_id)
        if isinstance(outcome, BaseException):
            reason = f"timed out ({outcome})" if isinstance(outcome, TimeoutError) else repr(outcome)
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
