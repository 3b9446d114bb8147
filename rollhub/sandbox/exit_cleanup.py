"""Remove a run's sandboxes when the process ends: normally, by exception, or by SIGINT /
SIGTERM.

Backends register themselves here. On interpreter exit (atexit) and on SIGINT/SIGTERM
every registered backend's `cleanup_now()` runs synchronously, then the previous signal
handler runs as it would have (KeyboardInterrupt for SIGINT, termination for SIGTERM).
SIGKILL cannot be caught; `rollhub sandbox gc` covers it through the owner labels.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from typing import Protocol

logger = logging.getLogger(__name__)


class _Cleanable(Protocol):
    def cleanup_now(self) -> None: ...


# Strong references on purpose: a backend dropped without close() (a crash unwinding the
# stack) must still be cleaned at exit, so the registry keeps it alive until then.
_registered: set[_Cleanable] = set()
_lock = threading.Lock()
_installed = False
_previous_handlers: dict[int, object] = {}


def _forget_in_child() -> None:
    """A forked child (multiprocessing, a worker pool) inherits the registry and the signal
    handlers; it must never remove its parent's sandboxes when it exits or is terminated."""
    _registered.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def register(backend: _Cleanable) -> None:
    """Remember `backend` for cleanup at exit; installs the hooks on first use."""
    with _lock:
        _registered.add(backend)
    _install_hooks()


def unregister(backend: _Cleanable) -> None:
    with _lock:
        _registered.discard(backend)


def cleanup_all() -> None:
    with _lock:
        backends = list(_registered)
    for backend in backends:
        try:
            backend.cleanup_now()
        except Exception:  # keep going: one broken backend must not leak the others
            logger.exception("sandbox cleanup failed for %r", backend)


def _on_signal(signum: int, frame: object) -> None:
    logger.warning("signal %d: removing this run's sandboxes", signum)
    cleanup_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # Default action: restore it and re-deliver, so the exit status says "killed by signal".
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    atexit.register(cleanup_all)
    if threading.current_thread() is not threading.main_thread():
        logger.debug("not in the main thread: signal cleanup hooks not installed (atexit still is)")
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            _previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, _on_signal)
        except (ValueError, OSError):  # e.g. an embedded interpreter
            logger.debug("could not install handler for signal %d", signum)
