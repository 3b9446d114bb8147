"""Who owns a container: the labels every rollhub container carries, and the liveness test
that `rollhub sandbox gc` uses to find orphans.

A container is labelled with the run id and its owner's identity: host name, kernel boot id
(/proc/sys/kernel/random/boot_id: one value per machine and boot, shared by every container
on it), PID namespace (the inode of /proc/self/ns/pid), pid and the pid's start time.

A pid only means something inside one PID namespace of one running kernel. A Docker engine
is often shared (DOCKER_HOST over TCP, the socket mounted into containers, several hosts
with the same host name), so "I cannot see pid 1234" proves nothing unless the owner lived
in *this* boot and *this* namespace. The verdict is therefore three-way: alive, dead (proven
here), or foreign (cannot be checked from here), and only dead containers are collected.
The start time guards against pid reuse: an orphan whose pid now belongs to an unrelated
process is still recognised as an orphan.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from dataclasses import dataclass

LABEL_RUN = "rollhub.run"
LABEL_OWNER_PID = "rollhub.owner_pid"
LABEL_OWNER_START = "rollhub.owner_start"
LABEL_HOST = "rollhub.host"
LABEL_BOOT_ID = "rollhub.boot_id"
LABEL_PID_NS = "rollhub.pid_ns"

ALIVE = "alive"
DEAD = "dead"
FOREIGN = "foreign"  # owner outside this host + PID namespace, or labels too old to tell


@dataclass(frozen=True)
class OwnerStatus:
    """Verdict on a container's owner; `reason` says why, for `sandbox ls` and `gc`."""

    state: str  # ALIVE | DEAD | FOREIGN
    reason: str


def host_name() -> str:
    return socket.gethostname()


@functools.cache
def boot_id() -> str | None:
    """This kernel's boot id (same for every process and container on this machine and boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """Inode of this process's PID namespace: pids are only comparable within one namespace.

    Not cached: a forked child may live in a new namespace (unshare/clone with CLONE_NEWPID).
    """
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def new_run_id() -> str:
    """A short unique id for one run (one backend instance unless given explicitly)."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:10]}"


def process_start_ticks(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), or
    None when it cannot be read (no such process, /proc hidden or unavailable)."""
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
        LABEL_BOOT_ID: boot_id() or "",
        LABEL_PID_NS: pid_namespace() or "",
    }


def _foreign_reason(labels: dict[str, str]) -> str | None:
    """Why the owner cannot be checked from this process, or None when it can."""
    here_boot, here_ns = boot_id(), pid_namespace()
    if not labels.get(LABEL_BOOT_ID) or not labels.get(LABEL_PID_NS):
        return "labels lack boot id / PID namespace (older rollhub or no /proc): owner unverifiable"
    if here_boot is None or here_ns is None:
        return "this process cannot read its own boot id / PID namespace (/proc unavailable)"
    if labels[LABEL_BOOT_ID] != here_boot or labels.get(LABEL_HOST, "") != host_name():
        return "another host (boot id or host name differs; or an earlier boot of this one)"
    if labels[LABEL_PID_NS] != here_ns:
        return "another PID namespace on this host (e.g. another container)"
    return None


def _pid_exists(pid: int) -> bool:
    """Signal 0: exists even when /proc hides it (hidepid) or it belongs to another user."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_status(labels: dict[str, str]) -> OwnerStatus:
    """Alive, dead (provably, in this host + PID namespace) or foreign (not checkable here)."""
    foreign = _foreign_reason(labels)
    if foreign is not None:
        return OwnerStatus(FOREIGN, foreign)
    raw_pid = labels.get(LABEL_OWNER_PID, "")
    pid = int(raw_pid) if raw_pid.isdigit() else 0
    if pid <= 0:  # our host and namespace, but no process could have written this label
        return OwnerStatus(DEAD, f"owner pid label {raw_pid!r} is not a pid")
    if not _pid_exists(pid):
        return OwnerStatus(DEAD, f"owner pid {pid} is gone")
    recorded, started = labels.get(LABEL_OWNER_START, ""), process_start_ticks(pid)
    if recorded and started is not None and recorded != started:
        return OwnerStatus(DEAD, f"owner pid {pid} now belongs to a newer process")
    return OwnerStatus(ALIVE, f"owner pid {pid} is running")


def owner_is_alive(labels: dict[str, str]) -> bool:
    """False only when the owner is provably dead: foreign owners count as alive, because
    removing another machine's (or container's) live sandboxes is far worse than an orphan."""
    return owner_status(labels).state != DEAD
