"""An engine that goes away or wedges mid-run: calls raise SandboxError, closing never raises.

The backend reaches the real engine through DOCKER_HOST pointing at a socket relay that the
test owns; shutting the relay down is exactly what a dead or unreachable engine looks like
from the client (connection refused / reset)."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from sandbox_testing import new_test_run_id

from rollhub.sandbox.base import SandboxError
from rollhub.sandbox.reaper import list_rollhub_containers, remove_run

pytestmark = pytest.mark.docker
IMAGE = "rollhub/base:bookworm"
ENGINE_SOCKET = "/var/run/docker.sock"


class SocketRelay:
    """Relays a unix socket to the engine's socket, byte for byte, until `stop()`."""

    def __init__(self, path: str):
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.connections: list[socket.socket] = []
        self.frozen: set[int] = set()  # ids of client sockets whose traffic is held back
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(ENGINE_SOCKET)
            with self.lock:
                self.connections += [client, engine]
            threading.Thread(target=self._pipe, args=(client, engine, id(client)), daemon=True).start()
            threading.Thread(target=self._pipe, args=(engine, client, id(client)), daemon=True).start()

    def _pipe(self, source: socket.socket, dest: socket.socket, key: int) -> None:
        try:
            while data := source.recv(65536):
                if key in self.frozen:
                    continue  # swallowed: the peer sees an open connection that says nothing
                dest.sendall(data)
        except OSError:
            pass
        if key in self.frozen:
            return  # a wedged engine does not even close the connection
        for end in (source, dest):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def freeze_open_connections(self) -> None:
        """Connections open now go silent (a wedged engine); new ones still work."""
        with self.lock:
            self.frozen.update(id(connection) for connection in self.connections[::2])

    def stop(self) -> None:
        self.listener.close()
        os.unlink(self.path)
        with self.lock:
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                    connection.close()
                except OSError:
                    pass


async def test_engine_loss_raises_sandbox_errors_and_close_stays_quiet(docker_client, tmp_path, monkeypatch):
    if not os.path.exists(ENGINE_SOCKET):
        pytest.skip(f"the engine is not on {ENGINE_SOCKET}")
    from rollhub.sandbox.docker_backend import DockerBackend

    relay = SocketRelay(str(tmp_path / "engine.sock"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{relay.path}")
    backend = DockerBackend(run_id=new_test_run_id(), max_threads=8)
    try:
        box = await backend.start(IMAGE)
        assert (await box.exec("echo through-the-relay", timeout_s=10)).output == "through-the-relay\n"
        assert len(list_rollhub_containers(docker_client.api, backend.run_id)) == 1  # on the real engine
        relay.stop()
        with pytest.raises(SandboxError):
            await box.exec("echo lost", timeout_s=10)
        with pytest.raises(SandboxError):
            await box.write_file("/tmp/x", "y")
        with pytest.raises(SandboxError):
            await backend.start(IMAGE)
        await box.close()  # must not raise
        await backend.close()  # must not raise either; the container is left for gc
        assert len(list_rollhub_containers(docker_client.api, backend.run_id)) == 1
    finally:
        remove_run(docker_client.api, backend.run_id)
    assert list_rollhub_containers(docker_client.api, backend.run_id) == []


async def test_wedged_exec_stream_hits_the_outer_deadline(docker_client, tmp_path, monkeypatch):
    if not os.path.exists(ENGINE_SOCKET):
        pytest.skip(f"the engine is not on {ENGINE_SOCKET}")
    import asyncio
    import time

    from rollhub.sandbox.docker_backend import DockerBackend

    relay = SocketRelay(str(tmp_path / "engine.sock"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{relay.path}")
    backend = DockerBackend(run_id=new_test_run_id(), max_threads=8, exec_grace_s=1.0)
    try:
        box = await backend.start(IMAGE)
        # The command's own timeout (3 s) leaves room for a slow event loop on a loaded host:
        # the freeze must come before the persistent shell could report the timeout.
        running = asyncio.ensure_future(box.exec("echo start; sleep 30; echo end", timeout_s=3))
        await asyncio.sleep(0.5)  # the exec's stream is open by now
        relay.freeze_open_connections()
        began = time.monotonic()
        with pytest.raises(SandboxError, match="outlived"):
            await running
        assert time.monotonic() - began < 15
        # The wedged sandbox was removed through a fresh connection.
        assert list_rollhub_containers(docker_client.api, backend.run_id) == []
        await backend.close()
    finally:
        relay.stop()
        remove_run(docker_client.api, backend.run_id)
