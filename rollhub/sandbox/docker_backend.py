"""Docker containers as sandboxes, through the `docker` SDK.

Each sandbox is one container idling on `sleep infinity` under `--init` (so signals reach
children and zombies are reaped), with the network off unless asked for, cpu / memory /
pids limits, and owner labels (run id, host, pid) so that `rollhub sandbox gc` can find
orphans. Commands run through `docker exec` wrapped in `timeout -s KILL`; a second,
outer deadline guards against a wedged engine. `close()` is `rm -f`, never a graceful stop.

The SDK is blocking, so every call runs on this backend's own thread pool: the default
executor of asyncio has only a handful of threads, which would serialise 64 concurrent
sandboxes. `DOCKER_HOST` (read by `docker.from_env`) selects a remote engine.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rollhub.sandbox import exit_cleanup, ownership, reaper
from rollhub.sandbox.base import ExecResult, Limits, Sandbox, SandboxBackend, SandboxError
from rollhub.sandbox.exec_stream import open_exec_stream
from rollhub.sandbox.output_buffer import HeadTailBuffer
from rollhub.sandbox.tar_archives import directory_tar, first_file_from_tar, require_absolute, single_file_tar

logger = logging.getLogger(__name__)

T = TypeVar("T")

IDLE_COMMAND = ["sleep", "infinity"]
# Exit statuses of `timeout -s KILL`: 124 when it reports the timeout, 137 (128 + SIGKILL)
# when the kill of the process group also took `timeout` itself.
_TIMEOUT_EXIT_CODES = (124, 137)
_SIGKILL_EXIT_CODE = 137
# The cgroup's OOM-kill counter, as seen from inside the container (cgroup v2, then v1).
_OOM_COUNTER_PROBE = (
    "cat /sys/fs/cgroup/memory.events 2>/dev/null || cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null"
)
_OOM_KILL_LINE = re.compile(rb"^oom_kill (\d+)$", re.MULTILINE)


class ImageMissingError(SandboxError):
    """The image is not on the engine. Not retryable: nothing is pulled during a run."""

    retryable = False


def connect(base_url: str | None = None, api_timeout_s: float = 120.0, max_connections: int = 256) -> Any:
    """A docker client that answered a ping, or SandboxError saying how to get one."""
    import docker

    where = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        if base_url:
            client = docker.DockerClient(base_url=base_url, timeout=int(api_timeout_s), max_pool_size=max_connections)
        else:
            client = docker.from_env(timeout=int(api_timeout_s), max_pool_size=max_connections)
        client.ping()
    except Exception as exc:
        raise SandboxError(
            f"no Docker engine answers at {where} ({exc.__class__.__name__}: {exc}); start one with "
            "`bash .ci/setup_docker.sh`, or point DOCKER_HOST at a remote engine"
        ) from exc
    return client


def _docker_errors() -> Any:
    import docker.errors

    return docker.errors


def _container_gone(exc: Exception) -> bool:
    return "No such container" in str(exc) or "is not running" in str(exc)


class DockerSandbox(Sandbox):
    def __init__(self, backend: DockerBackend, container_id: str, image: str, limits: Limits):
        self.backend = backend
        self.id = container_id
        self.image = image
        self.limits = limits
        self._closed = False
        self._oom_kills_seen = 0

    def __repr__(self) -> str:
        return f"DockerSandbox({self.id[:12]}, image={self.image!r})"

    # ----------------------------------------------------------------- async interface
    async def exec(
        self, cmd: str, timeout_s: float, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._check_open()
        return await self.backend._run_blocking(self._exec_blocking, cmd, timeout_s, workdir, env)

    async def write_file(self, path: str, content: str | bytes) -> None:
        self._check_open()
        data = content.encode() if isinstance(content, str) else content
        archive = single_file_tar(path, data)
        await self.backend._run_blocking(self._put_archive, archive)

    async def read_file(self, path: str) -> bytes:
        self._check_open()
        return await self.backend._run_blocking(self._read_file_blocking, require_absolute(path))

    async def copy_in(self, local_dir: str, dest: str) -> None:
        self._check_open()
        archive = directory_tar(local_dir, dest)
        try:
            await self.backend._run_blocking(self._put_archive, archive)
        finally:
            archive.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.backend._run_blocking(self.backend._remove, self.id)
        except SandboxError:
            pass  # the backend is closed, and closing it removed every container it had

    # ----------------------------------------------------------------- blocking parts
    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{self!r} is closed")

    def _put_archive(self, archive: Any) -> None:
        errors = _docker_errors()
        try:
            self.backend.api.put_archive(self.id, "/", archive)
        except errors.NotFound as exc:
            raise SandboxError(f"{self!r} is gone: {exc}") from exc
        except errors.APIError as exc:
            if _container_gone(exc):
                raise SandboxError(f"{self!r} is gone: {exc}") from exc
            raise OSError(f"writing into {self!r} failed: {exc.explanation or exc}") from exc
        except Exception as exc:
            raise SandboxError(f"docker engine error writing into {self!r}: {exc}") from exc

    def _read_file_blocking(self, path: str) -> bytes:
        errors = _docker_errors()
        try:
            stream, _stat = self.backend.api.get_archive(self.id, path)
            return first_file_from_tar(stream)
        except errors.NotFound as exc:
            if "No such container" in str(exc):
                raise SandboxError(f"{self!r} is gone: {exc}") from exc
            raise FileNotFoundError(f"{path} does not exist in {self!r}") from exc
        except (FileNotFoundError, IsADirectoryError):
            raise
        except Exception as exc:
            raise SandboxError(f"docker engine error reading {path} from {self!r}: {exc}") from exc

    def _exec_blocking(self, cmd: str, timeout_s: float, workdir: str | None, env: dict[str, str] | None) -> ExecResult:
        errors = _docker_errors()
        api = self.backend.api
        # `exec 2>&1` merges stderr into stdout inside the shell: Docker carries the two as
        # separate streams and does not keep their relative order.
        argv = ["timeout", "-s", "KILL", f"{timeout_s:g}", *self.backend.shell, f"exec 2>&1; {cmd}"]
        started = time.monotonic()
        try:
            exec_id = api.exec_create(self.id, argv, stdout=True, stderr=True, workdir=workdir, environment=env)["Id"]
            stream = open_exec_stream(api, exec_id)
        except errors.APIError as exc:
            raise SandboxError(f"exec in {self!r} failed to start: {exc}") from exc
        except Exception as exc:
            raise SandboxError(f"docker engine error starting exec in {self!r}: {exc}") from exc
        buffer = HeadTailBuffer(self.backend.output_limit_chars)
        try:
            stream.read_until_eof(buffer, deadline=started + timeout_s + self.backend.exec_grace_s)
        except TimeoutError:
            # The in-container `timeout` should have ended it long ago: the container or the
            # engine is wedged. Remove it so the blocked read (and the thread) is released.
            self.backend._remove(self.id)
            self._closed = True
            raise SandboxError(
                f"exec in {self!r} outlived its {timeout_s:g}s timeout by {self.backend.exec_grace_s:g}s; "
                "sandbox removed"
            ) from None
        except OSError as exc:
            raise SandboxError(f"lost the exec stream of {self!r}: {exc}") from exc
        finally:
            stream.close()
        duration_s = time.monotonic() - started
        if self._closed:
            raise SandboxError(f"{self!r} was closed while a command ran in it")
        try:
            exit_code = self._exit_code(exec_id)
            timed_out = exit_code in _TIMEOUT_EXIT_CODES and duration_s >= timeout_s
            oom_killed = exit_code == _SIGKILL_EXIT_CODE and not timed_out and self._saw_new_oom_kill()
        except SandboxError:
            raise
        except Exception as exc:  # the engine lost the exec or the container under us
            raise SandboxError(
                f"{self!r}: could not read the exec's outcome ({exc.__class__.__name__}: {exc})"
            ) from exc
        output, truncated = buffer.text()
        return ExecResult(
            exit_code, output, timed_out=timed_out, duration_s=duration_s, truncated=truncated, oom_killed=oom_killed
        )

    def _exit_code(self, exec_id: str) -> int:
        """The exec's exit status; SandboxError when the container died under it."""
        api = self.backend.api
        for _ in range(200):  # the stream can close a moment before the exit is recorded
            info = api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                break
            time.sleep(0.005)
        code = info.get("ExitCode")
        if code is None or code == _SIGKILL_EXIT_CODE or code < 0:
            self._raise_if_container_dead()
        if code is None:
            raise SandboxError(f"exec in {self!r} ended without an exit status")
        return int(code)

    def _raise_if_container_dead(self) -> None:
        errors = _docker_errors()
        try:
            state = self.backend.api.inspect_container(self.id)["State"]
        except errors.NotFound as exc:
            raise SandboxError(f"{self!r} disappeared during exec") from exc
        if not state.get("Running") or state.get("Status") in ("removing", "dead", "exited"):
            reason = " (OOM-killed)" if state.get("OOMKilled") else ""
            raise SandboxError(f"{self!r} died during exec{reason}: exit {state.get('ExitCode')}")

    def _saw_new_oom_kill(self) -> bool:
        """Whether the container's cgroup counted an OOM kill since we last looked: that is
        what tells a memory-limit kill apart from any other SIGKILL."""
        api = self.backend.api
        try:
            exec_id = api.exec_create(self.id, ["sh", "-c", _OOM_COUNTER_PROBE], stdout=True, stderr=False)["Id"]
            raw = api.exec_start(exec_id)
        except Exception as exc:
            logger.debug("OOM probe failed in %r: %s", self, exc)
            return bool(api.inspect_container(self.id)["State"].get("OOMKilled"))
        match = _OOM_KILL_LINE.search(raw or b"")
        if not match:  # kernel without the counter: fall back to the engine's flag
            return bool(api.inspect_container(self.id)["State"].get("OOMKilled"))
        count = int(match.group(1))
        new_kill = count > self._oom_kills_seen
        self._oom_kills_seen = count
        return new_kill


class DockerBackend(SandboxBackend):
    """Starts containers for one run; removes all of them on `close()` and at process exit."""

    def __init__(
        self,
        *,
        run_id: str | None = None,
        output_limit_chars: int = 10_000,
        shell: tuple[str, ...] = ("bash", "-c"),
        exec_grace_s: float = 10.0,
        api_timeout_s: float = 120.0,
        max_threads: int = 256,
        base_url: str | None = None,
        labels: dict[str, str] | None = None,
        collect_orphans: bool = False,
        max_concurrent_starts: int = 16,
    ):
        """`collect_orphans=True` first removes containers left by dead runs on this host
        (the start-up sweep; the same as `rollhub sandbox gc`). `max_concurrent_starts`
        caps creates in flight on this backend, whoever calls it: dockerd gets slower, not
        faster, when flooded with starts (a `SandboxPool` can throttle further)."""
        if max_concurrent_starts < 1:
            raise ValueError(f"max_concurrent_starts must be at least 1, got {max_concurrent_starts}")
        self.client = connect(base_url, api_timeout_s, max_connections=max_threads)
        self.api = self.client.api
        self.base_url = base_url
        self.run_id = run_id or ownership.new_run_id()
        self.output_limit_chars = output_limit_chars
        self.shell = tuple(shell)
        self.exec_grace_s = exec_grace_s
        self.extra_labels = dict(labels or {})
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="rollhub-docker")
        self._live: dict[str, DockerSandbox] = {}
        self._lock = threading.Lock()
        self._starts_in_flight = 0
        self._start_slots = threading.BoundedSemaphore(max_concurrent_starts)  # works across event loops
        self._closed = False
        exit_cleanup.register(self)
        if collect_orphans:
            removed = reaper.collect_garbage(self.api)
            if removed:
                logger.warning("removed %d orphaned rollhub containers left by dead runs", len(removed))

    def __repr__(self) -> str:
        return f"DockerBackend(run_id={self.run_id!r}, live={len(self._live)})"

    @property
    def live_count(self) -> int:
        return len(self._live)

    async def _run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise SandboxError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def start(
        self, image: str, limits: Limits = Limits(), *, labels: dict[str, str] | None = None
    ) -> DockerSandbox:
        if self._closed or self._executor is None:
            raise SandboxError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        starting = loop.run_in_executor(
            self._executor, functools.partial(self._start_blocking, image, limits, labels or {})
        )
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The caller gave up (e.g. a straggler cancelled), but the worker thread keeps
            # starting the container: remove it as soon as it exists, not at the end of the run.
            starting.add_done_callback(self._remove_abandoned)
            raise

    def _remove_abandoned(self, starting: asyncio.Future[DockerSandbox]) -> None:
        if starting.cancelled() or starting.exception() is not None:
            return
        box = starting.result()
        box._closed = True
        executor = self._executor
        if executor is not None:  # else close() has removed it with everything else
            executor.submit(self._remove, box.id)

    def _start_blocking(self, image: str, limits: Limits, labels: dict[str, str]) -> DockerSandbox:
        with self._lock:
            self._starts_in_flight += 1
        try:
            with self._start_slots:
                return self._create_and_start(image, limits, labels)
        finally:
            with self._lock:
                self._starts_in_flight -= 1

    def _create_and_start(self, image: str, limits: Limits, labels: dict[str, str]) -> DockerSandbox:
        errors = _docker_errors()
        host_config = self.api.create_host_config(
            init=True,
            network_mode="bridge" if limits.network else "none",
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",  # no swap: the limit is the limit
            nano_cpus=int(limits.cpus * 1e9),
            pids_limit=limits.pids,
            storage_opt={"size": f"{limits.disk_mb}M"} if limits.disk_mb else None,
        )
        all_labels = {**self.extra_labels, **labels, **ownership.owner_labels(self.run_id)}
        try:
            created = self.api.create_container(
                image, command=IDLE_COMMAND, labels=all_labels, host_config=host_config, detach=True
            )
        except errors.ImageNotFound as exc:
            raise ImageMissingError(
                f"image {image!r} is not on the engine and nothing is pulled during a run; build it first "
                "(`rollhub sandbox build-base` for rollhub/base:bookworm)"
            ) from exc
        except Exception as exc:
            hint = (
                " (disk_mb needs overlay2 on xfs with pquota, or devicemapper)"
                if limits.disk_mb and "storage" in str(exc).lower()
                else ""
            )
            raise SandboxError(f"could not create a container from {image!r}: {exc}{hint}") from exc
        container_id = created["Id"]
        try:
            self.api.start(container_id)
        except Exception as exc:
            self._remove(container_id)
            raise SandboxError(f"could not start a container from {image!r}: {exc}") from exc
        box = DockerSandbox(self, container_id, image, limits)
        with self._lock:
            closed = self._closed
            if not closed:
                self._live[container_id] = box
        if closed:  # the run ended while we were starting: do not leak this one
            self._remove(container_id)
            raise SandboxError(f"{self!r} closed while a sandbox was starting")
        return box

    def _remove(self, container_id: str) -> None:
        reaper.remove_containers(self.api, [container_id])
        with self._lock:
            self._live.pop(container_id, None)

    async def close(self) -> None:
        """Remove every container of this run (also ones whose start raced with close)."""
        if self._executor is None:
            return
        self._closed = True
        await self._run_blocking(self._remove_everything, self.api)
        exit_cleanup.unregister(self)
        executor, self._executor = self._executor, None
        executor.shutdown(wait=False)
        self.client.close()

    def _remove_everything(self, api: Any) -> None:
        with self._lock:
            known = list(self._live)
            self._live.clear()
        reaper.remove_containers(api, known, parallelism=16)
        reaper.remove_run(api, self.run_id)

    def cleanup_now(self) -> None:
        """Synchronous removal for atexit and signal handlers: a fresh client, so a request
        in flight on another thread cannot block it."""
        self._closed = True
        if not self._live and not self._starts_in_flight:
            return  # nothing of ours can exist: do not even touch the engine
        try:
            client = connect(self.base_url, api_timeout_s=30.0, max_connections=16)
        except SandboxError as exc:
            logger.warning(
                "%r: cannot reach the engine to remove %d sandbox(es): %s; run `rollhub sandbox gc` later",
                self,
                len(self._live),
                exc,
            )
            return
        try:
            self._remove_everything(client.api)
        finally:
            client.close()
