"""RayRollout: the driver side of rollout on a Ray cluster.

What runs where:
* driver (this object, next to the trainer): the GroupBuffer and its admission control,
  the seed stream, the JSONL log, weight pushes, health checks, accounting;
* K `EnvShard` actors (spread over nodes, or pinned with custom resources such as
  `sandbox_host`): each owns an EnvManager, its envs and their sandboxes;
* the engine fleet: the `engine:` section's launched servers with `engine.placement: ray`
  (rollhub.inference.engines.launcher + hosts: one small Ray actor per server), the same
  launcher, watchdog, replacement policy and weight sync (disk, gloo, NCCL) as on one
  machine; every shard routes over its servers with an `EngineRouter` of its own.

Same surface as EnvManager: `run(stop_event)`, `collect_batch(n)`,
`update_weights(source, version)`, `summary()`, `close()`, so the trainer loop picks one
or the other by `cluster.backend` and is otherwise unchanged.

Weight push, through the fleet's weight sync (`engine.weight_sync`: disk on a shared path,
or a gloo/NCCL broadcast):
  shards hold (client gate) -> servers pause (abort in flight; partial outputs return and
  the runners resubmit into the closed gate) -> the fleet pushes -> shards release
  with the new version -> servers continue.
No request is submitted between pause and release, so every token's version is exact.

Access: the driver makes one API key per run (or takes ROLLHUB_API_KEY); engine servers
require it as a bearer token, and the routers (the driver's and, through the shard actors'
environment, every shard's) send it.

Faults: a shard that dies loses exactly the groups it was running; each is counted
(`cluster/groups_lost`, `cluster/trajectories_lost`), its ticket is released, and a new
shard takes its place. A dead engine server is the fleet's to replace (engine.max_replacements);
the shards get the new table, and requests that were on it are re-sent by their routers to
the remaining servers meanwhile.
Ledger, checked at every `summary()`:
  groups_dispatched = groups_completed + groups_lost + groups_failed + groups_cancelled + groups_running
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.inference.engines.build import EngineConfig
from rollhub.inference.engines.hosts import ensure_ray as connect_ray
from rollhub.inference.engines.hosts import import_ray
from rollhub.inference.engines.sglang import API_KEY_ENV
from rollhub.rollout.admission import fill_buffer
from rollhub.rollout.agent import AgentConfig
from rollhub.rollout.buffer import GroupBuffer, Ticket
from rollhub.rollout.cluster.config import ClusterConfig
from rollhub.rollout.config import EnvConfig, RolloutConfig
from rollhub.rollout.tasks import TaskOwner
from rollhub.rollout.types import Group

logger = logging.getLogger(__name__)


def ensure_ray(config: ClusterConfig) -> bool:
    """Connect to (or start) the run's Ray; True when this call started it (and should shut it down)."""
    return connect_ray(config.address, config.local_num_cpus)


def _actor_died_errors(ray: Any) -> tuple[type[BaseException], ...]:
    from ray import exceptions

    names = (
        "RayActorError",
        "ActorDiedError",
        "ActorUnavailableError",
        "OwnerDiedError",
        "WorkerCrashedError",
        "NodeDiedError",
    )
    return tuple(getattr(exceptions, n) for n in names if hasattr(exceptions, n))


@dataclass
class _Slot:
    """One shard or engine position; its actor changes when it is replaced."""

    slot_id: str
    handle: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    incarnation: int = 0
    running: int = 0  # groups in flight (shards)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class ClusterLedger:
    groups_dispatched: int = 0
    groups_completed: int = 0  # put into the buffer
    groups_lost: int = 0  # their shard died
    trajectories_lost: int = 0
    groups_failed: int = 0  # the shard raised (a bug or an env that cannot be built)
    groups_cancelled: int = 0  # stop / close while running
    shards_replaced: int = 0
    engines_replaced: int = 0
    weight_pushes: int = 0

    def running(self) -> int:
        return (
            self.groups_dispatched
            - self.groups_completed
            - self.groups_lost
            - self.groups_failed
            - self.groups_cancelled
        )


class RayRollout(TaskOwner):
    def __init__(
        self,
        model_path: str | Path,
        cluster: ClusterConfig,
        *,
        env: EnvConfig | None = None,
        rollout: RolloutConfig | None = None,
        agent: AgentConfig | None = None,
        engine: EngineConfig | Any = None,
        buffer: GroupBuffer | None = None,
        seeds: Iterator[int] | None = None,
        run_dir: str | Path = "runs/ray",
        jsonl_path: str | None = None,
        weight_version: int = 0,
        name_prefix: str | None = None,
    ) -> None:
        cluster.validate()  # load_config validates too; this covers direct construction
        self.model_path = str(model_path)
        self.env = env or EnvConfig()
        self.rollout = rollout or RolloutConfig()
        self.agent = agent or AgentConfig()
        self.jsonl_path = jsonl_path
        self.cluster = cluster
        self.buffer = buffer
        self._seeds = seeds if seeds is not None else itertools.count(self.env.train_seed_offset)
        self.run_dir = Path(run_dir)
        self.weight_version = weight_version
        self.name_prefix = name_prefix or f"rollhub-{uuid.uuid4().hex[:8]}"  # actors are named PREFIX.slot.incarnation
        # the engine fleet: a started or unstarted ServerEngine on Ray (the trainer's, not closed here), or
        # built here from an `engine:` section (and closed with this rollout)
        self._owns_fleet = engine is None or isinstance(engine, EngineConfig)
        self.fleet: Any = self._build_fleet(engine) if self._owns_fleet else engine
        self._api_key = self.fleet.api_key  # the fleet's servers require it; the shards' routers send it
        self.ledger = ClusterLedger()
        self.weight_updates: list[dict[str, float]] = []
        self._shards = [_Slot(f"shard-{k}") for k in range(cluster.num_env_shards)]
        self._retired_summaries: list[dict[str, Any]] = []
        self._shard_summaries: dict[str, dict[str, Any]] = {}
        self._writer: Any = None
        self._update_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._owns_ray = False
        self._closed = False
        self._ray: Any = None
        self._died: tuple[type[BaseException], ...] = ()
        self._fatal: asyncio.Future | None = None  # set when the cluster cannot go on (replacements used up)

    def _build_fleet(self, config: EngineConfig | None) -> Any:
        from rollhub.inference.engines.build import build_engine

        config = config or EngineConfig(backend="server", placement="ray")
        if config.backend != "server" or config.placement != "ray":
            raise UserError(
                "cluster.backend=ray serves rollouts from engine servers on Ray: set engine.backend=server "
                "and engine.placement=ray"
            )
        fleet = build_engine(config, self.model_path, run_dir=self.run_dir)
        fleet.placement.name_prefix = self.name_prefix  # its actors are this run's: PREFIX.replica-i.n
        return fleet

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._owns_ray = ensure_ray(self.cluster)
        self._ray = import_ray()
        self._died = _actor_died_errors(self._ray)
        self._started = True
        self._fatal = asyncio.get_running_loop().create_future()
        if self.jsonl_path:
            from rollhub.rollout.trajectory_log import TrajectoryWriter

            self._writer = TrajectoryWriter(self.jsonl_path)
        started = time.perf_counter()
        await self.fleet.start()
        self.fleet.on_replicas_changed(self._engines_changed)
        if self.weight_version and not self.fleet.weight_version:
            self.fleet.set_weight_version(self.weight_version)
        self.weight_version = self.fleet.weight_version
        await asyncio.gather(*(self._start_shard(slot) for slot in self._shards))
        logger.info(
            "ray rollout up in %.1f s: %d engines (%s), %d env shards",
            time.perf_counter() - started,
            len(self.fleet.replicas),
            self.fleet.placement.name,
            len(self._shards),
        )

    def _actor_name(self, slot: _Slot) -> str:
        return f"{self.name_prefix}.{slot.slot_id}.{slot.incarnation}"

    def _engine_urls(self) -> dict[str, str]:
        return self.fleet.serving_urls()

    async def _engines_changed(self, urls: dict[str, str]) -> None:
        """The fleet replaced a server (or ran out of replacements): the shards route over the new table."""
        self.ledger.engines_replaced = self.fleet.stats.engines_replaced
        if urls:
            await self._on_shards("set_engines", urls)
        elif self._fatal is not None and not self._fatal.done():
            self._fatal.set_result(
                RuntimeError(
                    f"every engine server is down and engine.max_replacements={self.fleet.max_replacements} "
                    "is used up; check the servers' logs"
                )
            )

    async def _start_shard(self, slot: _Slot) -> None:
        from rollhub.rollout.cluster.env_shard import EnvShard

        c = self.cluster
        options: dict[str, Any] = {
            "name": self._actor_name(slot),
            "num_cpus": c.shard_num_cpus,
            "resources": dict(c.shard_resources),
            "scheduling_strategy": "SPREAD",
            "max_concurrency": 10_000,
            # the shard's EngineRouter reads the key from its environment (SGLangEngine default)
            "runtime_env": {"env_vars": {API_KEY_ENV: self._api_key}},
        }
        urls, version = self._engine_urls(), self.weight_version
        actor = (
            self._ray.remote(EnvShard)
            .options(**options)
            .remote(
                f"{slot.slot_id}.{slot.incarnation}",
                self.model_path,
                self.env,
                self.rollout,
                self.agent,
                urls,
                version,
                reap_orphan_sandboxes=c.reap_orphan_sandboxes,
            )
        )
        slot.handle = actor  # recorded before it is up, so close() can kill it whatever happens
        slot.info = await asyncio.wait_for(actor.start.remote(), timeout=c.startup_timeout_s)
        if urls != self._engine_urls():  # an engine was replaced while this shard started
            await actor.set_engines.remote(self._engine_urls())
        if version != self.weight_version:  # a weight push finished while this shard started
            await actor.release.remote(self.weight_version)
        slot.incarnation += 1
        slot.running = 0
        slot.ready.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._cancel(set(self._tasks))
        if self._started:
            shards = [s for s in self._shards if s.handle is not None]
            finals = await asyncio.gather(*(self._stop_actor(s) for s in shards))
            for slot, final in zip(shards, finals):
                if final is not None:  # a dead shard keeps its last known counters
                    self._shard_summaries[slot.slot_id] = final
        if self._owns_fleet:
            await self.fleet.close()
        if self._writer is not None:
            self._writer.close()
        if self._owns_ray:
            self._ray.shutdown()

    async def _stop_actor(self, slot: _Slot) -> Any:
        """Graceful stop (envs and sandboxes closed, final counters), then kill."""
        try:
            return await asyncio.wait_for(slot.handle.stop.remote(), timeout=30)
        except Exception as exc:
            logger.warning("stopping %s failed: %s", slot.slot_id, str(exc).splitlines()[0] if str(exc) else repr(exc))
            return None
        finally:
            self._ray.kill(slot.handle)

    # --- rollout (EnvManager surface) ----------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the cluster (e.g. replacements used up), once there is one."""
        if self._fatal is not None and self._fatal.done() and not self._fatal.cancelled():
            return self._fatal.result()
        return None

    async def run(self, stop_event: asyncio.Event) -> None:
        """Keep the driver's buffer full through the shards until stop_event is set."""
        if self.buffer is None:
            raise ValueError("run() needs a GroupBuffer (RayRollout(..., buffer=GroupBuffer(B, alpha)))")
        await self.start()
        await fill_buffer(self, self.buffer, stop_event, self._fatal, self._dispatch)

    async def collect_batch(self, num_groups: int) -> list[Group]:
        """Sync use: `num_groups` groups spread over the shards (lost ones are re-dispatched)."""
        await self.start()
        kept: list[Group] = []
        while len(kept) < num_groups:
            results = await asyncio.gather(*(self._dispatch(None) for _ in range(num_groups - len(kept))))
            kept.extend(g for g in results if g is not None)
        return kept

    async def _dispatch(self, ticket: Ticket | None) -> Group | None:
        """Run one group on the least busy shard; on success it goes into the buffer (ticket)."""
        slot = await self._pick_shard()
        seed = next(self._seeds)
        handle, incarnation = slot.handle, slot.incarnation
        ref = handle.run_group.remote(seed)
        self.ledger.groups_dispatched += 1
        slot.running += 1
        try:
            group, shard_summary = await ref
        except asyncio.CancelledError:
            self._ray.cancel(ref)
            self.ledger.groups_cancelled += 1
            self._release(ticket)
            raise
        except self._died as exc:
            self.ledger.groups_lost += 1
            self.ledger.trajectories_lost += self.rollout.group_size + self.rollout.redundant_trajectories
            self._release(ticket)
            logger.warning(
                "%s died with group of seed %d in flight (%s); counted as lost", slot.slot_id, seed, type(exc).__name__
            )
            self._replace_shard(slot, incarnation)
            return None
        except Exception as exc:
            self.ledger.groups_failed += 1
            self._release(ticket)
            logger.error("%s failed a group (seed %d): %r", slot.slot_id, seed, exc)
            return None
        finally:
            if slot.incarnation == incarnation:
                slot.running -= 1
        self.ledger.groups_completed += 1
        if shard_summary is not None:
            self._shard_summaries[slot.slot_id] = shard_summary
        if self._writer is not None:
            self._writer.write_group(group)
        if ticket is not None:
            ticket.put(group)
        return group

    def _release(self, ticket: Ticket | None) -> None:
        if ticket is not None:
            self.buffer.release(ticket)

    async def _pick_shard(self) -> _Slot:
        """The ready shard with the fewest groups running; waits while all are being replaced."""
        while True:
            if self._fatal is not None and self._fatal.done():
                raise self._fatal.result()
            ready = [s for s in self._shards if s.ready.is_set()]
            if ready:
                return min(ready, key=lambda s: s.running)
            waiters = {asyncio.ensure_future(s.ready.wait()) for s in self._shards}
            _, pending = await asyncio.wait(waiters | {self._fatal}, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending - {self._fatal}:
                waiter.cancel()

    # --- faults ---------------------------------------------------------------------------

    def _spend_replacement(self, what: str) -> None:
        if self.ledger.shards_replaced > self.cluster.max_replacements:
            error = RuntimeError(
                f"{what} died and cluster.max_replacements={self.cluster.max_replacements} is used up; "
                "check the Ray logs of the dead actors"
            )
            if self._fatal is not None and not self._fatal.done():
                self._fatal.set_result(error)  # run() raises it; a task's own exception would go unseen
            raise error

    def _replace_shard(self, slot: _Slot, incarnation: int) -> None:
        """Start a replacement once per death (several lost groups report the same death).

        It runs as its own task, so stopping the run mid-replacement neither abandons a
        half-started actor (close() kills `slot.handle`) nor blocks the dispatch that saw it.
        """
        if slot.incarnation != incarnation or not slot.ready.is_set():
            return
        slot.ready.clear()
        old = self._shard_summaries.pop(slot.slot_id, None)
        if old:
            self._retired_summaries.append(old)
        self.ledger.shards_replaced += 1
        logger.warning("replacing %s (incarnation %d)", slot.slot_id, incarnation)
        self._ray.kill(slot.handle)
        self._spawn(self._restart_shard(slot))

    async def _restart_shard(self, slot: _Slot) -> None:
        try:
            self._spend_replacement(slot.slot_id)
            await self._start_shard(slot)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._fatal is not None and not self._fatal.done():
                self._fatal.set_result(RuntimeError(f"could not replace {slot.slot_id}: {exc!r}"))

    async def _on_shards(self, method: str, *args: Any) -> None:
        """Call `method` on every ready shard; a dead one is left to its dispatch to replace."""
        ready = [s for s in self._shards if s.ready.is_set()]
        results = await asyncio.gather(
            *(getattr(s.handle, method).remote(*args) for s in ready), return_exceptions=True
        )
        for slot, result in zip(ready, results):
            if isinstance(result, BaseException):
                logger.warning("%s.%s failed: %r", slot.slot_id, method, result)

    def kill_shard(self, index: int) -> int:
        """Fault injection: kill shard `index` now; returns how many groups it was running."""
        slot = self._shards[index]
        running = slot.running if slot.ready.is_set() else 0
        self._ray.kill(slot.handle)
        return running

    def kill_engine(self, index: int) -> None:
        """Fault injection: kill engine server `index` now (its requests get re-routed)."""
        self.fleet.replicas[index].process.kill()

    # --- weights --------------------------------------------------------------------------

    async def update_weights(self, source: Any, version: int) -> None:
        """Push weights to every engine with the hold -> pause -> push -> release -> continue protocol."""
        await self.start()
        async with self._update_lock:
            started = time.perf_counter()
            await self._on_shards("hold")
            await self.fleet.pause()
            paused = time.perf_counter()
            try:
                await self.fleet.update_weights(source, version)
                self.weight_version = version
            finally:
                updated = time.perf_counter()
                await self._on_shards("release", self.weight_version)
                await self.fleet.resume()
            self.ledger.weight_pushes += 1
            push = self.fleet.last_push
            self.weight_updates.append(
                {
                    "version": version,
                    "method": push.get("method", ""),
                    "write_s": push.get("write_s", 0.0),
                    "pause_s": paused - started,
                    "update_s": updated - paused,
                    "resume_s": time.perf_counter() - updated,
                }
            )

    # --- metrics -------------------------------------------------------------------------

    def shard_summaries(self) -> list[dict[str, Any]]:
        """Last known counters of every shard that ever ran (live ones and replaced ones)."""
        return [*self._retired_summaries, *self._shard_summaries.values()]

    def summary(self) -> dict[str, Any]:
        totals: dict[str, float] = {}
        routers: dict[str, int] = {}
        for shard in self.shard_summaries():
            for key in (
                "generated_tokens",
                "wasted_tokens",
                "trajectories_kept",
                "redundant_cancelled",
                "groups_redundant_cancelled",
                "infra_failures",
                "infra_retries",
                "groups_dropped_infra",
                "groups_done",
            ):
                totals[key] = totals.get(key, 0) + shard.get(key, 0)
            for key, value in shard.get("router", {}).items():
                routers[key] = routers.get(key, 0) + value
        data: dict[str, Any] = dict(totals)
        data.update({f"router/{k}": v for k, v in routers.items()})
        self.ledger.engines_replaced = self.fleet.stats.engines_replaced
        data.update({f"cluster/{k}": v for k, v in dataclasses.asdict(self.ledger).items()})
        data["cluster/groups_running"] = self.ledger.running()
        data["cluster/shard_nodes"] = {s.slot_id: s.info.get("node_ip") for s in self._shards}
        data["cluster/engine_nodes"] = {
            r.replica_id: getattr(r.process, "node_ip", None) for r in self.fleet.replicas if r.live
        }
        data["weight_updates"] = list(self.weight_updates)
        if self.buffer is not None:
            data.update(self.buffer.metrics())
        return data

    # --- tasks ---------------------------------------------------------------------------
