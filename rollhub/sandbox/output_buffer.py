"""Bounded capture of a command's output: keeps the head and the tail, counts the rest.

A runaway command (`yes`, a test suite dumping megabytes) must not grow our memory, so the
middle is dropped while reading rather than after.
"""

from __future__ import annotations

from rollhub.sandbox.base import truncate_middle


class HeadTailBuffer:
    def __init__(self, limit_chars: int):
        if limit_chars < 2:
            raise ValueError(f"output limit must be at least 2 characters, got {limit_chars}")
        self.limit_chars = limit_chars
        # Bytes, not characters: keep a little more than needed so multi-byte characters at the
        # edges still decode to `limit_chars // 2` characters on each side.
        self._keep_bytes = 2 * limit_chars
        self._head = bytearray()
        self._tail = bytearray()
        self.total_bytes = 0

    def append(self, data: bytes) -> None:
        self.total_bytes += len(data)
        room = self._keep_bytes - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > self._keep_bytes:
                del self._tail[: len(self._tail) - self._keep_bytes]

    def text(self) -> tuple[str, bool]:
        """The captured output, truncated head+tail to `limit_chars`; and whether it was."""
        kept = len(self._head) + len(self._tail)
        if kept == self.total_bytes:  # nothing dropped while reading
            return truncate_middle(bytes(self._head + self._tail).decode("utf-8", "replace"), self.limit_chars)
        half = self.limit_chars // 2
        head = bytes(self._head).decode("utf-8", "replace")[:half]
        tail = bytes(self._tail).decode("utf-8", "replace")[-half:]
        dropped = self.total_bytes - len(head.encode()) - len(tail.encode())
        return f"{head}\n... [{dropped} characters truncated] ...\n{tail}", True
