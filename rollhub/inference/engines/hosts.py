"""Where a launched engine server runs: this machine, or a node that Ray picks (`engine.placement`).

The launcher (rollhub.inference.engines.launcher) builds every server's command line the same
way whatever the placement, so `--dtype`, `server_python`, the API key and the seed reach a
server on a Ray node exactly as they reach one on this machine. A placement only answers two
questions: at which address will replica i listen, and how is its process started there.

* `LocalHost`: a child process of this one (`LaunchedServer`: own process group,
  parent-death signal, log file).
* `RayHost`: a small Ray actor (`ServerHostActor`) is placed with the replica's Ray
  resources (`engine.ray_num_cpus`, `engine.ray_num_gpus`; Ray then sets its
  CUDA_VISIBLE_DEVICES) and starts the same `LaunchedServer` on its node, listening on the
  node's IP. The server dies with the actor (parent-death signal), so `ray.kill` of the actor,
  a dead node or a closed run all take the server along.

`LaunchedServer` (here, used by both) is one server process: its own process group, the
parent-death signal, a log file instead of a pipe, and an atexit hook for runs that end early.
Both placements hand back a `ServerProcess` (exit_reason, kill, stop, log_tail, pid, log_path), which is
all the router's watchdog and the launcher's replacement need of a server.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import logging
import os
import shlex
import signal
import socket
import subprocess
import weakref
from pathlib import Path
from typing import Any, Protocol

from rollhub.core.errors import MissingExtraError, UserError

logger = logging.getLogger(__name__)

_LIBC: Any = None
try:  # resolved here, not in the child: the child of a threaded parent must not load libraries
    _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # not Linux: no parent-death signal, close() and atexit still stop servers
    pass
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LaunchedServer:
    """One server process: its command, log file and process group."""

    def __init__(self, replica_id: str, command: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.replica_id = replica_id
        self.command = command
        self.log_path = log_path
        self.env = env
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        """Spawn it. Call from a thread that lives as long as the run: the parent-death signal
        fires when the *thread* that forked the child exits."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"# rollhub: {shlex.join(self.command)}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,  # its own process group: close() stops wrapper and children alike
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise UserError(f"cannot start engine server {self.replica_id} ({self.command[0]}): {exc}") from None
        _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def exit_reason(self) -> str | None:
        if self.process is None or self.process.poll() is None:
            return None
        return f"server process exited with code {self.process.returncode} (log: {self.log_path})"

    def log_tail(self, limit: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - limit))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _signal_group(self, signum: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL the whole group now (a wedged or stopped server gets no say)."""
        if self.process is not None:
            self._signal_group(signal.SIGKILL)
            if self.process.poll() is None:
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    logger.warning("engine server %s (pid %d) survived SIGKILL", self.replica_id, self.process.pid)
        _LIVE.discard(self)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM (with SIGCONT, so a stopped server can act on it), then SIGKILL after `grace_s`."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            self._signal_group(signal.SIGCONT)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # the group too: children of a wrapper that exited first


_LIVE: weakref.WeakSet[LaunchedServer] = weakref.WeakSet()


@atexit.register
def _stop_leftover_servers() -> None:
    """A run that ends without close() (an exception before it) still takes its servers along."""
    for server in list(_LIVE):
        server.kill()


class ServerHost(Protocol):
    """A placement of launched servers (see the module docstring)."""

    name: str

    async def address(self, replica_id: str, index: int) -> tuple[str, int]:
        """Host and port replica `index` will listen on (reserves where the server runs)."""
        ...

    async def launch(self, replica_id: str, command: list[str], env: dict[str, str], log_path: Path) -> Any:
        """Start the server's process; returns its ServerProcess."""
        ...

    def gpu_count(self) -> int | None:
        """GPUs each server gets from the placement itself (Ray), None when the launcher plans them."""
        ...

    def close(self) -> None:
        """After every server stopped: release what the placement itself holds."""
        ...


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalHost:
    """Servers as child processes of this one, on `host`, ports `base_port + i` or free ones."""

    name = "local"

    def __init__(self, host: str = "127.0.0.1", base_port: int = 0) -> None:
        self.host = host
        self.base_port = base_port

    async def address(self, replica_id: str, index: int) -> tuple[str, int]:
        return self.host, self.base_port + index if self.base_port else free_port(self.host)

    async def launch(self, replica_id: str, command: list[str], env: dict[str, str], log_path: Path) -> Any:
        server = LaunchedServer(replica_id, command, log_path, {**os.environ, **env})
        server.start()
        return server

    def gpu_count(self) -> int | None:
        return None

    def close(self) -> None:
        """Nothing held beyond the servers."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingExtraError("ray", "cluster.backend=ray or engine.placement=ray") from exc
    return ray


class ServerHostActor:
    """Ray actor (async: every method runs on its event-loop thread, which lives as long as the
    actor, so the parent-death signal of the server it forks fires only when the actor dies)."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.server: Any = None

    async def address(self) -> tuple[str, int, str]:
        """(node IP, a free port on it, node id)."""
        import ray

        host = ray.util.get_node_ip_address()
        try:
            port = free_port(host)
        except OSError:  # the node IP is not on a local interface (NAT, some containers)
            port = free_port("")
        return host, port, ray.get_runtime_context().get_node_id()

    async def launch(self, command: list[str], env: dict[str, str], log_path: str) -> int:
        # the node's own environment (its CUDA_VISIBLE_DEVICES from Ray), plus the run's overrides
        self.server = LaunchedServer(self.replica_id, command, Path(log_path), {**os.environ, **env})
        self.server.start()
        return self.server.pid

    async def wait_exit(self) -> str:
        """Returns (the exit reason) once the server process has exited."""
        while self.server is not None and self.server.exit_reason() is None:
            await asyncio.sleep(0.25)
        return self.server.exit_reason() if self.server is not None else "server never started"

    async def log_tail(self) -> str:
        return self.server.log_tail() if self.server is not None else ""

    async def stop(self, grace_s: float) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop, grace_s)


class RayServerProcess:
    """The driver's view of a server a `ServerHostActor` runs: what the router's watchdog asks."""

    def __init__(self, ray: Any, actor: Any, replica_id: str, pid: int, log_path: Path, node_ip: str) -> None:
        self._ray = ray
        self.actor = actor
        self.replica_id = replica_id
        self.pid = pid
        self.log_path = log_path
        self.node_ip = node_ip
        self._exited = actor.wait_exit.remote()
        self._reason: str | None = None

    def exit_reason(self) -> str | None:
        """Non-blocking: the server's exit, or its actor's death (node lost, `ray.kill`)."""
        if self._reason is None:
            ready, _ = self._ray.wait([self._exited], timeout=0)
            if ready:
                try:
                    self._reason = f"{self._ray.get(self._exited)} on node {self.node_ip}"
                except Exception as exc:  # the actor (and with it the server) is gone
                    self._reason = f"its Ray actor died on node {self.node_ip} ({type(exc).__name__})"
        return self._reason

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return str(self._ray.get(self.actor.log_tail.remote(), timeout=10))[-limit:]
        except Exception:
            return f"(log on node {self.node_ip}: {self.log_path})"

    def kill(self) -> None:
        """The actor goes, and the server with it (parent-death signal)."""
        try:
            self._ray.kill(self.actor)
        except Exception:  # already gone
            pass

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM then SIGKILL through the actor (a server gets to close cleanly), then the actor."""
        try:
            self._ray.get(self.actor.stop.remote(grace_s), timeout=grace_s + 10)
        except Exception as exc:
            logger.debug("stopping %s through its actor failed: %r", self.replica_id, exc)
        self.kill()


class RayHost:
    """Servers placed by Ray: one `ServerHostActor` per replica with the given resources."""

    name = "ray"

    def __init__(
        self,
        *,
        num_cpus: float = 0.5,
        num_gpus: float = 0.0,
        name_prefix: str = "rollhub-engine",
        timeout_s: float = 600.0,
    ) -> None:
        if not num_cpus >= 0 or not num_gpus >= 0:
            raise UserError(f"engine.ray_num_cpus and engine.ray_num_gpus must be >= 0, got {num_cpus}, {num_gpus}")
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.name_prefix = name_prefix
        self.timeout_s = timeout_s  # until Ray has placed a server's actor (engine.startup_timeout_s)
        self._actors: dict[str, tuple[Any, str]] = {}  # replica id -> (actor reserved, node ip)
        self._incarnation = 0
        self.owns_ray = False  # set by whoever started Ray for this fleet: close() shuts it down

    def close(self) -> None:
        ray = import_ray()
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()

    def gpu_count(self) -> int | None:
        return int(self.num_gpus) if self.num_gpus >= 1 else 0

    async def address(self, replica_id: str, index: int) -> tuple[str, int]:
        ray = import_ray()
        if not ray.is_initialized():  # a caller that did not connect first: a local Ray of this fleet's own
            self.owns_ray = ensure_ray(None, None)
        self._incarnation += 1
        actor = (
            ray.remote(ServerHostActor)
            .options(
                name=f"{self.name_prefix}.{replica_id}.{self._incarnation}",
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                scheduling_strategy="SPREAD",
                max_concurrency=100,
            )
            .remote(replica_id)
        )
        try:
            host, port, _ = await asyncio.wait_for(actor.address.remote(), timeout=self.timeout_s)
        except TimeoutError:
            ray.kill(actor)
            raise UserError(
                f"Ray placed no engine server {replica_id} within {self.timeout_s:.0f} s: no node has "
                f"{self.num_cpus:g} CPU(s) and {self.num_gpus:g} GPU(s) free (engine.ray_num_cpus, "
                "engine.ray_num_gpus); check 'ray status'"
            ) from None
        self._actors[replica_id] = (actor, host)
        return host, port

    async def launch(self, replica_id: str, command: list[str], env: dict[str, str], log_path: Path) -> Any:
        ray = import_ray()
        actor, host = self._actors.pop(replica_id)
        try:
            pid = await actor.launch.remote(command, env, str(log_path))
        except Exception as exc:
            ray.kill(actor)
            message = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            raise UserError(f"cannot start engine server {replica_id} on Ray node {host}: {message}") from None
        return RayServerProcess(ray, actor, replica_id, pid, log_path, host)


def ensure_ray(address: str | None, local_num_cpus: int | None) -> bool:
    """Connect to (or start) Ray; True when this call started it (and should shut it down)."""
    from pathlib import Path as _Path

    ray = import_ray()
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if address:
        kwargs["address"] = address
        kwargs.pop("include_dashboard")
        token = _Path.home() / ".ray" / "auth_token"
        if "RAY_AUTH_MODE" not in os.environ and token.exists():
            # `ray start --head` (Ray >= 2.5x) enables token auth when this file exists; a
            # connecting driver must opt in explicitly or it retries until it times out
            os.environ["RAY_AUTH_MODE"] = "token"
            try:  # Ray caches its config at import; refresh it so this process sees token mode
                from ray._raylet import Config

                Config.initialize("")
            except (ImportError, AttributeError):
                pass
            logger.info("joining %s with token auth (%s); set RAY_AUTH_MODE=disabled to opt out", address, token)
    elif local_num_cpus is not None:
        kwargs["num_cpus"] = local_num_cpus
    try:
        ray.init(**kwargs)
    except ConnectionError as exc:
        raise UserError(
            f"cannot reach the Ray cluster at {address!r}: {exc}; "
            "start one with 'ray start --head', check cluster.address, "
            "and with token auth copy the head's ~/.ray/auth_token to this machine"
        ) from exc
    return True
