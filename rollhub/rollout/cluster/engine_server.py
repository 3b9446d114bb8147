"""EngineServer: a Ray actor that runs one inference server on its node and reports its URL.

* `engine="rollhub"` (CPU, tests): the transformers engine behind the same aiohttp app as
  `rollhub serve`, inside the actor process, so killing the actor kills the server.
* `engine="sglang"` (GPU nodes): `python -m sglang.launch_server` as a child process that
  dies with the actor (Linux parent-death signal, own process group; see
  rollhub.inference.engines.launcher); the actor asks for `num_gpus`. Its output goes to a log
  file (`log_dir`, default the system temp folder), never to a pipe nobody reads: a server
  that logs more than a pipe holds would block.

A replacement server starts from the latest pushed weights and reports that version, so
it rejoins a running job without a special path.

Exposure: a server listens on its node's IP (`ray.util.get_node_ip_address()`), not on
every interface, and requires the run's API key as a bearer token (the driver generates
one per run and gives it to the servers and the routers), so nobody else on the network can
generate, pause the engine or make it load weights from a path of their choosing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from rollhub.inference.engines.build import EngineConfig

logger = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class EngineServer:
    """Construct through `ray.remote(...)(EngineServer)`; call `start()` once, then use the URL."""

    def __init__(
        self,
        engine_id: str,
        kind: str,
        model_path: str,
        weight_version: int = 0,
        *,
        engine: EngineConfig | None = None,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 600.0,
        api_key: str | None = None,
        device: str = "auto",
        log_dir: str | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.api_key = api_key
        self.kind = kind
        self.model_path = model_path
        self.weight_version = weight_version
        # this actor is the server: its engine runs in-process here, whatever the run's backend
        self.engine_config = dataclasses.replace(engine or EngineConfig(), backend="inprocess")
        self.device = device  # auto: the GPU Ray gave this actor, if any
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / "rollhub-engines"
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self._runner: Any = None
        self._process: Any = None  # launcher.LaunchedServer of an sglang server
        self._info: dict[str, Any] | None = None

    async def start(self) -> dict[str, Any]:
        if self._info is not None:
            return self._info
        import ray

        host = ray.util.get_node_ip_address()
        if self.kind == "rollhub":
            host, port = await self._start_rollhub(host)
        else:
            port = await self._start_sglang(host)
        context = ray.get_runtime_context()
        self._info = {
            "engine_id": self.engine_id,
            "url": f"http://{host}:{port}",
            "node_id": context.get_node_id(),
            "node_ip": host,
            "pid": os.getpid(),
            "kind": self.kind,
            "weight_version": self.weight_version,
        }
        logger.info("engine %s serving %s at %s", self.engine_id, self.model_path, self._info["url"])
        return self._info

    async def _start_rollhub(self, host: str) -> tuple[str, int]:
        """The serve app on `host` (the node IP); (address clients should use, port)."""
        import torch
        from aiohttp import web

        from rollhub.inference.engines.build import build_engine
        from rollhub.inference.server import build_app

        torch.set_num_threads(self.engine_config.threads)
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # one "Loading weights" bar per push would flood the driver's log
        engine = build_engine(self.engine_config, self.model_path, device=self.device)
        engine.weight_version = self.weight_version
        self._runner = web.AppRunner(build_app(engine, api_key=self.api_key), access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host=host, port=0).start()
        except OSError as exc:  # the node IP is not on a local interface (NAT, some containers)
            logger.warning(
                "engine %s cannot bind %s (%s); listening on 0.0.0.0%s",
                self.engine_id,
                host,
                exc,
                " behind the API key" if self.api_key else " WITHOUT authentication",
            )
            await web.TCPSite(self._runner, host="0.0.0.0", port=0).start()
        return host, self._runner.addresses[0][1]

    async def _start_sglang(self, host: str) -> int:
        from rollhub.inference.engines.launcher import LaunchedServer
        from rollhub.inference.engines.sglang import API_KEY_ENV, SGLangEngine, SGLangError

        port = _free_port()
        command = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model_path,
            "--host",
            host,
            "--port",
            str(port),
            *(["--api-key", self.api_key] if self.api_key else []),
            *self.extra_args,
        ]
        env = {**os.environ, **({API_KEY_ENV: self.api_key} if self.api_key else {})}
        self._process = LaunchedServer(self.engine_id, command, self.log_dir / f"{self.engine_id}-{port}.log", env)
        self._process.start()
        client = SGLangEngine(f"http://{host}:{port}", api_key=self.api_key or "")
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.startup_timeout_s
            while not await client.healthy():
                if (reason := self._process.exit_reason()) is not None:
                    raise SGLangError(f"sglang {reason}: {self._process.log_tail()}")
                if loop.time() > deadline:
                    raise SGLangError(f"sglang on port {port} not healthy after {self.startup_timeout_s:.0f} s")
                await asyncio.sleep(1.0)
            await client._post("/update_weight_version", {"new_version": str(self.weight_version)})
        finally:
            await client.close()
        return port

    async def ping(self) -> bool:
        if self._process is not None and (reason := self._process.exit_reason()) is not None:
            raise RuntimeError(f"sglang server of {self.engine_id}: {reason}")
        return True

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # closes the engine too (app on_cleanup)
            self._runner = None
        if self._process is not None:
            await asyncio.to_thread(self._process.stop, 30)
