"""EngineRouter: one InferenceEngine over N SGLang-speaking servers (replicas).

Used by the `server` engine backend (replicas launched by rollhub, here or on Ray nodes, or
attached by URL, see `rollhub.inference.engines.launcher`) and by every Ray env shard
(`rollhub.rollout.cluster`), which routes over the launcher's replicas.

Routing. A request id is `<trajectory_id>-<n>` and a trajectory id `<group_id>-<k>` (the
env manager's naming), so the group is the request id less its last two `-` parts. All
requests of one group go to the replica that served the group's first request while it is
up: a GRPO group starts N trajectories from the same prompt, and every later turn extends
its own earlier prompt, so that replica's prefix cache holds what the next request needs.
A group seen for the first time goes to the replica with the fewest outstanding tokens
(prompt + max new tokens of the requests in flight there; ties rotate), which balances
work rather than request counts: a 2,000-token prompt weighs more than a 50-token one.

Failures. A replica is marked down when a request or control call to it finds the server
gone (connection refused or reset), when its launched process exits, or by the watchdog:
every `watchdog_interval_s` it asks `/ping` (SGLang answers it from the HTTP loop alone, so a
busy or paused engine still answers; any HTTP answer below 500 counts, so a server without
the route answers 404 and is alive) and `watchdog_misses` misses in a row of
`watchdog_timeout_s` each mean a stopped, dead or unreachable server (a few seconds); every
`watchdog_generate_timeout_s` it asks `/health_generate`, a real one-token generation, and
no answer within that time while no request on the replica finished meanwhile means a
wedged engine (a busy engine that keeps finishing requests is slow, not wedged).
Not `/health` for liveness: SGLang serves `/health` with the same one-token generation,
which waits while generation is paused and answers 503 after 20 s. So while the router is
paused or pushing weights the watchdog asks nothing (a launched process that exits is still
seen), and a generation probe that overlapped a pause is discarded, whatever it answered.
Marking a replica down cancels its in-flight requests at once; each is re-sent, whole, to
another replica at most `max_reroutes` times (its prompt ids hold the full history, so
only KV cache is lost, never tokens), and otherwise fails
with `ReplicaError`, which the env manager counts as an infra failure (the failure rule of
rollhub.rollout.types). A launched replica that is marked down is killed. A down server
never serves again (it missed weight pushes); the launcher may relaunch its slot as a new
server from the latest weights (`revive`, engine.max_replacements), with a new client.

Weights. `update_weights(source, version)` pauses (unless the caller already did: the env
manager pauses first), hands the live replicas to the configured weight sync (`push`), sets
the clients' version (used only where a server reports none), and resumes. `hold()` closes
a client-side gate so that no request is submitted between "servers paused" and "new
version set". Token versions are the server's own report (`meta_info.weight_version`, see
rollhub.inference.engines.sglang), so a request that reaches a server after a push is
labelled with the version that produced it.

Every client sends the run's API key (`api_key`, default ROLLHUB_API_KEY).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams
from rollhub.inference.engines.sglang import SGLangEngine, SGLangError, resolve_api_key

logger = logging.getLogger(__name__)

#: liveness: SGLang's `/ping` is answered by the HTTP loop (its `/health` runs a generation)
LIVENESS_PATH = "/ping"


class ReplicaError(SGLangError):
    """No replica could serve a request (all down, or the re-send failed too): an infra failure."""


class ServerProcess(Protocol):
    """What the router needs of a replica's launched process (see launcher.LaunchedServer)."""

    def exit_reason(self) -> str | None:
        """None while running; else why it stopped (exit code and where its log is)."""

    def kill(self) -> None: ...


class WeightSync(Protocol):
    """Moves a new policy version into the given replicas (rollhub.inference.weight_sync)."""

    async def push(self, clients: list[SGLangEngine], state_or_path: Any, version: int) -> None: ...


def group_key(request_id: str | None, input_ids: list[int]) -> str:
    """The GRPO group of a request id `<group_id>-<k>-<n>`; else a hash of the prompt's start.

    Ids with only one `-` (`<trajectory_id>-<n>` of callers without groups) key by trajectory.
    """
    if request_id and request_id.count("-") >= 2:
        return request_id.rsplit("-", 2)[0]
    if request_id and "-" in request_id:
        return request_id.rsplit("-", 1)[0]
    return "prompt:" + str(hash(tuple(input_ids[:64])))


#: the key of the Ray router's earlier name (kept for callers of the old API)
affinity_key = group_key


@dataclass
class RouterStats:
    requests: int = 0
    affinity_hits: int = 0  # requests sent to the replica that served their group before
    requests_rerouted: int = 0  # re-sent to another replica after their replica failed
    requests_failed: int = 0  # no replica left to re-send to: raised ReplicaError (infra)
    engines_marked_down: int = 0
    watchdog_detections: int = 0  # replicas marked down by the watchdog (hung or exited)
    engines_replaced: int = 0  # launched replicas relaunched in their slot (launcher: engine.max_replacements)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Replica:
    """One server behind the router; `process` is set when rollhub launched it."""

    replica_id: str
    url: str
    process: ServerProcess | None = None
    client: SGLangEngine | None = None
    outstanding_tokens: int = 0
    in_flight: int = 0
    last_finished: float = field(default_factory=time.monotonic)  # last request it answered
    down_reason: str | None = None
    missed: int = 0  # watchdog liveness probes missed in a row
    down: asyncio.Event | None = None  # set when marked down (created on the router's loop)
    awaiting_push: bool = False  # a replacement that serves only once the next weight push reached it

    @property
    def live(self) -> bool:
        return self.down_reason is None and not self.awaiting_push

    @property
    def up(self) -> bool:
        """Running and watched (serving, or a replacement waiting for the next push)."""
        return self.down_reason is None


class DiskPush:
    """The built-in `disk` weight sync: versioned HF folders, `/update_weights_from_disk` on each.

    A state dict is written once to `weights_dir/v<version>` (into a `.partial` sibling, then
    renamed, so a server never reads a half-written folder); a path is loaded as given. The
    newest `keep` folders are kept (a server being updated may still read the previous one).
    """

    def __init__(self, weights_dir: str | Path | None, model_path: str | None, *, keep: int = 2) -> None:
        self.weights_dir = Path(weights_dir) if weights_dir else None  # None: a temporary folder on first use
        self.model_path = model_path
        self.keep = keep

    async def push(self, clients: list[SGLangEngine], state_or_path: Any, version: int) -> None:
        path = await asyncio.to_thread(self._materialise, state_or_path, version)
        await asyncio.gather(*(client.update_weights(path, version) for client in clients))
        await asyncio.to_thread(self._prune, path)

    def _materialise(self, source: Any, version: int) -> str:
        if not isinstance(source, dict):
            return str(source)
        from rollhub.inference.engines.sglang import write_version_folder

        if self.weights_dir is None:
            import tempfile

            self.weights_dir = Path(tempfile.mkdtemp(prefix="rollhub-weights-"))
        return write_version_folder(source, self.weights_dir, version, self.model_path)

    def _prune(self, latest: str) -> None:
        if self.weights_dir is None or not self.weights_dir.is_dir():
            return
        folders = sorted(p for p in self.weights_dir.glob("v*") if p.is_dir() and not p.name.endswith(".partial"))
        for old in folders[: -self.keep]:
            if str(old) != latest:
                shutil.rmtree(old, ignore_errors=True)


class EngineRouter(InferenceEngine):
    """See the module docstring. `urls` maps replica ids to server URLs (or pass `Replica`s)."""

    def __init__(
        self,
        urls: dict[str, str] | Iterable[Replica],
        *,
        timeout_s: float = 3600.0,
        affinity_capacity: int = 100_000,
        api_key: str | None = None,
        watchdog_interval_s: float | None = None,
        watchdog_timeout_s: float = 3.0,
        watchdog_misses: int = 2,
        watchdog_generate_timeout_s: float = 30.0,
        control_timeout_s: float = 120.0,
        max_reroutes: int = 1,
        weight_sync: WeightSync | None = None,
        weights_dir: str | Path | None = None,
        model_path: str | None = None,
        tokenizer_path: str | None = None,
    ) -> None:
        if watchdog_interval_s is not None and not watchdog_interval_s > 0:
            raise ValueError("watchdog_interval_s must be > 0 (or None: no watchdog)")
        if not min(watchdog_timeout_s, watchdog_generate_timeout_s, control_timeout_s) > 0 or watchdog_misses < 1:
            raise ValueError("watchdog and control timeouts must be > 0 and watchdog_misses >= 1")
        if max_reroutes < 0:
            raise ValueError("max_reroutes must be >= 0")
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.watchdog_interval_s = watchdog_interval_s
        self.watchdog_timeout_s = watchdog_timeout_s
        self.watchdog_misses = watchdog_misses
        self.watchdog_generate_timeout_s = watchdog_generate_timeout_s
        self.control_timeout_s = control_timeout_s
        self.max_reroutes = max_reroutes
        self.model_path = model_path
        self._tokenizer_path = tokenizer_path or model_path
        self._tokenizer: Any = None
        self._weight_sync = weight_sync
        self._weights_dir = Path(weights_dir) if weights_dir else None
        self.weight_version = 0
        self.last_push: dict[str, Any] = {}  # what the weight sync reported of the last push (timings)
        self.stats = RouterStats()
        self._replicas: dict[str, Replica] = {}
        self._request_replica: dict[str, str] = {}
        self._affinity: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._affinity_capacity = affinity_capacity
        self._rotation = itertools.count()
        self._gate: asyncio.Event | None = None
        self._held = False
        self._paused = False
        self._updating = False
        self._quiet_epoch = 0  # counts pauses and pushes: a probe that overlapped one proves nothing
        self._update_lock: asyncio.Lock | None = None
        self._retired: list[SGLangEngine] = []
        self._closing: set[asyncio.Task] = set()
        self._watchdog: asyncio.Task | None = None
        self._revived: set[asyncio.Task] = set()  # watch tasks of replaced replicas
        self._probe_session: Any = None
        self._closed = False
        if isinstance(urls, dict):
            self.set_engines(urls)
        else:
            self._add_replicas(list(urls))

    # --- membership ------------------------------------------------------------------

    @property
    def engine_ids(self) -> list[str]:
        return list(self._replicas)

    @property
    def live_engine_ids(self) -> list[str]:
        return [r.replica_id for r in self._replicas.values() if r.live]

    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def _new_client(self, url: str) -> SGLangEngine:
        client = SGLangEngine(url, timeout_s=self.timeout_s, api_key=self.api_key)
        client.weight_version = self.weight_version
        return client

    def _add_replicas(self, replicas: list[Replica]) -> None:
        for replica in replicas:
            if replica.replica_id in self._replicas:
                raise ValueError(f"replica id {replica.replica_id} given twice")
            replica.url = replica.url.rstrip("/")
            replica.client = replica.client or self._new_client(replica.url)
            self._replicas[replica.replica_id] = replica
        if not self._replicas:
            raise ValueError("EngineRouter needs at least one server URL")

    def set_engines(self, urls: dict[str, str]) -> None:
        """Replace the server table (after a dead server was replaced); keeps live clients."""
        if not urls and not self._replicas:
            raise ValueError("EngineRouter needs at least one server URL")
        for replica_id in list(self._replicas):
            replica = self._replicas[replica_id]
            if replica_id not in urls or replica.url != urls[replica_id].rstrip("/"):
                del self._replicas[replica_id]
                if replica.client is not None:
                    self._retired.append(replica.client)
                if replica.down is not None:
                    replica.down.set()  # its in-flight requests move on
        self._add_replicas([Replica(rid, url) for rid, url in urls.items() if rid not in self._replicas])
        for key in [k for k, r in self._affinity.items() if r not in self._replicas]:
            del self._affinity[key]

    def mark_down(self, replica_id: str, reason: str = "unreachable") -> None:
        """Stop routing to `replica_id`; its in-flight requests are re-sent elsewhere, a launched one is killed."""
        replica = self._replicas.get(replica_id)
        if replica is None or not replica.up:
            return
        replica.down_reason = reason
        self.stats.engines_marked_down += 1
        if replica.down is not None:
            replica.down.set()
        live = len(self.live_engine_ids)
        logger.warning("engine %s (%s) is down: %s; %d replica(s) left", replica_id, replica.url, reason, live)
        if replica.process is not None:
            replica.process.kill()
        if replica.client is not None:  # drop its connections: a hung server must not hold calls open
            old, replica.client = replica.client, self._new_client(replica.url)
            old._abort_quietly = _skip_abort  # its cancelled calls must not reopen a session to a hung server
            try:
                self._closing.add(asyncio.get_running_loop().create_task(old.close()))
            except RuntimeError:  # no running loop (a synchronous caller): closed with the router
                self._retired.append(old)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # a synchronous caller (tests, close): nothing is relaunched
        self._on_down(replica)

    def _on_down(self, replica: Replica) -> None:
        """A replica was marked down; the launcher relaunches its own (here: down stays down)."""

    def revive(self, replica: Replica, *, awaiting_push: bool = False) -> None:
        """`replica` (relaunched in its slot, new url and client) serves again, or, `awaiting_push`,
        once the next weight push has reached it; the watchdog watches it from now on."""
        replica.down_reason = None
        replica.down = None
        replica.missed = 0
        replica.outstanding_tokens = replica.in_flight = 0
        replica.last_finished = time.monotonic()
        replica.awaiting_push = awaiting_push
        if self._watchdog is not None and not self._watchdog.done():
            task = asyncio.ensure_future(self._watch_replica(replica))
            self._revived.add(task)
            task.add_done_callback(self._revived.discard)

    def in_flight(self) -> dict[str, int]:
        return {r.replica_id: r.in_flight for r in self._replicas.values()}

    def outstanding_tokens(self) -> dict[str, int]:
        return {r.replica_id: r.outstanding_tokens for r in self._replicas.values()}

    def _down_event(self, replica: Replica) -> asyncio.Event:
        if replica.down is None:
            replica.down = asyncio.Event()
            if not replica.up:
                replica.down.set()
        return replica.down

    def _choose(self, key: str, exclude: set[str]) -> Replica | None:
        pinned = self._replicas.get(self._affinity.get(key, ""))
        if pinned is not None and pinned.live and pinned.replica_id not in exclude:
            self._affinity.move_to_end(key)
            self.stats.affinity_hits += 1
            return pinned
        candidates = [r for r in self._replicas.values() if r.live and r.replica_id not in exclude]
        if not candidates:
            return None
        turn = next(self._rotation)
        order = {r.replica_id: (i - turn) % len(candidates) for i, r in enumerate(candidates)}
        chosen = min(candidates, key=lambda r: (r.outstanding_tokens, order[r.replica_id]))
        self._affinity[key] = chosen.replica_id
        self._affinity.move_to_end(key)
        while len(self._affinity) > self._affinity_capacity:
            self._affinity.popitem(last=False)
        return chosen

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start the watchdog (when configured). Subclasses launch their servers first."""
        if self._closed:
            raise RuntimeError("engine router is closed")
        if self.watchdog_interval_s is not None and self._watchdog is None:
            self._watchdog = asyncio.ensure_future(self._watch())

    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer, loaded from `model_path` on first use (callers that
        build prompts need it; the servers only ever see token ids)."""
        if self._tokenizer is None:
            if not self._tokenizer_path:
                raise AttributeError("this router has no model_path to load a tokenizer from")
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_path)
        return self._tokenizer

    # --- generation ------------------------------------------------------------------

    def _gate_event(self) -> asyncio.Event:
        if self._gate is None:
            self._gate = asyncio.Event()
            if not self._held:
                self._gate.set()
        return self._gate

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> Generation:
        if self._closed:
            raise RuntimeError("engine router is closed")
        if self.watchdog_interval_s is not None and self._watchdog is None:
            await self.start()
        key = group_key(request_id, input_ids)
        cost = len(input_ids) + sampling.max_new_tokens
        tried: set[str] = set()
        failures: list[str] = []
        while True:
            gate = self._gate_event()
            while not gate.is_set():
                await gate.wait()
            replica = self._choose(key, tried)
            if replica is None:
                self.stats.requests_failed += 1
                raise ReplicaError(self._no_replica_message(failures))
            tried.add(replica.replica_id)
            self.stats.requests += 1
            outcome, value = await self._attempt(replica, input_ids, sampling, request_id, cost)
            if outcome == "done":
                return value
            failures.append(f"{replica.replica_id}: {value}")
            if len(tried) > self.max_reroutes:
                self.stats.requests_failed += 1
                raise ReplicaError(f"request {request_id} failed on {'; '.join(failures)} (no re-send left)")
            self.stats.requests_rerouted += 1

    async def _attempt(
        self, replica: Replica, input_ids: list[int], sampling: SamplingParams, request_id: str | None, cost: int
    ) -> tuple[str, Any]:
        """("done", Generation), or ("failed", why) when the replica failed under the request."""
        client = replica.client
        assert client is not None
        down = self._down_event(replica)
        replica.in_flight += 1
        replica.outstanding_tokens += cost
        if request_id:
            self._request_replica[request_id] = replica.replica_id
        call = asyncio.ensure_future(client.generate(input_ids, sampling, request_id))
        watcher = asyncio.ensure_future(down.wait())
        try:
            await asyncio.wait({call, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            replica.in_flight -= 1
            replica.outstanding_tokens -= cost
            if request_id and self._request_replica.get(request_id) == replica.replica_id:
                del self._request_replica[request_id]
            if not call.done():
                call.cancel()  # the caller was cancelled, or the replica went down under the request
                call.add_done_callback(_consume)
        if not call.done() or call.cancelled():
            return "failed", replica.down_reason or "marked down"
        error = call.exception()
        if error is None:
            replica.last_finished = time.monotonic()
            return "done", call.result()
        if not _is_connection_failure(error):
            raise error
        self.mark_down(replica.replica_id, f"connection failed: {error!r}"[:300])
        return "failed", f"{error!r}"[:300]

    def _no_replica_message(self, failures: list[str]) -> str:
        down = "; ".join(f"{r.replica_id} ({r.down_reason})" for r in self._replicas.values() if not r.live)
        tried = f" (this request: {'; '.join(failures)})" if failures else ""
        return f"no live engine server left: {down or 'none'}{tried}"

    # --- control: client-side gate ---------------------------------------------------

    def hold(self) -> None:
        """New `generate` calls wait (in-flight ones continue until the servers abort them)."""
        self._held = True
        self._gate_event().clear()

    def release(self, version: int | None = None) -> None:
        """Set the version stamped on new requests, then let waiting requests go."""
        if version is not None:
            self.set_weight_version(version)
        self._held = False
        self._gate_event().set()

    def set_weight_version(self, version: int) -> None:
        self.weight_version = int(version)
        for replica in self._replicas.values():
            if replica.client is not None:
                replica.client.weight_version = self.weight_version

    # --- control: servers ------------------------------------------------------------

    async def _each(self, action: str, *args: Any, timeout_s: float | None = None) -> None:
        """Run `action` on every live replica; a gone or unresponsive one is marked down, other errors raise."""
        live = [r for r in self._replicas.values() if r.live]
        limit = timeout_s if timeout_s is not None else self.control_timeout_s

        async def one(replica: Replica) -> None:
            await asyncio.wait_for(getattr(replica.client, action)(*args), timeout=limit)

        results = await asyncio.gather(*(one(r) for r in live), return_exceptions=True)
        failures = []
        for replica, result in zip(live, results):
            if isinstance(result, TimeoutError):
                self.mark_down(replica.replica_id, f"no answer to {action} within {limit:.0f} s")
            elif isinstance(result, BaseException):
                if _is_connection_failure(result):
                    self.mark_down(replica.replica_id, f"{action}: {result!r}"[:300])
                elif replica.live:
                    failures.append(f"{replica.replica_id}: {result!r}")
        if failures:
            raise SGLangError(f"{action} failed on " + "; ".join(failures))

    async def pause(self) -> None:
        """Gate closed, then every server aborts its in-flight requests and blocks new ones."""
        self.hold()
        self._paused = True
        self._quiet_epoch += 1
        await self._each("pause")

    async def resume(self) -> None:
        self._paused = False
        self._quiet_epoch += 1
        await self._each("resume")
        self.release()

    def _sync(self) -> WeightSync:
        if self._weight_sync is None:
            self._weight_sync = DiskPush(self._weights_dir, self.model_path)
        return self._weight_sync

    async def update_weights(self, source: Any, version: int) -> None:
        """pause (unless already paused) -> the weight sync's push to every live replica -> resume.

        A replica that fails during the push is marked down and the push is repeated once
        over the replicas left (a push is idempotent: the same version again).
        """
        async with self._lock():
            paused_here = not self._paused
            if paused_here:
                await self.pause()
            self._updating = True
            self._quiet_epoch += 1
            try:
                for _ in range(2):
                    live = [r for r in self._replicas.values() if r.up]  # replacements awaiting it too
                    if not live:
                        raise ReplicaError(self._no_replica_message([]))
                    if await self._push(live, source, version):
                        break
                else:
                    raise ReplicaError(f"replicas kept failing during the weight push of version {version}")
                for replica in live:
                    replica.awaiting_push = False
                self.set_weight_version(version)
            finally:
                self._updating = False
                self._quiet_epoch += 1
                if paused_here:
                    await self.resume()

    def _lock(self) -> asyncio.Lock:
        """Held by a weight push, and by a replacement (which must start from the latest version)."""
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        return self._update_lock

    async def _push(self, live: list[Replica], source: Any, version: int) -> bool:
        """True when the push reached all of `live`; False when one of them went down during it."""
        downs = [asyncio.ensure_future(self._down_event(r).wait()) for r in live]
        push = asyncio.ensure_future(self._sync().push([r.client for r in live], source, version))
        try:
            done, _ = await asyncio.wait({push, *downs}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in downs:
                waiter.cancel()
            if not push.done():
                push.cancel()
                await asyncio.gather(push, return_exceptions=True)
        if push in done and push.exception() is None:
            self.last_push = push.result() if isinstance(push.result(), dict) else {}
            return True
        if push in done:  # failed: a replica that no longer answers is marked down and the push repeated
            error = push.exception()
            answers = await asyncio.gather(*(self._answers(r, LIVENESS_PATH) for r in live))
            for replica, answered in zip(live, answers):
                if not answered:
                    reason = f"weight push failed and {LIVENESS_PATH} unanswered: {error!r}"
                    self.mark_down(replica.replica_id, reason[:300])
            if all(r.live for r in live):
                raise error
        logger.warning("a replica went down during the weight push of version %d; pushing again", version)
        return False

    async def abort(self, request_id: str) -> None:
        replica = self._replicas.get(self._request_replica.get(request_id, ""))
        if replica is not None and replica.live and replica.client is not None:
            await replica.client.abort(request_id)

    async def abort_all(self) -> None:
        await self._each("abort_all")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in [*([self._watchdog] if self._watchdog is not None else []), *self._revived]:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for replica in self._replicas.values():
            if replica.down is not None:
                replica.down.set()
        clients = [r.client for r in self._replicas.values() if r.client is not None]
        for client in [*clients, *self._retired]:
            await client.close()
        self._retired.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)
        if self._probe_session is not None:
            await self._probe_session.close()

    # --- watchdog --------------------------------------------------------------------

    async def _answers(self, replica: Replica, path: str, timeout_s: float | None = None) -> bool:
        """Whether `path` answers within `timeout_s` (default: the watchdog timeout): 200 for a
        generation probe; for the liveness path any status below 500 (the HTTP loop answered)."""
        import aiohttp

        if self._probe_session is None or self._probe_session.closed:
            key = resolve_api_key(self.api_key)
            headers = {"Authorization": f"Bearer {key}"} if key else None
            self._probe_session = aiohttp.ClientSession(headers=headers)
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s or self.watchdog_timeout_s)
            async with self._probe_session.get(replica.url + path, timeout=timeout) as response:
                await response.read()
                if path == LIVENESS_PATH:
                    return response.status < 500
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    def _detected(self, replica: Replica, reason: str) -> None:
        if replica.up:
            self.stats.watchdog_detections += 1
            self.mark_down(replica.replica_id, reason)

    async def _probe_generation(self, replica: Replica) -> None:
        """The engine itself: `/health_generate` runs a real generation. Unanswered within
        `watchdog_generate_timeout_s` while no request on the replica finished meanwhile = wedged."""
        started = time.monotonic()
        epoch = self._quiet_epoch
        limit = self.watchdog_generate_timeout_s
        answered = await self._answers(replica, "/health_generate", limit)
        if answered or self._paused or self._updating or self._quiet_epoch != epoch:
            return  # a pause or push during the probe held the generation back: no verdict
        if replica.last_finished >= started:
            return  # slow to answer the probe, but finishing requests: busy, not wedged
        self._detected(replica, f"/health_generate (a one-token generation) unanswered within {limit:g} s")

    async def _watch_replica(self, replica: Replica) -> None:
        """Liveness every `watchdog_interval_s` (`/ping`, which needs only the server's HTTP loop:
        a stopped, dead or unreachable server misses it), the engine every few seconds; nothing
        is asked while paused or pushing (see the module docstring)."""
        assert self.watchdog_interval_s is not None
        generation: asyncio.Task | None = None
        next_generation = time.monotonic() + self.watchdog_generate_timeout_s
        try:
            while replica.up:
                await asyncio.sleep(self.watchdog_interval_s)
                if replica.process is not None and (reason := replica.process.exit_reason()) is not None:
                    self._detected(replica, reason)
                    return
                if self._paused or self._updating:
                    replica.missed = 0
                    next_generation = time.monotonic() + self.watchdog_generate_timeout_s
                    continue
                epoch = self._quiet_epoch
                if await self._answers(replica, LIVENESS_PATH):
                    replica.missed = 0
                elif self._paused or self._updating or self._quiet_epoch != epoch:
                    continue  # a pause began during the probe: no verdict
                else:
                    replica.missed += 1
                    if replica.missed >= self.watchdog_misses:
                        self._detected(
                            replica,
                            f"{LIVENESS_PATH} unanswered {replica.missed} times in a row within "
                            f"{self.watchdog_timeout_s:g} s each (hung or dead)",
                        )
                        return
                    continue
                now = time.monotonic()
                if now >= next_generation and (generation is None or generation.done()):
                    next_generation = now + self.watchdog_generate_timeout_s
                    if not (self._paused or self._updating):  # a push may hold the engine busy
                        generation = asyncio.ensure_future(self._probe_generation(replica))
        finally:
            if generation is not None:
                generation.cancel()
                await asyncio.gather(generation, return_exceptions=True)

    async def _watch(self) -> None:
        tasks = [asyncio.ensure_future(self._watch_replica(r)) for r in self._replicas.values() if r.live]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _skip_abort(request_id: str) -> None:
    """A down replica is not asked to abort: it is gone, stopped or about to be killed."""


def _consume(task: asyncio.Future) -> None:
    """Retrieve a cancelled call's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _is_connection_failure(exc: BaseException | None) -> bool:
    """The server is gone (refused, reset, disconnected) -- not an answer it gave."""
    if exc is None:
        return False
    import aiohttp

    return isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError))


def replicas_from_urls(urls: list[str], *, prefix: str = "server") -> list[Replica]:
    """Attached servers (`engine.urls`), named server-0, server-1, ..."""
    return [Replica(f"{prefix}-{index}", url) for index, url in enumerate(urls)]
