"""EngineRouter: one InferenceEngine over M SGLang-speaking servers.

Routing rule: all turns of one trajectory go to the same server while it is up, so the
server's prefix cache holds the trajectory's history (turn k+1's prompt extends turn k's
prompt + response). A trajectory seen for the first time goes to the server with the
fewest requests in flight from this router (ties: round-robin). The affinity key is the
trajectory id the agent puts in front of every request id (`<trajectory_id>-<n>`).

A server that drops the connection (dead process or node) is marked down and the request
is sent again, whole, to another server: its prompt ids already hold the full history, so
only the KV cache is lost, never tokens. Such re-sends are counted (`requests_rerouted`).

Weight versions are stamped by the clients at submit (see rollhub.rollout.engines.sglang). `hold()`
closes a client-side gate so that no request is submitted between "servers paused" and
"new version set"; with it every token's version is exact across a weight push.

Every client sends the run's API key (`api_key`, default ROLLHUB_API_KEY): under Ray the
driver generates one per run and the engine servers refuse requests without it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollhub.rollout.engines.base import Generation, InferenceEngine, SamplingParams
from rollhub.rollout.engines.sglang import SGLangEngine, SGLangError, _write_state_dict

logger = logging.getLogger(__name__)


def affinity_key(request_id: str | None, input_ids: list[int]) -> str:
    """Trajectory id from `<trajectory_id>-<n>`; else a hash of the first prompt tokens."""
    if request_id and "-" in request_id:
        return request_id.rsplit("-", 1)[0]
    return "prompt:" + str(hash(tuple(input_ids[:64])))


@dataclass
class RouterStats:
    requests: int = 0
    affinity_hits: int = 0  # requests sent to the server that served the trajectory's earlier turns
    requests_rerouted: int = 0  # re-sent to another server after a connection failure
    engines_marked_down: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class EngineRouter(InferenceEngine):
    def __init__(
        self,
        urls: dict[str, str],
        *,
        timeout_s: float = 3600.0,
        affinity_capacity: int = 100_000,
        api_key: str | None = None,
    ) -> None:
        if not urls:
            raise ValueError("EngineRouter needs at least one server URL")
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.weight_version = 0
        self.stats = RouterStats()
        self._clients: dict[str, SGLangEngine] = {}
        self._down: set[str] = set()
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._request_engine: dict[str, str] = {}
        self._affinity: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._affinity_capacity = affinity_capacity
        self._tie_break = itertools.count()
        self._gate: asyncio.Event | None = None
        self._held = False
        self._retired: list[SGLangEngine] = []
        self.set_engines(urls)

    # --- membership ------------------------------------------------------------------

    @property
    def engine_ids(self) -> list[str]:
        return list(self._clients)

    @property
    def live_engine_ids(self) -> list[str]:
        return [e for e in self._clients if e not in self._down]

    def set_engines(self, urls: dict[str, str]) -> None:
        """Replace the server table (after a dead server was replaced); keeps live clients."""
        for engine_id in list(self._clients):
            if engine_id not in urls or self._clients[engine_id].url != urls[engine_id].rstrip("/"):
                self._retired.append(self._clients.pop(engine_id))
                self._down.discard(engine_id)
        for engine_id, url in urls.items():
            if engine_id not in self._clients:
                client = SGLangEngine(url, timeout_s=self.timeout_s, api_key=self.api_key)
                client.weight_version = self.weight_version
                self._clients[engine_id] = client
        for key in [k for k, e in self._affinity.items() if e not in self._clients]:
            del self._affinity[key]

    def mark_down(self, engine_id: str) -> None:
        if engine_id in self._clients and engine_id not in self._down:
            self._down.add(engine_id)
            self.stats.engines_marked_down += 1
            logger.warning("engine %s (%s) unreachable; routing around it", engine_id, self._clients[engine_id].url)

    def in_flight(self) -> dict[str, int]:
        return {e: self._in_flight[e] for e in self._clients}

    def _choose(self, key: str, exclude: set[str]) -> str | None:
        pinned = self._affinity.get(key)
        if pinned is not None and pinned in self._clients and pinned not in self._down and pinned not in exclude:
            self._affinity.move_to_end(key)
            self.stats.affinity_hits += 1
            return pinned
        candidates = [e for e in self._clients if e not in self._down and e not in exclude]
        if not candidates:
            return None
        turn = next(self._tie_break)
        chosen = min(candidates, key=lambda e: (self._in_flight[e], (candidates.index(e) - turn) % len(candidates)))
        self._affinity[key] = chosen
        self._affinity.move_to_end(key)
        while len(self._affinity) > self._affinity_capacity:
            self._affinity.popitem(last=False)
        return chosen

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
        gate = self._gate_event()
        while not gate.is_set():
            await gate.wait()
        key = affinity_key(request_id, input_ids)
        tried: set[str] = set()
        while True:
            engine_id = self._choose(key, tried)
            if engine_id is None:
                raise SGLangError(
                    f"no reachable engine server (tried {sorted(tried) or 'none'}; all down: {sorted(self._down)})"
                )
            client = self._clients[engine_id]
            self.stats.requests += 1
            self._in_flight[engine_id] += 1
            if request_id:
                self._request_engine[request_id] = engine_id
            try:
                return await client.generate(input_ids, sampling, request_id)
            except Exception as exc:
                if not _is_connection_failure(exc):
                    raise
                self.mark_down(engine_id)
                tried.add(engine_id)
                self.stats.requests_rerouted += 1
            finally:
                self._in_flight[engine_id] -= 1
                if request_id:
                    self._request_engine.pop(request_id, None)

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
        for client in self._clients.values():
            client.weight_version = self.weight_version

    # --- control: servers ------------------------------------------------------------

    async def _each(self, action: str, *args: Any) -> None:
        """Run `action` on every live server; a dropped connection marks it down, other errors raise."""
        live = self.live_engine_ids
        results = await asyncio.gather(
            *(getattr(self._clients[e], action)(*args) for e in live), return_exceptions=True
        )
        failures = []
        for engine_id, result in zip(live, results):
            if isinstance(result, BaseException):
                if _is_connection_failure(result):
                    self.mark_down(engine_id)
                else:
                    failures.append(f"{engine_id}: {result!r}")
        if failures:
            raise SGLangError(f"{action} failed on " + "; ".join(failures))

    async def pause(self) -> None:
        """Gate closed, then every server aborts its in-flight requests and blocks new ones."""
        self.hold()
        await self._each("pause")

    async def resume(self) -> None:
        await self._each("resume")
        self.release()

    async def update_weights(self, source: Any, version: int) -> None:
        """All servers load `source` (HF dir on a path they can read; a state dict is written once)."""
        if isinstance(source, dict):
            with tempfile.TemporaryDirectory(prefix="rollhub-weights-") as folder:
                model_path = await next(iter(self._clients.values()))._model_path()
                await asyncio.to_thread(_write_state_dict, source, Path(folder), model_path)
                await self._each("update_weights", folder, version)
        else:
            await self._each("update_weights", str(source), version)
        self.set_weight_version(version)

    async def abort(self, request_id: str) -> None:
        engine_id = self._request_engine.get(request_id)
        if engine_id is not None and engine_id in self._clients:
            await self._clients[engine_id].abort(request_id)

    async def abort_all(self) -> None:
        await self._each("abort_all")

    async def close(self) -> None:
        for client in [*self._clients.values(), *self._retired]:
            await client.close()
        self._retired.clear()


def _is_connection_failure(exc: BaseException) -> bool:
    """The server is gone (refused, reset, disconnected) -- not an answer it gave."""
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp is a core dependency
        return isinstance(exc, ConnectionError)
    return isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError))
