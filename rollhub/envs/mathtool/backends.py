"""Where the `python` tool runs: an embedded interpreter, or a container of the sandbox pool.

Both backends answer the same call with the same kind of text (what the program printed, then
the error line if one stopped it), so a policy trained on one reads the other alike:

* `EmbeddedBackend`: `interpreter.run_code`, a bounded arithmetic interpreter over `ast` (no
  `eval`, no Docker), run in a limited worker process off the event loop (`tool_worker.py`; a
  fraction of a millisecond a call). Programs beyond arithmetic (loops, other modules) get a
  one-line `NotImplementedError`.
* `SandboxBackend`: real `python3` in a container of a `SandboxPool` over the Docker backend
  (network off, cpu/memory/pids/disk limits, persistent shell: a command costs a spawn, not a
  `docker exec`). One container per episode, started at the first call and removed when the
  episode ends; the program is passed base64-encoded in the command line (no file transfer) and
  run by a small wrapper that prints the value of a bare last expression, as the embedded
  interpreter does. A program that runs over `timeout_s` is killed with its process group;
  whatever it left running is swept by the sandbox after each command.

The calculator is an expression evaluator, so it always runs embedded (in the same workers).

A failure of the machinery (Docker gone, a container that died) raises `SandboxError`: the env
reports it as `info["infra_failure"]`, never as the model's failure.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
import time
import weakref
from dataclasses import dataclass
from typing import Any

from rollhub.envs.mathtool.tool_worker import ToolWorkerPool, shared_tool_pool
from rollhub.sandbox.base import Limits, SandboxError, truncate_middle

DEFAULT_IMAGE = "rollhub/base:bookworm"
#: what one tool container may use: small, no network, few processes, a small disk budget
DEFAULT_LIMITS = Limits(cpus=0.5, memory_mb=256, pids=64, network=False, disk_mb=16, fsize_mb=8, nofile=256)

# Runs inside the container: decode the program, print a bare last expression's value, run it.
_WRAPPER = (
    "import ast, base64, sys\n"
    "source = base64.b64decode(sys.argv[1]).decode('utf-8', 'replace')\n"
    "tree = ast.parse(source, '<tool>', 'exec')\n"
    "last = tree.body[-1] if tree.body else None\n"
    "if isinstance(last, ast.Expr) and not (isinstance(last.value, ast.Call)"
    " and getattr(last.value.func, 'id', None) == 'print'):\n"
    "    value = ast.Call(ast.Name('__rollhub_show', ast.Load()), [last.value], [])\n"
    "    tree.body[-1] = ast.Expr(value)\n"
    "    ast.fix_missing_locations(tree)\n"
    "def __rollhub_show(value):\n"
    "    if value is not None:\n"
    "        print(value)\n"
    "exec(compile(tree, '<tool>', 'exec'), {'__name__': '__main__', '__rollhub_show': __rollhub_show})\n"
)


@dataclass
class ToolOutput:
    """What a call returned: the text the model reads, and how the call went."""

    text: str
    ok: bool  # ran to the end without an error
    timed_out: bool = False
    duration_s: float = 0.0


class EmbeddedBackend:
    """The bounded interpreter in a worker process of `tool_worker.shared_tool_pool()`."""

    name = "embedded"

    def __init__(self, timeout_s: float = 0.2, max_output_chars: int = 2000, pool: ToolWorkerPool | None = None):
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self._pool = pool

    @property
    def pool(self) -> ToolWorkerPool:
        return self._pool if self._pool is not None else shared_tool_pool()

    async def run_python(self, code: str) -> ToolOutput:
        result, duration_s = await self.pool.run(
            "python", code, time_limit_s=self.timeout_s, max_output_chars=self.max_output_chars
        )
        timed_out = bool(result.error and result.error.startswith("TimeoutError"))
        return ToolOutput(result.text(), result.ok, timed_out, duration_s)

    async def run_calculator(self, expression: str, time_limit_s: float) -> ToolOutput:
        """The calculator (one expression), in the same workers: it is untrusted input too."""
        result, duration_s = await self.pool.run("calculator", expression, time_limit_s=time_limit_s)
        timed_out = bool(result.error and result.error.startswith("TimeoutError"))
        return ToolOutput(result.text(), result.ok, timed_out, duration_s)

    def episode_metrics(self) -> dict[str, float]:
        return {}

    async def release(self) -> None:
        """Nothing to release: no state outlives a call."""


# --- the shared pool ---------------------------------------------------------------------

_BACKEND: Any = None  # one DockerBackend per process (thread-safe, usable from any event loop)
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def shared_pool(max_concurrent: int = 16, warm: int = 0, image: str = DEFAULT_IMAGE, limits: Limits = DEFAULT_LIMITS):
    """The sandbox pool of the running event loop (its semaphores belong to one loop), over one
    Docker backend per process whose containers are removed at exit (`exit_cleanup`); those of a
    SIGKILLed process by the next one's backend (the `gc` sweep of dead owners) or by
    `rollhub sandbox gc`. The first caller's settings win."""
    global _BACKEND
    from rollhub.sandbox.docker_backend import DockerBackend
    from rollhub.sandbox.pool import SandboxPool

    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None or pool._closed:
        if _BACKEND is None or _BACKEND._closed:
            # a run resumed after a SIGKILL first removes what the killed process left (owner gone)
            _BACKEND = DockerBackend(labels={"rollhub.role": "mathtool"}, collect_orphans=True)
        pool = SandboxPool(
            _BACKEND,
            max_concurrent=max_concurrent,
            max_concurrent_starts=4,
            warm={image: warm} if warm else None,
            warm_limits=limits,
        )
        _POOLS[loop] = pool
    return pool


async def close_shared_pool() -> None:
    """Remove the running loop's warm sandboxes and every container of the shared backend."""
    global _BACKEND
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.close()
    if _BACKEND is not None and not _POOLS:
        backend, _BACKEND = _BACKEND, None
        await backend.close()


class SandboxBackend:
    """Real `python3` in a pooled container, one per episode (see module docstring)."""

    name = "sandbox"

    def __init__(
        self,
        pool: Any = None,
        *,
        image: str = DEFAULT_IMAGE,
        limits: Limits = DEFAULT_LIMITS,
        timeout_s: float = 5.0,
        max_output_chars: int = 2000,
        warm: int = 0,
        max_concurrent: int = 16,
    ):
        self._pool = pool
        self.image = image
        self.limits = limits
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.warm = warm
        self.max_concurrent = max_concurrent
        self._box: Any = None
        self._metrics: dict[str, float] = {}

    @property
    def pool(self) -> Any:
        if self._pool is None:
            self._pool = shared_pool(self.max_concurrent, self.warm, self.image, self.limits)
        return self._pool

    async def run_python(self, code: str) -> ToolOutput:
        started = time.perf_counter()
        if self._box is None:
            self._box = await self.pool.acquire(self.image, self.limits)
            self._metrics["sandbox_start_s"] = time.perf_counter() - started
        encoded = base64.b64encode(code.encode("utf-8", "replace")).decode("ascii")
        command = f"python3 -I -c {shlex.quote(_WRAPPER)} {encoded}"
        exec_started = time.perf_counter()
        result = await self._box.exec(command, timeout_s=self.timeout_s, workdir="/tmp")
        self._metrics["sandbox_exec_s"] = self._metrics.get("sandbox_exec_s", 0.0) + time.perf_counter() - exec_started
        self._metrics["sandbox_execs"] = self._metrics.get("sandbox_execs", 0.0) + 1
        text = result.output.rstrip("\n")
        if result.timed_out:
            text = f"{text}\nTimeoutError: the program ran over {self.timeout_s:g} s and was stopped".lstrip("\n")
        elif result.oom_killed:
            text = f"{text}\nMemoryError: the program ran out of memory and was stopped".lstrip("\n")
        elif result.exit_code >= 128 and "Error" not in text[-200:]:
            text = f"{text}\nKilled (signal {result.exit_code - 128})".lstrip("\n")
        text, _ = truncate_middle(text, self.max_output_chars)
        return ToolOutput(text, result.ok, result.timed_out, time.perf_counter() - started)

    def episode_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    async def release(self) -> None:
        """Remove this episode's container (never reused: its files are the policy's)."""
        box, self._box = self._box, None
        self._metrics = {}
        if box is not None:
            try:
                await box.close()
            except SandboxError:  # already gone: the backend's close and gc catch the rest
                pass


__all__ = ["DEFAULT_IMAGE", "DEFAULT_LIMITS", "EmbeddedBackend", "SandboxBackend", "ToolOutput", "shared_pool"]
