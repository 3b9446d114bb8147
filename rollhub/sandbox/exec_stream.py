"""The hijacked connection of a `docker exec`: opening it, and reading its multiplexed
frames (8-byte header: stream id, payload size) with a deadline.

The SDK's own reader blocks without a deadline, so a wedged engine would hang a worker
thread forever; this one raises TimeoutError and lets the caller remove the container.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Any


def open_exec_stream(api: Any, exec_id: str, separate_stderr: bool = False) -> ExecStream:
    """Start an exec and take over its connection (`separate_stderr`: see ExecStream).

    Like the SDK's `exec_start(socket=True)`, plus one fix: http.client reads the upgrade
    response through a buffered reader that may have read past the headers into the first
    output frames (a quick command on a loaded host). Those bytes would be lost if we read
    only the raw socket, so they are drained from the buffer here without blocking.
    """
    response = api._post_json(
        api._url("/exec/{0}/start", exec_id),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        data={"Tty": False, "Detach": False},
        stream=True,
    )
    sock = api._get_raw_response_socket(response)
    stream = ExecStream(sock, _drain_read_ahead(response, sock), separate_stderr=separate_stderr)
    stream.response = response  # keeps TLS sockets from being closed by garbage collection
    return stream


def _raw_socket(sock: Any) -> Any:
    return getattr(sock, "_sock", sock)


def _drain_read_ahead(response: Any, sock: Any) -> bytes:
    buffered = getattr(getattr(response.raw, "_fp", None), "fp", None)
    raw = _raw_socket(sock)
    if buffered is None or not hasattr(buffered, "peek") or not hasattr(raw, "setblocking"):
        return b""
    previous_timeout = raw.gettimeout()
    raw.setblocking(False)  # peek on an empty buffer then returns b"" instead of waiting
    try:
        ahead = buffered.peek(1 << 16)
        return buffered.read(len(ahead)) if ahead else b""
    except (BlockingIOError, OSError, ValueError):
        return b""
    finally:
        raw.settimeout(previous_timeout)


class ExecStream:
    """Reads payload bytes out of the frames; `TimeoutError` past a deadline (monotonic).

    By default stdout and stderr payloads are read as one stream. With `separate_stderr`
    only stdout is payload and the last `STDERR_KEEP_BYTES` of stderr are kept aside (the
    persistent shell's protocol travels on stdout; stderr only says why it failed)."""

    STDERR_KEEP_BYTES = 4096

    def __init__(self, sock: Any, early_bytes: bytes = b"", separate_stderr: bool = False):
        self.sock = sock
        self.separate_stderr = separate_stderr
        self._stderr = bytearray()
        self.raw = _raw_socket(sock)
        self.response: Any = None
        self._frames = bytearray(early_bytes)  # undecoded frame bytes
        self._payload = bytearray()  # decoded, not yet consumed
        self.eof = False
        # poll, not select: select fails on descriptors above 1024, which a large trainer
        # process with hundreds of sandboxes can reach.
        self._poller = select.poll()
        self._poller.register(self.raw, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
        self._decode()

    def _decode(self) -> None:
        while len(self._frames) >= 8:
            stream_id, size = struct.unpack(">BxxxL", self._frames[:8])
            if len(self._frames) < 8 + size:
                return
            if self.separate_stderr and stream_id == 2:
                self._stderr += self._frames[8 : 8 + size]
                del self._stderr[: -self.STDERR_KEEP_BYTES]
            else:
                self._payload += self._frames[8 : 8 + size]
            del self._frames[: 8 + size]

    def _receive(self, deadline: float) -> None:
        """Read one chunk from the socket into the frame buffer (sets `eof` at the end)."""
        while True:
            if not getattr(self.raw, "pending", lambda: 0)():  # TLS may hold decrypted bytes
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                # poll takes a C int of ms: wait at most an hour at a time (a 1e9 s timeout is legal)
                if not self._poller.poll(max(1, int(min(remaining, 3600.0) * 1000))):
                    if time.monotonic() < deadline:
                        continue
                    raise TimeoutError
            try:
                chunk = self.raw.recv(65536) if hasattr(self.raw, "recv") else (self.sock.read(65536) or b"")
            except (TimeoutError, InterruptedError, BlockingIOError):
                continue
            if not chunk:
                self.eof = True
                if len(self._frames) > 8:  # a truncated last frame: keep what arrived
                    self._payload += self._frames[8:]
                self._frames.clear()
            else:
                self._frames += chunk
                self._decode()
            return

    def read_until_eof(self, sink: Any, deadline: float) -> None:
        """Feed every payload byte to `sink.append` until the exec closes its output."""
        while True:
            if self._payload:
                sink.append(bytes(self._payload))
                self._payload.clear()
            if self.eof:
                return
            self._receive(deadline)

    def read_exact(self, size: int, deadline: float) -> bytes | None:
        """The next `size` payload bytes; None when the exec's output ends first."""
        while len(self._payload) < size:
            if self.eof:
                return None
            self._receive(deadline)
        data = bytes(self._payload[:size])
        del self._payload[:size]
        return data

    def send(self, data: bytes) -> None:
        """Write to the exec's stdin (exec created with stdin=True)."""
        target = self.raw if hasattr(self.raw, "sendall") else self.sock
        target.sendall(data)

    def close_stdin(self) -> None:
        """End the exec's stdin but keep reading its output (the engine closes the process's
        stdin when the client half-closes the hijacked connection)."""
        try:
            self.raw.shutdown(socket.SHUT_WR)
        except (OSError, AttributeError):
            pass

    def stderr_text(self) -> str:
        return bytes(self._stderr).decode("utf-8", "replace")

    def close(self) -> None:
        for candidate in (self.sock, self.raw):
            try:
                candidate.close()
            except Exception:
                pass
        if self.response is not None:
            try:
                self.response.close()
            except Exception:
                pass
