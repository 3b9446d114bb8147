"""Who owns a container: the labels every rollhub container carries, and the liveness test
that `rollhub sandbox gc` uses to find orphans.

A container is labelled with the run id, the owner's host name, pid and the pid's start
time. The start time guards against pid reuse: an orphan whose pid now belongs to an
unrelated process is still recognised as an orphan.
"""

from __future__ import annotations

import os
import socket
import uuid

LABEL_RUN = "rollhub.run"
LABEL_OWNER_PID = "rollhub.owner_pid"
LABEL_OWNER_START = "rollhub.owner_start"
LABEL_HOST = "rollhub.host"


def host_name() -> str:
    return socket.gethostname()


def new_run_id() -> str:
    """A short unique id for one run (one backend instance unless given explicitly)."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:10]}"


def process_start_ticks(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), or
    None when the process does not exist (or /proc is unavailable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    after_name = raw[raw.rfind(")") + 2 :].split()
    return after_name[19] if len(after_name) > 19 else None


def owner_labels(run_id: str) -> dict[str, str]:
    pid = os.getpid()
    return {
        LABEL_RUN: run_id,
        LABEL_OWNER_PID: str(pid),
        LABEL_OWNER_START: process_start_ticks(pid) or "",
        LABEL_HOST: host_name(),
    }


def owner_is_alive(labels: dict[str, str]) -> bool:
    """True when the process that started a container (on this host) still runs.

    Containers from other hosts are reported alive: we cannot check them from here, and
    removing another machine's live sandboxes would be far worse than leaving an orphan.
    """
    if labels.get(LABEL_HOST, host_name()) != host_name():
        return True
    try:
        pid = int(labels.get(LABEL_OWNER_PID, ""))
    except ValueError:
        return False
    started = process_start_ticks(pid)
    if started is None:
        return False
    recorded = labels.get(LABEL_OWNER_START, "")
    return not recorded or recorded == started
