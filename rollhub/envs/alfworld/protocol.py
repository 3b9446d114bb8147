"""Framing of the messages between the env client and its worker processes.

One frame = 4-byte big-endian length + a pickle. Both ends are our own code in the same
installation, so pickle is safe here and keeps lists, dicts and exceptions' text intact.
Requests are `(request_id, op, slot, payload)`; replies are `(request_id, ok, result)`.
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

_HEADER = struct.Struct(">I")


def write_frame(stream: IO[bytes], message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    chunks = []
    remaining = size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: IO[bytes]) -> Any | None:
    """The next message, or None at end of stream (the other side exited)."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(stream, _HEADER.unpack(header)[0])
    if body is None:
        return None
    return pickle.loads(body)
