"""Docker containers as sandboxes, through the `docker` SDK.

Each sandbox is one container idling on `sleep infinity` under `--init` (so signals reach
children and zombies are reaped), with the network off unless asked for, cpu / memory /
pids limits, and owner labels (run id, host, pid) so that `rollhub sandbox gc` can find
orphans. `close()` is `rm -f`, never a graceful stop.

Commands run in one of two ways (`Limits.exec_mode`, default `DockerBackend(exec_mode=)`):
- "persistent-shell" (the default): one controller process per container, started once
  through `docker exec`, runs each command and frames its output and exit status back
  (persistent_shell.py): a round trip costs what the command costs (a few ms), not what
  runc costs to enter the container (~100 ms). Falls back to docker-exec for an image
  without Python 3.
- "docker-exec": one `docker exec` per command, wrapped in `timeout -s KILL`.
Both have the same semantics, tested side by side; both sweep leftover processes after
each command. A second, outer deadline guards against a wedged engine or controller.
`exec(..., user=)` runs one command as another user than the sandbox's (docker exec).

Hardening (rollhub/sandbox/README.md, "Hardening"): every capability dropped but
`Limits.cap_add`, no-new-privileges, rlimits (nofile, fsize, nproc), no container log, an
OOM score that makes the host's OOM killer pick sandboxes before the trainer, the image's
non-root sandbox user when it declares one, a disk budget (`storage_opt size`, or a
read-only root with size-limited tmpfs volumes), capped reads, and a sweep after every
command that kills every process it left behind (`setsid`, double forks, daemons).

The SDK is blocking, so every call runs on this backend's own thread pool: the default
executor of asyncio has only a handful of threads, which would serialise 64 concurrent
sandboxes. `DOCKER_HOST` (read by `docker.from_env`) selects a remote engine.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import re
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from rollhub.sandbox import exit_cleanup, ownership, reaper
from rollhub.sandbox.base import (
    DEFAULT_MAX_READ_BYTES,
    EXEC_MODES,
    EXEC_PERSISTENT_SHELL,
    ExecResult,
    FileTooLargeError,
    Limits,
    Sandbox,
    SandboxBackend,
    SandboxError,
)
from rollhub.sandbox.exec_stream import open_exec_stream
from rollhub.sandbox.images import LABEL_SANDBOX_USER  # the image's non-root user ("name" or "uid:gid")
from rollhub.sandbox.output_buffer import HeadTailBuffer
from rollhub.sandbox.persistent_shell import PersistentShell, ShellLost, ShellProtocolError
from rollhub.sandbox.tar_archives import (
    directory_tar,
    first_file_from_tar,
    rebase_tar,
    require_absolute,
    single_file_tar,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

IDLE_COMMAND = ["sleep", "infinity"]
# The init and the idle command run as this uid, which no command runs as: without
# CAP_KILL, root in the container cannot signal them (`kill -9 -1` or `kill -TERM 1`, which
# the init would forward to the idle command, cannot take the sandbox down). Commands run
# with an explicit user (`SandboxUser.spec`), never as this one. Docker gives a container
# whose user is not root only a bounding set of capabilities, and with no-new-privileges
# even a root `docker exec` then has none; so a sandbox with `Limits.cap_add` runs its init
# as root instead (and a root command could then kill the idle command, ending its sandbox).
IDLE_USER = "65533:65533"
# Exit statuses of `timeout -s KILL`: 124 when it reports the timeout, 137 (128 + SIGKILL)
# when the kill of the process group also took `timeout` itself.
_TIMEOUT_EXIT_CODES = (124, 137)
_SIGKILL_EXIT_CODE = 137
# The cgroup's OOM-kill counter, as seen from inside the container (cgroup v2, then v1).
_OOM_COUNTER_PROBE = (
    "cat /sys/fs/cgroup/memory.events 2>/dev/null || cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null"
)
_OOM_KILL_LINE = re.compile(rb"^oom_kill (\d+)$", re.MULTILINE)

DISK_STORAGE_OPT = "storage-opt"
DISK_TMPFS = "tmpfs"
#: Host OOM killer: sandbox processes go first, the trainer last (range -1000..1000).
SANDBOX_OOM_SCORE_ADJ = 500
#: Storage drivers whose `storage_opt size` may work (overlay2 only on xfs with pquota).
_QUOTA_DRIVERS = ("devicemapper", "btrfs", "zfs", "windowsfilter")
# Go's os.FileMode type bits, as the archive API's stat header reports them.
_GO_MODE_DIR = 1 << 31
_GO_MODE_NOT_REGULAR = _GO_MODE_DIR | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)

# Kills every process of the container except PID 1 (the init), the idle command (the init's
# oldest child) and the sweeping shell itself: whatever a command left behind, including
# `setsid` daemons and double-forked orphans that escaped its process group. Repeats until a
# round finds nothing to kill (a fork bomb keeps forking while it is being killed). POSIX sh,
# builtins only (a forked helper would be killed by its own sweep); a non-root sweep cannot
# touch root's processes, which is fine: commands run as the same user.
_SWEEP = r"""
me=$$; idle=; idle_start=
for d in /proc/[0-9]*; do
  { read -r s < "$d/stat"; } 2>/dev/null || continue
  set -- ${s##*) }
  [ "$2" = 1 ] || continue
  if [ -z "$idle" ] || [ "${20}" -lt "$idle_start" ]; then idle=${d#/proc/}; idle_start=${20}; fi
done
round=0
while [ "$round" -lt 200 ]; do
  round=$((round + 1)); hit=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$p" in 1|"$me"|"$idle") continue ;; esac
    { read -r s < "$d/stat"; } 2>/dev/null || continue
    set -- ${s##*) }
    case "$1" in X) continue ;; Z) [ "${18}" -gt 1 ] || continue ;; esac  # a Z leader with live threads
    kill -9 "$p" 2>/dev/null && hit=1
  done
  [ -n "$hit" ] || break
done
"""
# Every command runs under this wrapper: `timeout -s KILL` runs the command in a process group
# of its own and kills it at the deadline; when the command returns (or is killed), the
# wrapper sweeps the container and exits with the command's status. Catchable signals are
# trapped (not ignored: children get default handlers back), so only SIGKILL ends the wrapper
# early; then its status is 128+9 and the backend runs the sweep as an exec of its own.
_EXEC_WRAPPER = (
    'trap : HUP INT QUIT TERM USR1 USR2 ALRM PIPE; exec 2>&1; t=$1; shift; timeout -s KILL "$t" "$@"; rc=$?; '
    + _SWEEP
    + "exit $rc"
)


class ImageMissingError(SandboxError):
    """The image is not on the engine. Not retryable: nothing is pulled during a run."""

    retryable = False


def connect(base_url: str | None = None, api_timeout_s: float = 120.0, max_connections: int = 256) -> Any:
    """A docker client that answered a ping, or SandboxError saying how to get one."""
    import docker

    where = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        if base_url:
            client = docker.DockerClient(base_url=base_url, timeout=int(api_timeout_s), max_pool_size=max_connections)
        else:
            client = docker.from_env(timeout=int(api_timeout_s), max_pool_size=max_connections)
        client.ping()
    except Exception as exc:
        raise SandboxError(
            f"no Docker engine answers at {where} ({exc.__class__.__name__}: {exc}); start one with "
            "`bash .ci/setup_docker.sh`, or point DOCKER_HOST at a remote engine"
        ) from exc
    return client


def _image_missing(image: str) -> ImageMissingError:
    """Runs never pull: a missing image is a set-up step left undone, said with the fix."""
    return ImageMissingError(
        f"image {image!r} is not on the engine and nothing is pulled during a run; build it first "
        "(`rollhub sandbox build-base` for rollhub/base:bookworm)"
    )


def _docker_errors() -> Any:
    import docker.errors

    return docker.errors


def _container_gone(exc: Exception) -> bool:
    return "No such container" in str(exc) or "is not running" in str(exc)


class SandboxConfigError(SandboxError):
    """The sandbox cannot be started as asked (e.g. a user the image lacks). Not retryable."""

    retryable = False


def _decode_stat(header: str | None) -> dict[str, Any]:
    if not header:
        return {}
    return json.loads(base64.b64decode(header))


def _quota_refused(exc: Exception) -> bool:
    """The engine's answer to `storage_opt size` on a driver that cannot enforce it."""
    text = str(exc).lower()
    return "storage-opt" in text or "storage opt" in text or "quota" in text


def _user_spec(requested: str, image_config: dict[str, Any]) -> str:
    """The user for `docker exec`: the image's sandbox user (label), else its default user,
    else root; or what `Limits.user` names."""
    if requested == "auto":
        labels = image_config.get("Labels") or {}
        requested = labels.get(LABEL_SANDBOX_USER) or image_config.get("User") or "root"
    if requested in ("root", "0", "root:root", ""):
        return "0:0"
    if requested.split(":")[0] == IDLE_USER.split(":")[0]:
        raise SandboxConfigError(f"uid {requested} is reserved for the sandbox's init and idle command")
    return requested


def _seed_from(record: dict[str, Any]) -> Seed:
    entries = record.get("entries")
    if entries is None and record["tar"]:  # a record cached before entries were counted
        entries = _tar_entries(record["tar"])
    return Seed(
        record["tar"],
        record["tmpfs_bytes"],
        record.get("uid", 0),
        record.get("gid", 0),
        record.get("mode", 0o755),
        entries or 0,
    )


def _tar_entries(path: str) -> int:
    """Members of a rebased seed tar besides the folder itself ("." carries only its owner
    and mode, which the tmpfs mount options already set)."""
    with tarfile.open(path, mode="r:") as archive:
        return sum(1 for member in archive if member.name not in (".", "./", ""))


def _load_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _passwd_entries(text: str) -> list[list[str]]:
    return [line.split(":") for line in text.splitlines() if line.count(":") >= 6]


@dataclass(frozen=True)
class Seed:
    """What a tmpfs-backed writable folder starts with: the image's content of that folder
    as a tar rebased on it (None: the image has no such folder), and the room it takes."""

    tar_path: str | None
    tmpfs_bytes: int
    uid: int = 0  # owner and mode of the folder itself (the tmpfs root gets them)
    gid: int = 0
    mode: int = 0o755
    #: files and folders inside; 0: nothing to copy in (an empty /tmp costs no archive call)
    entries: int = 0

    def mount_options(self, budget_bytes: int) -> str:
        return f"size={self.tmpfs_bytes + budget_bytes},uid={self.uid},gid={self.gid},mode={self.mode:o}"


@dataclass(frozen=True)
class SandboxUser:
    """Who commands run as: `spec` for the engine, and the ids and home folder read from the
    image's /etc/passwd (HOME of every command; files written land owned by uid:gid)."""

    spec: str = "0:0"
    uid: int = 0
    gid: int = 0
    home: str = "/root"


class DockerSandbox(Sandbox):
    def __init__(
        self, backend: DockerBackend, container_id: str, image: str, limits: Limits, user: SandboxUser | None = None
    ):
        self.backend = backend
        self.id = container_id
        self.image = image
        self.limits = limits
        self.user = user or SandboxUser()
        self.image_id = ""  # the image's id at start (the tag may be rebuilt meanwhile)
        self._closed = False
        self._oom_kills_seen = 0
        self.exec_mode = limits.exec_mode or backend.exec_mode
        # The persistent shell (exec_mode "persistent-shell"): None until started, and again
        # after it was lost; `_shell_unavailable` says why this sandbox uses docker exec instead.
        self._shell: PersistentShell | None = None
        self._shell_unavailable: str | None = None
        # One command at a time: the sweep after a command kills every process it did not
        # start itself, which would include a concurrent command's.
        self._exec_lock = threading.Lock()
        # Tmpfs disk budget: the root is read-only and these folders are volumes; the engine
        # only writes into a read-only container when the extraction folder is a volume.
        self.writable_dirs: tuple[str, ...] | None = None

    def __repr__(self) -> str:
        return f"DockerSandbox({self.id[:12]}, image={self.image!r})"

    # ----------------------------------------------------------------- async interface
    async def exec(
        self,
        cmd: str,
        timeout_s: float,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        *,
        user: str | None = None,
    ) -> ExecResult:
        """`user` (a name or "uid[:gid]", "root"): run this one command as another user than the
        sandbox's, through docker exec (the persistent shell runs as the sandbox's user). With no
        capabilities, root cannot write the sandbox user's files nor signal its processes, and
        the sandbox user cannot touch root's 0600/0700 files: what one leaves, the other's
        commands cannot rewrite (e.g. a grader's files next to the code under test)."""
        if not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s}")
        self._check_open()
        return await self.backend._run_blocking(self._exec_blocking, cmd, timeout_s, workdir, env, user)

    async def write_file(self, path: str, content: str | bytes) -> None:
        self._check_open()
        data = content.encode() if isinstance(content, str) else content
        base = self._extraction_base(path)
        archive = single_file_tar(path, data, uid=self.user.uid, gid=self.user.gid, base=base)
        await self.backend._run_blocking(self._put_archive, archive, base)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check_open()
        limit = self.backend.max_read_bytes if max_bytes is None else max_bytes
        return await self.backend._run_blocking(self._read_file_blocking, require_absolute(path), limit)

    async def copy_in(self, local_dir: str, dest: str) -> None:
        self._check_open()
        base = self._extraction_base(dest)
        archive = directory_tar(local_dir, dest, base=base)
        try:
            await self.backend._run_blocking(self._put_archive, archive, base)
        finally:
            archive.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.backend._run_blocking(self.backend._remove, self.id)
        except SandboxError:
            pass  # the backend is closed, and closing it removed every container it had
        self._release_shell_if_idle()

    def _release_shell_if_idle(self) -> None:
        """Close the shell's connection, unless a command is using it: that exec sees the
        end of the stream (the container is gone) and closes it itself."""
        if self._exec_lock.acquire(blocking=False):
            try:
                self._drop_shell()
            finally:
                self._exec_lock.release()

    # ----------------------------------------------------------------- blocking parts
    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{self!r} is closed")

    def _extraction_base(self, path: str) -> str:
        """Where an archive for `path` is extracted: '/', or with a tmpfs disk budget the
        writable folder holding `path` (outside them the root is read-only)."""
        path = require_absolute(path)
        for folder in self.writable_dirs or ():
            if path == folder or path.startswith(folder.rstrip("/") + "/"):
                return folder
        return "/"

    def _put_archive(self, archive: Any, base: str = "/") -> None:
        errors = _docker_errors()
        try:
            self.backend.api.put_archive(self.id, base, archive)
        except errors.NotFound as exc:
            raise SandboxError(f"{self!r} is gone: {exc}") from exc
        except errors.APIError as exc:
            if _container_gone(exc):
                raise SandboxError(f"{self!r} is gone: {exc}") from exc
            raise OSError(f"writing into {self!r} failed: {exc.explanation or exc}") from exc
        except Exception as exc:
            raise SandboxError(f"docker engine error writing into {self!r}: {exc}") from exc

    def _read_file_blocking(self, path: str, max_bytes: int) -> bytes:
        """Stat first (the archive API's header, before any byte of the body): directories,
        special files and files over `max_bytes` are refused without transferring them. The
        body is then read as a stream, so memory holds the file once."""
        errors = _docker_errors()
        api = self.backend.api
        response = None
        try:
            for _hop in range(2):  # a symlink: the engine reports its fully resolved target
                response = api._get(
                    api._url("/containers/{0}/archive", self.id),
                    params={"path": path},
                    stream=True,
                    headers={"Accept-Encoding": "identity"},
                )
                api._raise_for_status(response)
                stat = _decode_stat(response.headers.get("x-docker-container-path-stat"))
                target = stat.get("linkTarget") or ""
                if not target or target == path:
                    break
                response.close()
                response, path = None, target
            mode = int(stat.get("mode", 0))
            if mode & _GO_MODE_DIR:
                raise IsADirectoryError(f"{path} is a directory")
            if mode & _GO_MODE_NOT_REGULAR:
                raise FileNotFoundError(f"{path} is not a regular file")
            size = int(stat.get("size", 0))
            if size > max_bytes:
                raise FileTooLargeError(path, size, max_bytes)
            return first_file_from_tar(response.iter_content(1 << 16), max_bytes=max_bytes, path=path)
        except errors.NotFound as exc:
            if "No such container" in str(exc):
                raise SandboxError(f"{self!r} is gone: {exc}") from exc
            raise FileNotFoundError(f"{path} does not exist in {self!r}") from exc
        except (FileNotFoundError, IsADirectoryError, FileTooLargeError):
            raise
        except Exception as exc:
            raise SandboxError(f"docker engine error reading {path} from {self!r}: {exc}") from exc
        finally:
            if response is not None:
                response.close()

    def _exec_blocking(
        self, cmd: str, timeout_s: float, workdir: str | None, env: dict[str, str] | None, user: str | None = None
    ) -> ExecResult:
        with self._exec_lock:
            self._check_open()
            as_user = self._other_user(user)
            if as_user is not None:
                return self._exec_locked(cmd, timeout_s, workdir, env, as_user)
            if self.exec_mode == EXEC_PERSISTENT_SHELL:
                result = self._exec_in_shell(cmd, timeout_s, workdir, env)
                if result is not None:
                    return result
            return self._exec_locked(cmd, timeout_s, workdir, env)

    def _other_user(self, user: str | None) -> SandboxUser | None:
        """The user a command asked for when it is not the sandbox's own (None: the sandbox's)."""
        if user is None or user == "auto":
            return None
        spec = _user_spec(user, {})
        if spec == self.user.spec:
            return None
        try:
            other = self.backend._resolve_user(self.id, self.image_id or f"container:{self.id}", spec)
        except SandboxConfigError:
            raise
        except Exception as exc:
            self._raise_if_container_dead_or_unreachable()
            raise SandboxError(f"{self!r}: could not look up user {user!r}: {exc}") from exc
        return None if other.uid == self.user.uid and other.gid == self.user.gid else other

    # ----------------------------------------------------------------- persistent shell
    def _start_shell(self) -> PersistentShell | None:
        """Start this container's controller. None when the image cannot run it: this sandbox
        then uses docker exec. SandboxError when the container is dead or the engine gone."""
        if self._shell_unavailable is not None:
            return None
        try:
            self._shell = PersistentShell.start(
                self.backend.api, self.id, self.user.spec, {"HOME": self.user.home}, self.backend.shell_start_timeout_s
            )
        except Exception as exc:
            self._raise_if_container_dead_or_unreachable()
            self._shell_unavailable = f"{exc.__class__.__name__}: {exc}"
            self.backend._warn_no_shell(self.image, self._shell_unavailable)
            return None
        return self._shell

    def _drop_shell(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            shell.close()

    def _raise_if_container_dead_or_unreachable(self) -> None:
        try:
            self._raise_if_container_dead()
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxError(f"docker engine error in {self!r}: {exc}") from exc

    def _exec_in_shell(
        self, cmd: str, timeout_s: float, workdir: str | None, env: dict[str, str] | None
    ) -> ExecResult | None:
        """One command through the persistent shell; None when this sandbox has none (the
        caller then uses docker exec)."""
        argv = [*self.backend.shell, cmd]
        started = time.monotonic()
        deadline = started + timeout_s + self.backend.exec_grace_s
        for attempt in range(2):
            shell = self._shell or self._start_shell()
            if shell is None:
                return None
            buffer = HeadTailBuffer(self.backend.output_limit_chars)
            try:
                outcome = shell.run(argv, timeout_s, workdir, self._exec_env(env), buffer, deadline)
            except TimeoutError:
                # The controller enforces the timeout itself: it is stopped, or the engine is
                # wedged. As with docker exec, the sandbox is removed.
                self._drop_shell()
                self.backend._remove(self.id)
                self._closed = True
                raise SandboxError(
                    f"exec in {self!r} outlived its {timeout_s:g}s timeout by {self.backend.exec_grace_s:g}s; "
                    "sandbox removed"
                ) from None
            except (ShellLost, OSError) as exc:
                self._drop_shell()
                if self._closed:
                    raise SandboxError(f"{self!r} was closed while a command ran in it") from None
                self._raise_if_container_dead_or_unreachable()
                began = exc.started if isinstance(exc, ShellLost) else True  # unsure: never run it twice
                if not began:  # the controller was gone before the command began: send it again
                    if attempt == 0:
                        continue
                    raise SandboxError(f"{self!r}: its shell died twice before running a command") from None
                return self._shell_killed_by_command(buffer, started)
            except ShellProtocolError as exc:  # written into by the command's processes: its failure
                self._drop_shell()
                buffer.append(f"\nrollhub: the shell's stream was written into ({exc}); shell restarted\n".encode())
                return self._shell_killed_by_command(buffer, started)
            timed_out = outcome.timed_out
            oom_killed = outcome.exit_code == _SIGKILL_EXIT_CODE and not timed_out and self._new_oom_kill(outcome)
            output, truncated = buffer.text()
            return ExecResult(
                outcome.exit_code,
                output,
                timed_out=timed_out,
                duration_s=time.monotonic() - started,
                truncated=truncated,
                oom_killed=oom_killed,
            )
        return None  # not reached: the loop returns or raises

    def _shell_killed_by_command(self, buffer: HeadTailBuffer, started: float) -> ExecResult:
        """The command killed its controller (`kill -9 $PPID`, `kill -9 -1`): it is reported
        as killed, like a killed wrapper before; a new controller sweeps what it left."""
        duration_s = time.monotonic() - started
        oom_killed = self._saw_new_oom_kill()
        self._restart_shell_and_sweep()
        output, truncated = buffer.text()
        return ExecResult(_SIGKILL_EXIT_CODE, output, duration_s=duration_s, truncated=truncated, oom_killed=oom_killed)

    def _restart_shell_and_sweep(self) -> None:
        """A new controller, whose first job is the sweep of what the last command left
        (through a docker exec of the sweep when no controller can be had)."""
        shell = self._start_shell()
        if shell is not None:
            try:
                shell.sweep(time.monotonic() + self.backend.shell_start_timeout_s)
                return
            except Exception as exc:
                logger.warning("%r: the new shell could not sweep (%s); sweeping with docker exec", self, exc)
                self._drop_shell()
        self._sweep()

    def _new_oom_kill(self, outcome: Any) -> bool:
        if outcome.oom_kills is None:  # kernel without the counter: ask the engine
            return self._saw_new_oom_kill()
        new_kill = outcome.oom_kills > self._oom_kills_seen
        self._oom_kills_seen = outcome.oom_kills
        return new_kill

    def _exec_env(self, env: dict[str, str] | None, user: SandboxUser | None = None) -> dict[str, str]:
        return {"HOME": (user or self.user).home, **(env or {})}

    def _exec_locked(
        self,
        cmd: str,
        timeout_s: float,
        workdir: str | None,
        env: dict[str, str] | None,
        user: SandboxUser | None = None,
    ) -> ExecResult:
        errors = _docker_errors()
        user = user or self.user
        api = self.backend.api
        # `exec 2>&1` merges stderr into stdout inside the shell: Docker carries the two as
        # separate streams and does not keep their relative order. The wrapper (see
        # _EXEC_WRAPPER) sweeps away whatever the command left running.
        inner = [*self.backend.shell, f"exec 2>&1; {cmd}"]
        argv = ["sh", "-c", _EXEC_WRAPPER, "rollhub-exec", f"{timeout_s:g}", *inner]
        started = time.monotonic()
        try:
            exec_id = api.exec_create(
                self.id,
                argv,
                stdout=True,
                stderr=True,
                workdir=workdir,
                environment=self._exec_env(env, user),
                user=user.spec,
            )["Id"]
            stream = open_exec_stream(api, exec_id)
        except errors.APIError as exc:
            raise SandboxError(f"exec in {self!r} failed to start: {exc}") from exc
        except Exception as exc:
            raise SandboxError(f"docker engine error starting exec in {self!r}: {exc}") from exc
        buffer = HeadTailBuffer(self.backend.output_limit_chars)
        try:
            stream.read_until_eof(buffer, deadline=started + timeout_s + self.backend.exec_grace_s)
        except TimeoutError:
            # The in-container `timeout` should have ended it long ago: the container or the
            # engine is wedged. Remove it so the blocked read (and the thread) is released.
            self.backend._remove(self.id)
            self._closed = True
            raise SandboxError(
                f"exec in {self!r} outlived its {timeout_s:g}s timeout by {self.backend.exec_grace_s:g}s; "
                "sandbox removed"
            ) from None
        except OSError as exc:
            raise SandboxError(f"lost the exec stream of {self!r}: {exc}") from exc
        finally:
            stream.close()
        duration_s = time.monotonic() - started
        if self._closed:
            raise SandboxError(f"{self!r} was closed while a command ran in it")
        try:
            exit_code = self._exit_code(exec_id)
            timed_out = exit_code in _TIMEOUT_EXIT_CODES and duration_s >= timeout_s
            oom_killed = exit_code == _SIGKILL_EXIT_CODE and not timed_out and self._saw_new_oom_kill()
            if exit_code >= 128:  # the wrapper itself may have been killed before its sweep
                self._sweep(user)
        except SandboxError:
            raise
        except Exception as exc:  # the engine lost the exec or the container under us
            raise SandboxError(
                f"{self!r}: could not read the exec's outcome ({exc.__class__.__name__}: {exc})"
            ) from exc
        output, truncated = buffer.text()
        return ExecResult(
            exit_code, output, timed_out=timed_out, duration_s=duration_s, truncated=truncated, oom_killed=oom_killed
        )

    def _exit_code(self, exec_id: str) -> int:
        """The exec's exit status; SandboxError when the container died under it."""
        api = self.backend.api
        for _ in range(200):  # the stream can close a moment before the exit is recorded
            info = api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                break
            time.sleep(0.005)
        code = info.get("ExitCode")
        if code is None or code == _SIGKILL_EXIT_CODE or code < 0:
            self._raise_if_container_dead()
        if code is None:
            raise SandboxError(f"exec in {self!r} ended without an exit status")
        return int(code)

    def _raise_if_container_dead(self) -> None:
        errors = _docker_errors()
        try:
            state = self.backend.api.inspect_container(self.id)["State"]
        except errors.NotFound as exc:
            raise SandboxError(f"{self!r} disappeared during exec") from exc
        if not state.get("Running") or state.get("Status") in ("removing", "dead", "exited"):
            reason = " (OOM-killed)" if state.get("OOMKilled") else ""
            raise SandboxError(f"{self!r} died during exec{reason}: exit {state.get('ExitCode')}")

    def _sweep(self, user: SandboxUser | None = None) -> None:
        """Kill every process the last command left (the wrapper's sweep, as its own exec, as
        the user the command ran as: another user's processes are out of its reach)."""
        api = self.backend.api
        spec = (user or self.user).spec
        exec_id = api.exec_create(self.id, ["sh", "-c", _SWEEP], stdout=True, stderr=True, user=spec)["Id"]
        api.exec_start(exec_id)

    def _saw_new_oom_kill(self) -> bool:
        """Whether the container's cgroup counted an OOM kill since we last looked: that is
        what tells a memory-limit kill apart from any other SIGKILL."""
        api = self.backend.api
        try:
            exec_id = api.exec_create(self.id, ["sh", "-c", _OOM_COUNTER_PROBE], stdout=True, stderr=False)["Id"]
            raw = api.exec_start(exec_id)
        except Exception as exc:
            logger.debug("OOM probe failed in %r: %s", self, exc)
            return bool(api.inspect_container(self.id)["State"].get("OOMKilled"))
        match = _OOM_KILL_LINE.search(raw or b"")
        if not match:  # kernel without the counter: fall back to the engine's flag
            return bool(api.inspect_container(self.id)["State"].get("OOMKilled"))
        count = int(match.group(1))
        new_kill = count > self._oom_kills_seen
        self._oom_kills_seen = count
        return new_kill


class DockerBackend(SandboxBackend):
    """Starts containers for one run; removes all of them on `close()` and at process exit."""

    def __init__(
        self,
        *,
        run_id: str | None = None,
        output_limit_chars: int = 10_000,
        shell: tuple[str, ...] = ("bash", "-c"),
        exec_grace_s: float = 10.0,
        exec_mode: str = EXEC_PERSISTENT_SHELL,
        shell_start_timeout_s: float = 30.0,
        api_timeout_s: float = 120.0,
        max_threads: int = 256,
        base_url: str | None = None,
        labels: dict[str, str] | None = None,
        collect_orphans: bool = False,
        max_concurrent_starts: int = 16,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        disk_mode: str = "auto",
        seed_cache_dir: str | None = None,
    ):
        """`collect_orphans=True` first removes containers left by dead runs on this host
        (the start-up sweep; the same as `rollhub sandbox gc`). `max_concurrent_starts`
        caps creates in flight on this backend, whoever calls it: dockerd gets slower, not
        faster, when flooded with starts (a `SandboxPool` can throttle further).

        `max_read_bytes`: `read_file` refuses larger files (FileTooLargeError) before any
        transfer. `disk_mode` says how `Limits.disk_mb` is enforced: "storage-opt" (the
        storage driver's quota), "tmpfs" (read-only root, size-limited tmpfs volumes for the
        writable folders, seeded from the image; the seeds are cached in `seed_cache_dir`),
        or "auto": storage-opt where the driver supports it, else tmpfs.

        `exec_mode`: how commands run in sandboxes whose `Limits.exec_mode` is None:
        "persistent-shell" (one controller per container; a few ms per command) or
        "docker-exec" (one `docker exec` per command, ~100 ms). `shell_start_timeout_s`
        bounds the controller's start before the sandbox falls back to docker exec."""
        if max_concurrent_starts < 1:
            raise ValueError(f"max_concurrent_starts must be at least 1, got {max_concurrent_starts}")
        if exec_mode not in EXEC_MODES:
            raise ValueError(f"exec_mode must be one of {', '.join(EXEC_MODES)}, got {exec_mode!r}")
        if disk_mode not in ("auto", DISK_STORAGE_OPT, DISK_TMPFS):
            raise ValueError(f"disk_mode must be auto, {DISK_STORAGE_OPT} or {DISK_TMPFS}, got {disk_mode!r}")
        self.max_read_bytes = max_read_bytes
        self.disk_mode = disk_mode
        self._quota_supported: bool | None = None if disk_mode == "auto" else disk_mode == DISK_STORAGE_OPT
        self.seed_cache_dir = seed_cache_dir or os.path.expanduser("~/.cache/rollhub/sandbox-seeds")
        self._seed_locks: dict[str, threading.Lock] = {}
        self._users: dict[tuple[str, str], SandboxUser] = {}
        self.client = connect(base_url, api_timeout_s, max_connections=max_threads)
        self.api = self.client.api
        self.base_url = base_url
        self.run_id = run_id or ownership.new_run_id()
        self.output_limit_chars = output_limit_chars
        self.shell = tuple(shell)
        self.exec_grace_s = exec_grace_s
        self.exec_mode = exec_mode
        self.shell_start_timeout_s = shell_start_timeout_s
        self._images_without_shell: set[str] = set()
        self.extra_labels = dict(labels or {})
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="rollhub-docker")
        self._live: dict[str, DockerSandbox] = {}
        self._lock = threading.Lock()
        self._starts_in_flight = 0
        self._start_slots = threading.BoundedSemaphore(max_concurrent_starts)  # works across event loops
        self._closed = False
        exit_cleanup.register(self)
        if collect_orphans:
            removed = reaper.collect_garbage(self.api)
            if removed:
                logger.warning("removed %d orphaned rollhub containers left by dead runs", len(removed))

    def __repr__(self) -> str:
        return f"DockerBackend(run_id={self.run_id!r}, live={len(self._live)})"

    @property
    def live_count(self) -> int:
        return len(self._live)

    def _warn_no_shell(self, image: str, reason: str) -> None:
        with self._lock:
            if image in self._images_without_shell:
                return
            self._images_without_shell.add(image)
        logger.warning(
            "sandboxes of %s run each command through docker exec (~100 ms; the persistent shell could not "
            "start: %s). Images need a Python 3 at /usr/bin/python3 or on PATH for it",
            image,
            reason,
        )

    async def _run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise SandboxError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def start(
        self, image: str, limits: Limits = Limits(), *, labels: dict[str, str] | None = None
    ) -> DockerSandbox:
        if self._closed or self._executor is None:
            raise SandboxError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        starting = loop.run_in_executor(
            self._executor, functools.partial(self._start_blocking, image, limits, labels or {})
        )
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The caller gave up (e.g. a straggler cancelled), but the worker thread keeps
            # starting the container: remove it as soon as it exists, not at the end of the run.
            starting.add_done_callback(self._remove_abandoned)
            raise

    def _remove_abandoned(self, starting: asyncio.Future[DockerSandbox]) -> None:
        if starting.cancelled() or starting.exception() is not None:
            return
        box = starting.result()
        box._closed = True
        executor = self._executor
        if executor is not None:  # else close() has removed it with everything else
            executor.submit(self._remove, box.id)
        box._release_shell_if_idle()

    def _start_blocking(self, image: str, limits: Limits, labels: dict[str, str]) -> DockerSandbox:
        with self._lock:
            self._starts_in_flight += 1
        try:
            with self._start_slots:
                box = self._create_and_start(image, limits, labels)
            # Outside the slot: the slot throttles creates on the engine, and a shell's start
            # is an exec (cheap for dockerd) plus a Python start in the container.
            self._start_shell_of(box)
            return box
        finally:
            with self._lock:
                self._starts_in_flight -= 1

    # ----------------------------------------------------------------- hardening
    def disk_budget_mode(self) -> str:
        """How `Limits.disk_mb` is enforced on this engine: "storage-opt" or "tmpfs"."""
        if self._quota_supported is None:
            info = self.api.info()
            driver = info.get("Driver", "")
            backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
            # overlay2 quotas need xfs mounted with pquota; a failed create tells us the rest.
            self._quota_supported = driver in _QUOTA_DRIVERS or (driver == "overlay2" and backing == "xfs")
        return DISK_STORAGE_OPT if self._quota_supported else DISK_TMPFS

    def _inspect_image(self, image: str) -> dict[str, Any]:
        errors = _docker_errors()
        try:
            return self.api.inspect_image(image)
        except errors.ImageNotFound as exc:
            raise _image_missing(image) from exc
        except Exception as exc:
            raise SandboxError(f"could not inspect image {image!r}: {exc}") from exc

    def _host_config(
        self, limits: Limits, writable: dict[str, str] | None, image_config: dict[str, Any]
    ) -> dict[str, Any]:
        """The container's HostConfig; `writable` maps the tmpfs folders to their mount
        options (size, owner, mode) when the disk budget is enforced with tmpfs, else None."""
        import docker.types

        ulimits = [docker.types.Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile)]
        if limits.fsize_mb is not None:
            fsize = limits.fsize_mb * 1024 * 1024
            ulimits.append(docker.types.Ulimit(name="fsize", soft=fsize, hard=fsize))
        if limits.nproc is not None:
            ulimits.append(docker.types.Ulimit(name="nproc", soft=limits.nproc, hard=limits.nproc))
        mounts = None
        if writable is not None:
            mounts = [
                docker.types.Mount(
                    target=path,
                    source=None,
                    type="volume",
                    no_copy=True,
                    driver_config=docker.types.DriverConfig(
                        "local", {"type": "tmpfs", "device": "tmpfs", "o": options}
                    ),
                )
                for path, options in sorted(writable.items())
            ]
        quota = writable is None and limits.disk_mb
        # tmpfs pages a command writes are charged to its container: with a tmpfs disk budget
        # the files get `disk_mb` on top of the processes' `memory_mb`.
        memory_mb = limits.memory_mb + (limits.disk_mb or 0) if writable is not None else limits.memory_mb
        return self.api.create_host_config(
            init=True,
            network_mode="bridge" if limits.network else "none",
            mem_limit=f"{memory_mb}m",
            memswap_limit=f"{memory_mb}m",  # no swap: the limit is the limit
            nano_cpus=int(limits.cpus * 1e9),
            pids_limit=limits.pids,
            storage_opt={"size": f"{limits.disk_mb}M"} if quota else None,
            cap_drop=["ALL"],
            cap_add=list(limits.cap_add) or None,
            security_opt=["no-new-privileges"],
            ulimits=ulimits,
            # Nothing reads the container's log, and a root command could fill the host's
            # disk through it (writing to /proc/1/fd/1): no log at all.
            log_config=docker.types.LogConfig(type="none"),
            oom_score_adj=SANDBOX_OOM_SCORE_ADJ,
            read_only=writable is not None,
            mounts=mounts,
        )

    def _writable_dirs(self, limits: Limits, image_config: dict[str, Any]) -> list[str]:
        dirs = [require_absolute(path) for path in limits.writable_dirs]
        workdir = image_config.get("WorkingDir") or ""
        if workdir and workdir != "/":
            dirs.append(require_absolute(workdir))
        # A folder inside another writable one is already covered (and a volume inside a
        # volume would hide the seed of the outer one).
        unique = sorted(set(dirs))
        return [d for d in unique if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in unique)]

    def _create_and_start(self, image: str, limits: Limits, labels: dict[str, str]) -> DockerSandbox:
        errors = _docker_errors()
        image_info = self._inspect_image(image)
        image_config = image_info.get("Config") or {}
        user_spec = _user_spec(limits.user, image_config)
        seeds: dict[str, Seed] = {}
        writable: dict[str, str] | None = None
        try:
            if limits.disk_mb and self.disk_budget_mode() == DISK_TMPFS:
                seeds = self._seeds(image, image_info["Id"], self._writable_dirs(limits, image_config))
                budget = limits.disk_mb * 1024 * 1024
                writable = {path: seed.mount_options(budget) for path, seed in seeds.items()}
        except Exception as exc:
            raise SandboxError(f"could not prepare the tmpfs disk budget for {image!r}: {exc}") from exc
        host_config = self._host_config(limits, writable, image_config)
        init_user = "0:0" if limits.cap_add else IDLE_USER
        all_labels = {**self.extra_labels, **labels, **ownership.owner_labels(self.run_id)}
        try:
            created = self.api.create_container(
                image, command=IDLE_COMMAND, labels=all_labels, host_config=host_config, detach=True, user=init_user
            )
        except errors.ImageNotFound as exc:
            raise _image_missing(image) from exc
        except Exception as exc:
            if limits.disk_mb and writable is None and self.disk_mode == "auto" and _quota_refused(exc):
                logger.info("the engine refuses storage_opt size (%s); disk budgets use tmpfs from now on", exc)
                self._quota_supported = False
                return self._create_and_start(image, limits, labels)
            hint = (
                " (disk_mb needs overlay2 on xfs with pquota, or devicemapper; or DockerBackend(disk_mode='tmpfs'))"
                if limits.disk_mb and "storage" in str(exc).lower()
                else ""
            )
            raise SandboxError(f"could not create a container from {image!r}: {exc}{hint}") from exc
        container_id = created["Id"]
        try:
            self.api.start(container_id)
            user = self._resolve_user(container_id, image_info["Id"], user_spec)
            for path, seed in seeds.items():
                self._plant_seed(container_id, path, seed)
        except Exception as exc:
            self._remove(container_id)
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"could not start a container from {image!r}: {exc}") from exc
        box = DockerSandbox(self, container_id, image, limits, user)
        box.image_id = image_info["Id"]
        box.writable_dirs = tuple(sorted(writable)) if writable is not None else None
        with self._lock:
            closed = self._closed
            if not closed:
                self._live[container_id] = box
        if closed:  # the run ended while we were starting: do not leak this one
            self._remove(container_id)
            raise SandboxError(f"{self!r} closed while a sandbox was starting")
        return box

    def _start_shell_of(self, box: DockerSandbox) -> None:
        """Start a new sandbox's persistent shell now, so that its first command is as quick
        as the rest (an image that cannot run it falls back to docker exec)."""
        if box.exec_mode != EXEC_PERSISTENT_SHELL:
            return
        try:
            with box._exec_lock:
                if not box._closed:
                    box._start_shell()
        except Exception as exc:
            box._closed = True
            self._remove(box.id)
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"could not start the shell of a container from {box.image!r}: {exc}") from exc

    def _read_small_file(self, container_id: str, path: str, max_bytes: int = 1 << 20) -> bytes | None:
        """A small file of a container through the archive API; None when it does not exist."""
        errors = _docker_errors()
        try:
            stream, _stat = self.api.get_archive(container_id, path, chunk_size=1 << 16)
            return first_file_from_tar(stream, max_bytes=max_bytes, path=path)
        except errors.NotFound:
            return None

    def _resolve_user(self, container_id: str, image_id: str, spec: str) -> SandboxUser:
        """uid, gid and home of `spec` ("name[:group]" or "uid[:gid]") from the container's
        /etc/passwd and /etc/group (cached by image)."""
        key = (image_id, spec)
        user = self._users.get(key)
        if user is None:
            user = self._users[key] = self._read_user(container_id, spec)
        return user

    def _read_user(self, container_id: str, spec: str) -> SandboxUser:
        name, _, group = spec.partition(":")
        passwd = _passwd_entries((self._read_small_file(container_id, "/etc/passwd") or b"").decode("utf-8", "replace"))
        entry = next((e for e in passwd if (e[2] if name.isdigit() else e[0]) == name), None)
        if entry is None and not name.isdigit():
            raise SandboxConfigError(f"user {name!r} is not in the image's /etc/passwd (Limits.user={spec!r})")
        uid = int(name) if name.isdigit() else int(entry[2])  # type: ignore[index]
        gid = int(entry[3]) if entry else uid
        home = entry[5] if entry and entry[5] else ("/root" if uid == 0 else "/")
        if group:
            if group.isdigit():
                gid = int(group)
            else:
                groups = (self._read_small_file(container_id, "/etc/group") or b"").decode("utf-8", "replace")
                match = next((g for g in groups.splitlines() if g.split(":")[0] == group), None)
                if match is None:
                    raise SandboxConfigError(f"group {group!r} is not in the image's /etc/group (Limits.user={spec!r})")
                gid = int(match.split(":")[2])
        return SandboxUser(spec=spec, uid=uid, gid=gid, home=home)

    def _seeds(self, image: str, image_id: str, dirs: list[str]) -> dict[str, Seed]:
        """The image's content of each writable folder, as tars cached on the host by image id
        (taken once from a created, never started, helper container). Folders that are not
        folders in the image (a symlink, a file) are left out: they stay read-only."""
        key = image_id.split(":")[-1]
        folder = os.path.join(self.seed_cache_dir, key)
        with self._lock:
            lock = self._seed_locks.setdefault(key, threading.Lock())
        seeds: dict[str, Seed | None] = {}
        with lock:
            missing = []
            for path in dirs:
                meta = os.path.join(folder, hashlib.sha256(f"v2:{path}".encode()).hexdigest()[:16] + ".json")
                recorded = _load_json(meta)
                if recorded is None or (recorded.get("tar") and not os.path.exists(recorded["tar"])):
                    missing.append((path, meta))
                else:
                    seeds[path] = None if recorded.get("skip") else _seed_from(recorded)
            if missing:
                os.makedirs(folder, exist_ok=True)
                helper = self.api.create_container(
                    image,
                    command=["true"],
                    labels={**ownership.owner_labels(self.run_id), "rollhub.role": "seed-helper"},
                    host_config=self.api.create_host_config(network_mode="none"),
                )["Id"]
                try:
                    for path, meta in missing:
                        seeds[path] = self._take_seed(helper, path, meta)
                finally:
                    self._remove(helper)
        return {path: seed for path, seed in seeds.items() if seed is not None}

    def _take_seed(self, helper: str, path: str, meta: str) -> Seed | None:
        errors = _docker_errors()
        record: dict[str, Any]
        try:
            stream, stat = self.api.get_archive(helper, path, chunk_size=1 << 16)
        except errors.NotFound:
            record = {"tar": None, "tmpfs_bytes": 0, "mode": 0o1777}  # a new folder: like /tmp
        else:
            if not int(stat.get("mode", 0)) & _GO_MODE_DIR or stat.get("linkTarget"):
                for _ in stream:
                    pass
                record = {"skip": True}
            else:
                tar_path = meta[: -len(".json")] + ".tar"
                with tempfile.NamedTemporaryFile(dir=os.path.dirname(meta), delete=False) as out:
                    rebased = rebase_tar(stream, out)
                os.replace(out.name, tar_path)
                record = {"tar": tar_path, **dataclasses.asdict(rebased), "entries": _tar_entries(tar_path)}
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(meta), delete=False) as out:
            json.dump(record, out)
        os.replace(out.name, meta)
        return None if record.get("skip") else _seed_from(record)

    def _plant_seed(self, container_id: str, path: str, seed: Seed) -> None:
        """Copy a folder's image content into its tmpfs: one archive call each, the costly
        part of a tmpfs-budget start (dockerd extracts through a helper process), so
        folders with nothing inside are left to the mount's own owner and mode."""
        if seed.tar_path is None or not seed.entries:
            return
        with open(seed.tar_path, "rb") as handle:
            self.api.put_archive(container_id, path, handle)

    def _remove(self, container_id: str) -> None:
        reaper.remove_containers(self.api, [container_id])
        with self._lock:
            self._live.pop(container_id, None)

    async def close(self) -> None:
        """Remove every container of this run (also ones whose start raced with close)."""
        if self._executor is None:
            return
        self._closed = True
        await self._run_blocking(self._remove_everything, self.api)
        exit_cleanup.unregister(self)
        executor, self._executor = self._executor, None
        executor.shutdown(wait=False)
        self.client.close()

    def _remove_everything(self, api: Any) -> None:
        with self._lock:
            known = list(self._live)
            boxes = list(self._live.values())
            self._live.clear()
        reaper.remove_containers(api, known, parallelism=16)
        for box in boxes:
            box._closed = True
            box._release_shell_if_idle()
        reaper.remove_run(api, self.run_id)

    def cleanup_now(self) -> None:
        """Synchronous removal for atexit and signal handlers: a fresh client, so a request
        in flight on another thread cannot block it."""
        self._closed = True
        if not self._live and not self._starts_in_flight:
            return  # nothing of ours can exist: do not even touch the engine
        try:
            client = connect(self.base_url, api_timeout_s=30.0, max_connections=16)
        except SandboxError as exc:
            logger.warning(
                "%r: cannot reach the engine to remove %d sandbox(es): %s; run `rollhub sandbox gc` later",
                self,
                len(self._live),
                exc,
            )
            return
        try:
            self._remove_everything(client.api)
        finally:
            client.close()


def docker_for_command() -> DockerBackend:
    """The Docker engine for a command line: a one-line user error with the fix when it is not reachable."""
    from rollhub.core.errors import UserError
    from rollhub.sandbox.base import SandboxError

    try:
        return DockerBackend()
    except SandboxError as exc:
        raise UserError(f"{exc} (start dockerd, or set DOCKER_HOST)") from None
