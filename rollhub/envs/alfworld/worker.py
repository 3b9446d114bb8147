"""Entry point of one ALFWorld worker process (`python -m rollhub.envs.alfworld.worker`).

The worker owns a shard of game sessions (engine objects) and serves their calls one at a
time, in arrival order, over stdin/stdout frames (see `rollhub.envs.alfworld.protocol`). It
exits when stdin closes, so a worker never outlives its client. Engine objects are reused
across slots and games; a freed session that already holds the requested game skips the
~1 s load.

The real stdout is kept for frames only: fd 1 is pointed at stderr so a stray print in a
library cannot corrupt the protocol.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from typing import Any

from rollhub.envs.alfworld.engine import ensure_data_env
from rollhub.envs.alfworld.protocol import read_frame, write_frame

logger = logging.getLogger("rollhub.envs.alfworld.worker")


class WorkerState:
    """Sessions by client slot id, plus the free sessions kept for reuse."""

    def __init__(self) -> None:
        from rollhub.envs.alfworld.engine import install_logic_cache, install_translation_cache

        self.cache_stats = install_translation_cache()
        self.logic_cache_stats = install_logic_cache()
        self.sessions: dict[int, Any] = {}
        self.free: list[Any] = []

    def _session_for(self, slot: int, game_path: str | None = None) -> Any:
        from rollhub.envs.alfworld.engine import GameSession

        session = self.sessions.get(slot)
        if session is None:
            match = next((s for s in self.free if s.game_path == game_path), None)
            if match is None and self.free:
                match = self.free[-1]
            if match is not None:
                self.free.remove(match)
            session = match if match is not None else GameSession()
            self.sessions[slot] = session
        return session

    def handle(self, op: str, slot: int, payload: dict[str, Any]) -> Any:
        if op == "reset":
            return self._session_for(slot, payload["game_path"]).reset(payload["game_path"])
        if op == "step":
            session = self.sessions.get(slot)
            if session is None:
                raise RuntimeError(f"slot {slot} has no game (reset first)")
            return session.step(payload["command"], bool(payload.get("want_plan")))
        if op == "plan":
            return self.sessions[slot].plan()
        if op == "close":
            session = self.sessions.pop(slot, None)
            if session is not None:
                self.free.append(session)
            return None
        if op == "stats":
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return {
                "pid": os.getpid(),
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "max_rss_mb": usage.ru_maxrss / 1024.0,
                "rss_mb": _current_rss_mb(),
                "sessions": len(self.sessions),
                "free_sessions": len(self.free),
                "translation_cache": dict(self.cache_stats),
                "logic_cache": dict(self.logic_cache_stats),
            }
        raise ValueError(f"unknown op {op!r}")

    def drop(self, slot: int) -> None:
        """Forget a session whose engine raised: its state can no longer be trusted."""
        self.sessions.pop(slot, None)


def _current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def main() -> int:
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    ensure_data_env()
    logging.basicConfig(
        level=os.environ.get("ROLLHUB_ALFWORLD_LOG", "WARNING"), format="alfworld-worker %(levelname)s: %(message)s"
    )
    state = WorkerState()
    write_frame(replies, (0, True, {"ready": True, "pid": os.getpid()}))
    while True:
        message = read_frame(requests)
        if message is None:
            return 0
        request_id, op, slot, payload = message
        try:
            reply = (request_id, True, state.handle(op, slot, payload))
        except Exception as exc:  # reported to the client as an infra failure of this slot only
            logger.exception("op %s on slot %s failed", op, slot)
            state.drop(slot)
            reply = (request_id, False, f"{type(exc).__name__}: {exc}")
        write_frame(replies, reply)


if __name__ == "__main__":
    sys.exit(main())
