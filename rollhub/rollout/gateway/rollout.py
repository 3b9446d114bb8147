"""ProgramRollout: agent programs as the training loop's rollout source (the `RolloutSource` protocol).

It serves the gateway on a loopback port in front of the run's engine, and produces each group
by running the program once per member (rollhub.rollout.gateway.programs), the seeds drawn
from the run's seed source. Async mode fills the GroupBuffer with `fill_buffer`, the schedule
the env manager uses, so the admission bound and the staleness rule are the same; lockstep
mode runs `collect_batch` groups now. Weight updates pause the engine, load and resume it;
generations cut by the pause resume with their partial output inside the gateway, each token
stamped with the version that produced it.

Failures: a group whose programs all failed is not trained on (its slot is freed); after
`max_failed_groups` such groups in a row the rollout stops with a `RolloutFailureError` that
quotes the last failure, instead of the trainer waiting on a buffer nobody fills.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from rollhub.inference.engines.base import InferenceEngine
from rollhub.rollout.admission import fill_buffer
from rollhub.rollout.buffer import GroupBuffer, Ticket
from rollhub.rollout.gateway.app import build_gateway_app
from rollhub.rollout.gateway.config import GatewayConfig
from rollhub.rollout.gateway.programs import AgentProgram, run_program_group
from rollhub.rollout.gateway.service import Gateway
from rollhub.rollout.tasks import TaskOwner
from rollhub.rollout.trajectory_log import TrajectoryWriter
from rollhub.rollout.types import Group, RolloutFailureError, TrajectoryStatus
from rollhub.rollout.weight_update import timed_weight_update

logger = logging.getLogger(__name__)


class ProgramRollout(TaskOwner):
    """A RolloutSource whose episodes are agent programs' sessions (module docstring)."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        program: AgentProgram,
        *,
        env_id: str,
        group_size: int,
        seeds: Iterator[int],
        buffer: GroupBuffer | None = None,
        config: GatewayConfig | None = None,
        jsonl_path: str | None = None,
        timeout_s: float = 600.0,
        max_failed_groups: int = 5,
    ) -> None:
        if group_size < 1 or max_failed_groups < 1:
            raise ValueError("group_size and max_failed_groups must be >= 1")
        self.engine = engine
        self.gateway = Gateway(engine, tokenizer, config)
        self.program = program
        self.env_id = env_id
        self.group_size = group_size
        self.seeds = seeds
        self.buffer = buffer
        self.timeout_s = timeout_s
        self.max_failed_groups = max_failed_groups
        self.failure: BaseException | None = None
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task] = set()
        self._failed = asyncio.Event()
        self._writer = TrajectoryWriter(jsonl_path) if jsonl_path else None
        self._update_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._failed_in_a_row = 0
        self._started_at = time.perf_counter()
        self.counts = {"groups_done": 0, "groups_failed": 0, "trajectories_kept": 0, "infra_failures": 0}
        self.generated_tokens = 0
        self.weight_updates: list[dict[str, float]] = []

    async def start(self) -> str:
        """Serve the gateway on a free loopback port (once); returns its URL."""
        async with self._start_lock:  # groups start concurrently; one server
            if self.url is None:
                runner = web.AppRunner(build_gateway_app(self.gateway))
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                self._runner = runner
                self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return self.url

    async def _group(self) -> Group | None:
        """One group of program sessions, or None when every program of it failed."""
        url = await self.start()
        seed = next(self.seeds)
        group = await run_program_group(
            self.gateway,
            url,
            self.program,
            env_id=self.env_id,
            seed=seed,
            group_size=self.group_size,
            timeout_s=self.timeout_s,
        )
        failed = [t for t in group.trajectories if t.status is TrajectoryStatus.INFRA_FAILED]
        self.counts["infra_failures"] += len(failed)
        if len(failed) == len(group.trajectories):
            self.counts["groups_failed"] += 1
            self._failed_in_a_row += 1
            if self._failed_in_a_row >= self.max_failed_groups and self.failure is None:
                reason = failed[-1].infra_error if failed else "no trajectories"
                self.failure = RolloutFailureError(
                    f"the agent program failed in {self._failed_in_a_row} groups in a row; last: {reason}. "
                    "Run it by hand against `rollhub gateway` to see why."
                )
                self._failed.set()
            return None
        self._failed_in_a_row = 0
        self.counts["groups_done"] += 1
        self.counts["trajectories_kept"] += len(group.trajectories)
        self.generated_tokens += sum(t.num_response_tokens for t in group.trajectories)
        if self._writer is not None:
            self._writer.write_group(group)
        return group

    async def _group_into(self, ticket: Ticket) -> None:
        try:
            group = await self._group()
        except asyncio.CancelledError:  # shutdown: the slot must not stay taken
            ticket.buffer.release(ticket)
            raise
        except Exception as exc:  # the machinery's own failure: stop the run with it, never hang the trainer
            ticket.buffer.release(ticket)
            logger.exception("program group failed")
            if self.failure is None:
                self.failure = exc
                self._failed.set()
            return
        if group is not None:
            ticket.put(group)
        else:
            ticket.buffer.release(ticket)

    async def run(self, stop_event: asyncio.Event) -> None:
        """Keep the buffer full until `stop_event` is set (async mode)."""
        if self.buffer is None:
            raise ValueError("run() needs a GroupBuffer; use collect_batch() in lockstep mode")
        await fill_buffer(self, self.buffer, stop_event, self._failed.wait(), self._group_into)

    async def collect_batch(self, num_groups: int) -> list[Group]:
        """`num_groups` groups now (lockstep); groups whose programs all failed are re-run."""
        groups: list[Group] = []
        while len(groups) < num_groups:
            results = await asyncio.gather(*(self._group() for _ in range(num_groups - len(groups))))
            groups += [g for g in results if g is not None]
            if self.failure is not None:
                raise self.failure
        return groups

    async def update_weights(self, source: Any, version: int) -> None:
        """pause (in-flight generations abort) -> load -> resume (the gateway resumes them)."""
        async with self._update_lock:
            self.weight_updates.append(await timed_weight_update(self.engine, source, version))

    def summary(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self._started_at
        gateway = self.gateway.metrics.snapshot()
        data: dict[str, Any] = {
            **self.counts,
            "generated_tokens": self.generated_tokens,
            "generation_tokens_per_s": self.generated_tokens / elapsed if elapsed > 0 else 0.0,
            "weight_updates": list(self.weight_updates),
            **{f"gateway/{key}": value for key, value in gateway.items() if isinstance(value, (int, float))},
        }
        if self.buffer is not None:
            data.update(self.buffer.metrics())
        return data

    async def close(self) -> None:
        await self._cancel(set(self._tasks))
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._writer is not None:
            self._writer.close()
