"""The `server` engine backend: launch (or attach to) inference servers and route over them.

`engine.backend: server` gives every command (train, eval, rollout) a `ServerEngine`: an
`EngineRouter` over N replicas that rollhub either launches from a command template
(`engine.launch`, `engine.replicas`) or attaches to by URL (`engine.urls`).

Launching, and why each step is as it is:
* the template is split like a shell line first and each word filled in afterwards, so a
  model path with spaces stays one argument; `rollhub` and `sglang` name built-in templates;
* each replica gets its own port (a free one, or `engine.base_port + i`) and its own seed;
* stdout and stderr go to `RUN_DIR/servers/<replica>.log`: a pipe nobody reads fills up
  (64 KiB) and then blocks the server mid-write, which looks exactly like a hung server;
* ready means `/health_generate` answered, i.e. the server ran a real generation, not just
  that its port is open; a server that exits while starting is reported with its log's tail;
* launched servers never outlive the run: each runs in its own process group with a
  parent-death signal (SIGKILL when the launching thread's process dies, crash or kill -9
  included), `close()` stops the group (SIGTERM, then SIGKILL), and an `atexit` hook does
  the same for a run that never reached `close()`. A wrapper script must `exec` the server
  for the parent-death signal to reach it (its group is stopped by `close()` regardless).
GPUs: replica i gets its own `tp` GPUs through CUDA_VISIBLE_DEVICES (`plan_gpus`), never one
the trainer uses, unless `share_gpu` allows it (a one-GPU machine); NCCL refuses two ranks of
one group on one GPU, and a server that takes its default share of a GPU the trainer uses
leaves no room for the optimizer state, so a shared GPU also caps the server's static
memory (`mem_fraction`, SGLang's `--mem-fraction-static`; `SHARED_MEM_FRACTION` by default).
The dtype is always explicit (`{dtype}`: `auto` becomes bfloat16 on a GPU, float32 on the
CPU): SGLang's own `auto` serves a float32 checkpoint in float16.
Launched servers get the run's API key (ROLLHUB_API_KEY, else a fresh random one) in their
environment as ROLLHUB_API_KEY (what `rollhub serve` reads); `{api_key}` puts it on a
command line (SGLang's `--api-key`).
Placement (`engine.placement`): servers run as children of this process (`local`) or on nodes
Ray picks (`ray`, rollhub.inference.engines.hosts); the command line, readiness, watchdog,
replacement and weight sync are this module's and the router's in both.
Replacement: a launched replica that the router marks down (exited, hung, unreachable) is
relaunched in its slot, up to `engine.max_replacements` times per run, from the latest pushed
weights (disk sync: the newest version folder; distributed sync: the base model, held out of
routing until the next push reaches it), so it never serves an older version than its peers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shlex
import string
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.inference.engines.hosts import LaunchedServer, LocalHost, ServerHost, free_port
from rollhub.inference.engines.router import EngineRouter, Replica, ReplicaError, replicas_from_urls
from rollhub.inference.engines.sglang import API_KEY_ENV

logger = logging.getLogger(__name__)

#: `engine.launch: rollhub` -- the transformers engine behind rollhub's SGLang-native server
ROLLHUB_SERVE_TEMPLATE = (
    "{python} -m rollhub.cli serve --model {model} --host {host} --port {port} --threads {threads} "
    "--max-batch-size {max_batch_size} --seed {seed} --device {device} --dtype {dtype}"
)
#: `engine.launch: sglang` -- SGLang's own server (GPU machines); `--mem-fraction-static` is added
#: when a memory fraction is set (a shared GPU)
SGLANG_TEMPLATE = (
    "{python} -m sglang.launch_server --model-path {model} --host {host} --port {port} --api-key {api_key} "
    "--random-seed {seed} --dtype {dtype} --tp-size {tp}"
)
#: the server's share of a GPU it shares with the trainer (SGLang's weights + KV cache), the rest
#: being the trainer's: for a model of P parameters the trainer holds ~16 P bytes (fp32 weights,
#: gradients, two Adam moments) plus activations, the server 2 P (bf16) plus its KV cache
SHARED_MEM_FRACTION = 0.3
NAMED_TEMPLATES = {"rollhub": ROLLHUB_SERVE_TEMPLATE, "sglang": SGLANG_TEMPLATE}
#: what `{...}` may name in a launch template
TEMPLATE_FIELDS = (
    "python",
    "model",
    "host",
    "port",
    "replica",
    "threads",
    "max_batch_size",
    "seed",
    "device",
    "dtype",
    "api_key",
    "tp",
    "gpus",
    "mem_fraction",
)


def template_words(template: str) -> list[str]:
    """The launch template as words, each still holding its `{field}`s; bad fields are a UserError."""
    template = NAMED_TEMPLATES.get(template.strip(), template)
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise UserError(f"engine.launch is not a valid command line ({exc}): {template!r}") from None
    if not words:
        raise UserError("engine.launch is empty; use 'rollhub', 'sglang' or a command template")
    for word in words:
        try:
            fields = [name for _, name, _, _ in string.Formatter().parse(word) if name is not None]
        except ValueError as exc:
            raise UserError(f"engine.launch word {word!r}: {exc} (write a literal brace as {{{{ or }}}})") from None
        for name in fields:
            if name not in TEMPLATE_FIELDS:
                raise UserError(
                    f"engine.launch names {{{name}}}, which is not a template field; known: "
                    + ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
                )
    return words


def plan_gpus(
    *,
    replicas: int,
    tp: int,
    visible: int,
    trainer_gpus: list[int],
    gpus: list[int] | None = None,
    share: bool = False,
) -> tuple[list[list[int]] | None, bool]:
    """The GPU indices (as this process sees them) of each replica, and whether any is one of the
    trainer's; (None, False) on a machine without GPUs. Refuses, with the fix, what cannot work:
    too few GPUs, a GPU named twice, or a trainer GPU without `share`."""
    if tp < 1:
        raise UserError(f"engine.tp must be >= 1, got {tp}")
    if visible == 0:
        if gpus:
            raise UserError(f"engine.gpus={gpus} but this machine has no GPU")
        return None, False
    need = replicas * tp
    trainer = sorted(set(trainer_gpus))
    if gpus:
        if len(set(gpus)) != len(gpus) or any(not 0 <= g < visible for g in gpus):
            raise UserError(f"engine.gpus={gpus} must name distinct GPUs in [0, {visible})")
        pool = list(gpus)
    else:
        pool = [g for g in range(visible) if g not in trainer]
        if len(pool) < need and share:
            pool += [g for g in trainer if g < visible]
    if len(pool) < need:
        raise UserError(
            f"{replicas} replica(s) x engine.tp={tp} need {need} GPU(s) beside the trainer's {trainer}, and this "
            f"machine has {visible}: use fewer replicas, or engine.share_gpu=true to put servers on the trainer's "
            "GPU (weights then move by disk or gloo, and the server takes engine.mem_fraction of its memory)"
        )
    plan = [pool[i * tp : (i + 1) * tp] for i in range(replicas)]
    shared = any(g in trainer for part in plan for g in part)
    if shared and not share:
        raise UserError(
            f"engine.gpus={gpus} includes the trainer's GPU(s) {trainer}; name other GPUs, or set engine.share_gpu=true"
        )
    return plan, shared


def physical_gpus(indices: list[int], environ: dict[str, str] | None = None) -> str:
    """CUDA_VISIBLE_DEVICES for a child: this process's indices mapped through its own
    CUDA_VISIBLE_DEVICES (index 1 under "2,3,5" is GPU 3)."""
    parent = (environ if environ is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if parent is None or not parent.strip():
        return ",".join(str(i) for i in indices)
    names = [item.strip() for item in parent.split(",") if item.strip()]
    return ",".join(names[i] for i in indices)


class ServerEngine(EngineRouter):
    """The `server` backend: launched or attached replicas behind an EngineRouter.

    `start()` launches (if a template is given), waits until every replica is ready and
    starts the watchdog; `generate` starts it on first use too, but callers should call it
    first so a server that cannot start stops the command with its reason.
    """

    def __init__(
        self,
        model_path: str,
        *,
        launch: str | None = None,
        replicas: int = 1,
        urls: list[str] | None = None,
        host: str = "127.0.0.1",
        base_port: int = 0,
        log_dir: str | Path = "runs/servers",
        startup_timeout_s: float = 600.0,
        template_values: dict[str, Any] | None = None,
        api_key: str | None = None,
        gpu_plan: list[list[int]] | None = None,
        mem_fraction: float | None = None,
        server_python: str | None = None,
        placement: ServerHost | None = None,
        max_replacements: int = 0,
        **router_arguments: Any,
    ) -> None:
        if (launch is None) == (not urls):
            raise UserError("the server backend needs exactly one of engine.launch and engine.urls")
        self.launch_words = template_words(launch) if launch is not None else None
        self.sglang_template = launch is not None and launch.strip() == "sglang"
        if gpu_plan is not None and len(gpu_plan) != replicas:
            raise ValueError(f"gpu_plan has {len(gpu_plan)} entries for {replicas} replicas")
        self.gpu_plan = gpu_plan
        if mem_fraction is not None and not 0 < mem_fraction < 1:
            raise UserError(f"engine.mem_fraction must be in (0, 1), got {mem_fraction}")
        self.mem_fraction = mem_fraction
        self.server_python = server_python or sys.executable
        self.replica_count = replicas
        self.host = host
        self.base_port = base_port
        self.log_dir = Path(log_dir)
        self.startup_timeout_s = startup_timeout_s
        self.template_values = dict(template_values or {})
        # flags the `sglang` template appends (e.g. SGLang's LoRA flags for engine.weight_sync lora_adapter)
        self.server_args: list[str] = []
        if max_replacements < 0:
            raise UserError(f"engine.max_replacements must be >= 0, got {max_replacements}")
        self.placement: ServerHost = placement or LocalHost(host, base_port)
        self.max_replacements = max_replacements
        self.replacements = 0
        self.servers: list[Any] = []  # every server launched, replaced ones included (LaunchedServer or Ray's)
        self._listeners: list[Any] = []
        self._replacing: set[asyncio.Task] = set()
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        if self.launch_words is not None:
            # a key only this run knows: launched servers are reachable by every local user
            api_key = api_key or os.environ.get(API_KEY_ENV) or secrets.token_urlsafe(32)
            # placeholders until start() knows the ports
            initial = [Replica(f"replica-{i}", f"http://{host}:0") for i in range(replicas)]
        else:
            initial = replicas_from_urls(list(urls or []))
        super().__init__(initial, api_key=api_key, model_path=model_path, **router_arguments)

    async def start(self) -> None:
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            try:
                if self.launch_words is not None:
                    await self._launch_all()
                await asyncio.gather(*(self._wait_ready(r) for r in self.replicas))
            except BaseException:
                self._stop_servers()
                raise
            self._started = True
            await super().start()

    async def generate(self, input_ids: list[int], sampling: Any, request_id: str | None = None) -> Any:
        if not self._started:
            await self.start()
        return await super().generate(input_ids, sampling, request_id)

    async def update_weights(self, source: Any, version: int) -> None:
        if not self._started:
            await self.start()
        await super().update_weights(source, version)

    def command_for(self, index: int, port: int, host: str | None = None, model: str | None = None) -> list[str]:
        """Replica `index`'s command line; `host` where it listens (a Ray node's IP), `model` the
        folder it loads (a replacement's: the latest pushed weights)."""
        values = {
            "python": self.server_python,
            "host": host or self.host,
            "port": port,
            "replica": index,
            "api_key": self.api_key or "",
            "dtype": "auto",
            "tp": 1,
            **self.template_values,
        }
        values["seed"] = int(values.get("seed", 0)) + index  # replicas must not draw the same samples
        if model is not None:
            values["model"] = model
        gpus = self.gpu_plan[index] if self.gpu_plan is not None else None
        placed_gpus = self.placement.gpu_count()
        if gpus is None and placed_gpus:  # Ray gave the server its GPUs (its own CUDA_VISIBLE_DEVICES)
            gpus = list(range(placed_gpus))
        if gpus is not None:
            values["device"] = "cuda"  # the first of its own CUDA_VISIBLE_DEVICES
            values["tp"] = len(gpus)
        values["gpus"] = ",".join(str(g) for g in gpus or [])
        on_gpu = gpus is not None or str(values.get("device", "cpu")).startswith("cuda") or self.sglang_template
        if values["dtype"] == "auto":  # never the server's own auto: SGLang's serves float32 as float16
            values["dtype"] = "bfloat16" if on_gpu else "float32"
        values["mem_fraction"] = "" if self.mem_fraction is None else f"{self.mem_fraction:g}"
        words = self.launch_words or []
        if self.mem_fraction is None and any("{mem_fraction}" in word for word in words):
            raise UserError("engine.launch names {mem_fraction}, but engine.mem_fraction is not set")
        command = [word.format(**values) for word in words]
        if self.sglang_template and self.mem_fraction is not None:
            command += ["--mem-fraction-static", values["mem_fraction"]]
        if self.sglang_template:
            command += self.server_args
        return command

    def env_for(self, index: int, base: dict[str, str]) -> dict[str, str]:
        """The replica's environment: the run's, with its own GPUs when placed."""
        env = dict(base)
        if self.gpu_plan is not None:
            env["CUDA_VISIBLE_DEVICES"] = physical_gpus(self.gpu_plan[index], base)
        return env

    def _launch_env(self, index: int) -> dict[str, str]:
        """What a server's environment adds to its host's: the run's key, threads, its GPUs."""
        env = {API_KEY_ENV: self.api_key or ""}
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(self.template_values.get("threads", 1)))
        if self.gpu_plan is not None:
            env["CUDA_VISIBLE_DEVICES"] = physical_gpus(self.gpu_plan[index])
        return env

    async def _launch_all(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.debug("launching engine servers from a non-main thread; they die when it exits")
        await asyncio.gather(*(self._launch(index, replica) for index, replica in enumerate(self.replicas)))

    async def _launch(self, index: int, replica: Replica, model: str | None = None) -> None:
        """Start replica `index`'s server where the placement puts it and point `replica` at it."""
        host, port = await self.placement.address(replica.replica_id, index)
        command = self.command_for(index, port, host=host, model=model)
        log_path = self._log_path(replica)
        server = await self.placement.launch(replica.replica_id, command, self._launch_env(index), log_path)
        self.servers.append(server)
        replica.process = server
        replica.url = f"http://{host}:{port}"
        if replica.client is not None:
            self._retired.append(replica.client)  # closed with the router
        replica.client = self._new_client(replica.url)
        gpus = self.gpu_plan[index] if self.gpu_plan is not None else None
        if gpus is not None or self.placement.gpu_count():
            replica.client.tp_size = len(gpus) if gpus is not None else int(self.template_values.get("tp", 1))
        logger.info(
            "engine %s (%s): pid %s on %s, log %s",
            replica.replica_id,
            self.placement.name,
            server.pid,
            replica.url,
            server.log_path,
        )

    # --- replacement ---------------------------------------------------------------------

    def on_replicas_changed(self, callback: Any) -> None:
        """`callback(urls)` (may be async) after a replica was replaced: {replica id: url} of the
        replicas that serve now (Ray env shards route over the same table)."""
        self._listeners.append(callback)

    def serving_urls(self) -> dict[str, str]:
        return {r.replica_id: r.url for r in self.replicas if r.live}

    def _on_down(self, replica: Replica) -> None:
        if self.launch_words is None or self._closed or not self._started:
            return  # attached servers are not ours to restart
        if self.replacements >= self.max_replacements:
            if self.max_replacements:
                logger.error(
                    "engine %s is down and engine.max_replacements=%d is used up; it stays down",
                    replica.replica_id,
                    self.max_replacements,
                )
            if not any(r.up for r in self.replicas) and not self._replacing:  # nothing left to serve
                self._spawn_notice(self._notify())
            return
        self.replacements += 1
        self._spawn_notice(self._replace(replica))

    async def _replace(self, replica: Replica) -> None:
        """Relaunch `replica` from the latest weights (see the module docstring), then rejoin it."""
        index = self.replicas.index(replica)
        try:
            async with self._lock():  # never in the middle of a push: it starts from the version pushed last
                latest = self.last_push.get("path") if self.last_push.get("method") == "disk" else None
                await self._launch(index, replica, model=latest)
                await self._wait_ready(replica, announce=latest is not None or not self.weight_version)
                self.revive(replica, awaiting_push=latest is None and bool(self.weight_version))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.error("engine %s could not be replaced: %s", replica.replica_id, exc)
            return
        self.stats.engines_replaced += 1
        logger.warning("engine %s replaced: %s", replica.replica_id, replica.url)
        await self._notify()

    async def _notify(self) -> None:
        urls = self.serving_urls()
        for callback in list(self._listeners):
            result = callback(urls)
            if asyncio.iscoroutine(result):
                await result

    def _spawn_notice(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    def _log_path(self, replica: Replica) -> Path:
        return self.log_dir / f"{replica.replica_id}.log"

    async def _wait_ready(self, replica: Replica, announce: bool = True) -> None:
        """Until `/health_generate` answers 200 (a real generation ran), or the process exits, or time runs
        out; an attached URL where nothing listens fails at once (a starting server that answers 503 is waited for)."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if replica.process is not None and (reason := replica.process.exit_reason()) is not None:
                tail = replica.process.log_tail().strip().splitlines()[-5:]  # type: ignore[attr-defined]
                raise UserError(
                    f"engine server {replica.replica_id} did not start: {reason}; last lines:\n  " + "\n  ".join(tail)
                )
            if await self._ready(replica):
                break
            if time.monotonic() > deadline:
                where = f" (log: {replica.process.log_path})" if replica.process is not None else ""  # type: ignore[attr-defined]
                raise UserError(
                    f"engine server {replica.replica_id} at {replica.url} not ready after "
                    f"{self.startup_timeout_s:.0f} s{where}; raise engine.startup_timeout_s or check the server"
                )
            await asyncio.sleep(0.25)
        if self.weight_version and announce:  # a server joining a run that has pushed weights must say so
            await replica.client.update_weight_version(self.weight_version)

    async def _ready(self, replica: Replica) -> bool:
        import aiohttp

        try:
            session = await replica.client._http()  # type: ignore[union-attr]
            async with session.get(replica.url + "/health_generate", timeout=aiohttp.ClientTimeout(total=60)) as r:
                await r.read()
                if r.status == 401:
                    raise UserError(
                        f"engine server {replica.replica_id} at {replica.url} refused the API key; "
                        f"set {API_KEY_ENV} to the key the server was started with"
                    )
                return r.status == 200
        except aiohttp.ClientConnectorError as exc:
            if replica.process is None:  # attached: it should be running already, and nothing listens there
                raise UserError(
                    f"no engine server at {replica.url} ({exc.os_error or exc}); start one "
                    f"(e.g. 'rollhub serve --model {self.model_path} --port PORT') or fix engine.urls"
                ) from None
            return False  # launched: still starting
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    def _stop_servers(self) -> None:
        for server in self.servers:
            server.stop()
        self.placement.close()

    async def close(self) -> None:
        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        try:
            await super().close()
        finally:
            await asyncio.to_thread(self._stop_servers)


async def start_engine(engine: Any) -> None:
    """Start what an engine needs before its first request (servers: launch and readiness)."""
    start = getattr(engine, "start", None)
    if start is not None:
        await start()


__all__ = [
    "LaunchedServer",
    "ReplicaError",
    "ServerEngine",
    "free_port",
    "plan_gpus",
    "start_engine",
    "template_words",
]
