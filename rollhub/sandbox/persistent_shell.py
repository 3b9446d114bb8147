"""One long-lived process per container that runs the sandbox's commands.

A `docker exec` costs what runc costs to enter the container (about 100 ms on a loaded
2-core host), and a SWE episode makes dozens of them. Instead, each container gets one
controller process, started once through `docker exec` with stdin attached; commands are
sent to it over that stdin and their output and exit status come back framed over its
stdout. A round trip then costs a fork and an exec of the shell inside the container.

Semantics are those of the `docker exec` path (`DockerSandbox`'s "docker-exec" mode):
- each command is a fresh `bash -c CMD` (the backend's `shell`): nothing carries over from
  one command to the next (cwd, variables, functions), as before;
- stdout and stderr share one pipe (interleaved in order), stdin is /dev/null, so a command
  that reads stdin sees end of file and can never read the controller's requests;
- a command runs in a session and process group of its own; at its deadline the whole
  group is SIGKILLed and the result says timed out (exit 137, as `timeout -s KILL` gives);
- when the command returns (or is killed), every process it left in the container is
  killed (the same sweep as before, done in-process: no fork, a /proc scan): every thread
  group but the init, the idle command and the controller, whatever its process group or
  session, including one whose leader thread exited while other threads run (a zombie
  leader: /proc shows it as Z, yet it runs);
- env: the container's environment, HOME of the sandbox user, then the caller's `env`;
  workdir: the caller's, else the image's working directory; a missing one is exit 126.
  The controller itself runs in `/` and changes directory for each spawn, so removing any
  folder (the image's working directory included) fails only the commands run there.

Framing, and why a command cannot forge it. The command never writes to the controller's
stdout: its output goes to a pipe the controller reads, and the controller forwards it as
length-prefixed frames (1 type byte, 4 length bytes, payload, 16-byte tag), so no byte
sequence in the output can end a frame early or look like an exit frame. The controller
makes itself non-dumpable (`PR_SET_DUMPABLE 0`) before anything else, so a command running
as the same uid without CAP_SYS_PTRACE (every capability is dropped) can neither open
/proc/<controller>/fd/* to write into the stream or read from its stdin, nor read its
memory, nor ptrace it. What it can do is kill or stop the controller: a killed controller
is seen as end of stream before the exit frame; the command is reported as killed (137),
a new controller is started and the sandbox carries on. A stopped one runs into the
host's outer deadline, as a stopped `timeout` did before.

A restart that cannot be fed. Between its exec and its prctl a new controller is dumpable,
and what the last command left may open its stdin and stdout through /proc then. So the
controller sweeps first (after the prctl, before reading or writing anything: every such
holder dies), then says it is ready; only then does the host send a fresh random key over
stdin, and every later frame carries a keyed BLAKE2b tag over its sequence number, header
and payload. Bytes written into the stream by anyone else (the engine's own error text
too: "OCI runtime exec failed ...") fail the check and are never interpreted: during the
handshake the start is tried once more (the writer is dead by then); during a command it
is that command's failure (killed, 137, with a note), and the shell is restarted. Never an
infrastructure error: what a command does to its container is the command's outcome.

Host → controller: 4-byte big-endian length, then the 32-byte key (once), then JSON
requests `{"token", "argv", "timeout_s", "workdir", "env"}` or `{"token", "sweep": true}`.
Controller → host frames: `R` ready (the only one without a tag), `H` hello (JSON: pid),
`S` the command started (fork done), `O` output bytes, `X` exit (JSON: token, exit_code,
timed_out, oom_kills).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Any

from rollhub.sandbox.exec_stream import ExecStream, open_exec_stream
from rollhub.sandbox.output_buffer import HeadTailBuffer

logger = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct(">cI")
REQUEST_HEADER = struct.Struct(">I")
SEQ = struct.Struct(">Q")
#: Bytes of the per-start key the host sends once the controller is non-dumpable, and of each frame's tag.
KEY_BYTES = 32
TAG_BYTES = 16
#: The one unauthenticated frame (ready, before the key) is small.
MAX_READY_BYTES = 4096
#: Frames from the controller are at most this big (output is sent in 64 KiB chunks).
MAX_FRAME_BYTES = 1 << 20
#: Largest request (command text plus env) the controller accepts.
MAX_REQUEST_BYTES = 16 << 20

# The controller, run with `python3 -I -S -c`. Written for any Python 3.6+ an image may hold
# (no f-strings, no walrus), standard library only. It is not a secret: the only secret is
# the key, which lives in its memory (unreadable: it is non-dumpable).
CONTROLLER_SOURCE = r"""
import ctypes, os, sys

def become_non_dumpable():
    # First of all, before any other import: from here on no process of the sandbox can open
    # /proc/<this>/fd/*, read its memory or ptrace it. Nothing has been read yet.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
            raise OSError(ctypes.get_errno(), "prctl")
    except Exception as exc:
        os.write(2, ("rollhub-shell: cannot make itself non-dumpable: %r\n" % (exc,)).encode())
        os._exit(3)

become_non_dumpable()

import hashlib, json, select, signal, struct, time

def setup():
    def ignore(signum, frame):
        pass
    for name in ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM"):
        signal.signal(getattr(signal, name), ignore)

def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]

# Every frame after the ready frame carries a tag: keyed BLAKE2b over its sequence number,
# header and payload, with the key the host sent after this process became non-dumpable.
# Bytes anyone else writes into the stream fail the check (and cannot be replayed).
mac_key = None
mac_seq = 0

def frame(kind, payload):
    global mac_seq
    data = struct.pack(">cI", kind, len(payload)) + payload
    if mac_key is not None:
        data += hashlib.blake2b(struct.pack(">Q", mac_seq) + data, key=mac_key, digest_size=16).digest()
        mac_seq += 1
    write_all(1, data)

def read_exact(size):
    chunks, left = [], size
    while left:
        chunk = os.read(0, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)

# /proc through a descriptor opened at start: the sweep must work whatever a command did to
# the paths (`chmod 000 /` makes every absolute path unreachable for a root without caps).
proc_fd = os.open("/proc", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))

def proc_stat(pid):
    fd = os.open("%d/stat" % pid, os.O_RDONLY, dir_fd=proc_fd)
    try:
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    return raw[raw.rindex(b")") + 2:].split()

def pids():
    return [int(name) for name in os.listdir(proc_fd) if name.isdigit()]

def find_idle():
    # The idle command: the oldest child of the init (orphans adopted later are younger).
    best, best_start = None, None
    for pid in pids():
        try:
            fields = proc_stat(pid)
        except (OSError, ValueError):
            continue
        if fields[1] != b"1":
            continue
        started = int(fields[19])
        if best is None or started < best_start:
            best, best_start = pid, started
    return best

def sweep(keep):
    # Kill every process but the init, the idle command and this one, whatever its process
    # group or session (setsid daemons, double-forked orphans, thread groups whose leader
    # exited); repeat until a round kills nothing (a fork bomb forks while being killed).
    for _round in range(200):
        hit = False
        for pid in pids():
            if pid in keep:
                continue
            try:
                fields = proc_stat(pid)
                # A zombie is skipped only when its whole thread group is dead: a leader that
                # ended with pthread_exit / SYS_exit while other threads run shows as Z too.
                if fields[0] == b"X" or (fields[0] == b"Z" and int(fields[17]) <= 1):
                    continue
                os.kill(pid, signal.SIGKILL)
                hit = True
            except (OSError, ValueError, IndexError):
                pass
        if not hit:
            return

def oom_kills():
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as handle:
                for line in handle:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None

DEFAULT_SIGNALS = [getattr(signal, name) for name in (
    "SIGPIPE", "SIGXFSZ", "SIGXFZ", "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)]

def resolve(program, env):
    if "/" in program:
        return program
    for folder in env.get("PATH", os.defpath).split(":"):
        candidate = os.path.join(folder or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise OSError(2, "command not found")

def spawn(argv, env, write_end, devnull):
    # posix_spawn (vfork underneath) costs half of what fork costs from Python; the child
    # gets a session of its own, default signal handlers, /dev/null as stdin and the pipe
    # as stdout and stderr. fork and exec where posix_spawn lacks setsid (Python < 3.8).
    program = resolve(argv[0], env)
    if hasattr(os, "posix_spawn"):
        try:
            return os.posix_spawn(program, argv, env, setsid=True, setsigdef=DEFAULT_SIGNALS, file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, write_end, 1),
                (os.POSIX_SPAWN_DUP2, write_end, 2)])
        except (TypeError, NotImplementedError, AttributeError):
            pass
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            for signum in DEFAULT_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            os.dup2(devnull, 0)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            os.execve(program, argv, env)
        finally:
            os._exit(127)
    return pid

def refuse(token, exit_code, message, started=False):
    if not started:
        frame(b"S", b"")
    frame(b"O", message.encode("utf-8", "replace"))
    frame(b"X", json.dumps({"token": token, "exit_code": exit_code, "timed_out": False, "oom_kills": None}).encode())

def run(request, base_env, keep, devnull):
    env = dict(base_env)
    env.update(request.get("env") or {})
    timeout_s = float(request["timeout_s"])
    # The controller is single-threaded: it changes its own cwd for the spawn, every time
    # (the command's folder may have been removed or replaced since). It never needs a
    # working directory of its own, so a removed one cannot stop it.
    workdir = request.get("workdir") or home_dir
    try:
        os.chdir(workdir)
    except OSError as exc:
        return refuse(request["token"], 126, "chdir to %s failed: %s\n" % (workdir, exc.strerror))
    read_end, write_end = os.pipe()
    started = time.monotonic()
    frame(b"S", b"")  # before the spawn: the command may kill this process at once
    try:
        pid = spawn(request["argv"], env, write_end, devnull)
    except (OSError, ValueError, TypeError) as exc:  # not found; a NUL byte or a bad value in argv or env
        os.close(read_end)
        os.close(write_end)
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        return refuse(request["token"], 127, "%s: %s\n" % (request["argv"][0], reason), started=True)
    os.close(write_end)
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
    poller = select.poll()
    poller.register(read_end, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    deadline = started + timeout_s
    status, timed_out, reading = None, False, True
    while status is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            timed_out = True
            status = os.waitpid(pid, 0)[1]
            break
        wait_ms = int(min(remaining, 60.0) * 1000) + 1
        if pidfd is None:  # no exit notification: look at the child every 5 ms
            wait_ms = min(wait_ms, 5)
        for fd, _events in poller.poll(wait_ms):
            if fd == read_end:
                data = os.read(read_end, 65536)
                if data:
                    frame(b"O", data)
                else:
                    poller.unregister(read_end)
                    reading = False
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = code
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    sweep(keep)
    if reading:  # every writer is dead now: read what is left, for a moment at most
        until = time.monotonic() + 1.0
        drain = select.poll()
        drain.register(read_end, select.POLLIN)
        while time.monotonic() < until and drain.poll(max(1, int((until - time.monotonic()) * 1000))):
            data = os.read(read_end, 65536)
            if not data:
                break
            frame(b"O", data)
    os.close(read_end)
    if pidfd is not None:
        os.close(pidfd)
    if os.WIFSIGNALED(status):
        exit_code = 128 + os.WTERMSIG(status)
    else:
        exit_code = os.WEXITSTATUS(status)
    if timed_out:
        exit_code = 137
    reply = {"token": request["token"], "exit_code": exit_code, "timed_out": timed_out, "oom_kills": None}
    if exit_code == 137 and not timed_out:
        reply["oom_kills"] = oom_kills()
    frame(b"X", json.dumps(reply).encode())

def main():
    global home_dir, mac_key
    setup()
    base_env = dict(os.environ)
    base_env.pop("PWD", None)  # the launching sh's; the command's shell sets its own
    if sys.argv[1:2] == ["unset"]:  # Python may add LC_CTYPE (locale coercion): undo it
        base_env.pop("LC_CTYPE", None)
    home_dir = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else "/"  # where a command without workdir runs
    devnull = os.open(os.devnull, os.O_RDWR)
    keep = set([1, os.getpid(), find_idle()])
    # Whatever a command left (one that killed the last controller may still run) could have
    # opened this process's stdin or stdout before it became non-dumpable: it dies before
    # anything is read or written. Even when the host has already given up on this start (it
    # saw such writes): the next controller must not meet the writer again.
    sweep(keep)
    frame(b"R", json.dumps({"pid": os.getpid()}).encode())
    header = read_exact(4)
    if header is None or struct.unpack(">I", header)[0] != 32:
        return
    mac_key = read_exact(32)
    if mac_key is None:
        return
    frame(b"H", json.dumps({"pid": os.getpid()}).encode())
    while True:
        header = read_exact(4)
        if header is None:
            return
        size = struct.unpack(">I", header)[0]
        if size > %(max_request)d:
            os.write(2, b"rollhub-shell: request too large\n")
            return
        body = read_exact(size)
        if body is None:
            return
        request = json.loads(body.decode("utf-8", "surrogatepass"))
        if request.get("sweep"):
            sweep(keep)
            frame(b"X", json.dumps({"token": request["token"], "exit_code": 0, "timed_out": False,
                                    "oom_kills": None}).encode())
        else:
            run(request, base_env, keep, devnull)

main()
""".replace("%(max_request)d", str(MAX_REQUEST_BYTES))

# Launches the controller: the image's system Python first (a task's virtualenv may hold
# any version), then whatever `python3` PATH finds. Tells the controller whether LC_CTYPE
# was set, since Python's locale coercion may add it to its environment.
LAUNCHER = (
    'if [ -n "${LC_CTYPE+x}" ]; then lc=set; else lc=unset; fi; '
    'for p in /usr/bin/python3 /usr/local/bin/python3; do [ -x "$p" ] && exec "$p" -I -S -c "$1" "$lc" "$2"; done; '
    'exec python3 -I -S -c "$1" "$lc" "$2"'
)


class ShellUnavailable(Exception):
    """The controller could not be started (no Python 3 in the image, or the engine failed):
    the sandbox falls back to one `docker exec` per command."""


class ShellLost(Exception):
    """End of stream before the command's exit frame. `started` says whether the command
    had begun (the S frame came): if not, it is safe to send it again to a new controller."""

    def __init__(self, started: bool):
        super().__init__("the sandbox's shell ended before the command's exit frame")
        self.started = started


class ShellProtocolError(Exception):
    """A frame that the controller cannot have written (unknown type, oversized, wrong token)."""


@dataclass
class ShellOutcome:
    exit_code: int
    timed_out: bool
    oom_kills: int | None  # the cgroup's OOM-kill counter after a SIGKILL that was no timeout


class PersistentShell:
    """The host side of one container's controller. Not thread-safe: the sandbox's exec lock
    serialises every use."""

    def __init__(self, stream: ExecStream, key: bytes):
        self.stream = stream
        self.pid = 0  # the controller's, as it says (tests use it; nothing depends on it)
        self._key = key
        self._seq = 0  # of the next authenticated frame

    @classmethod
    def start(
        cls, api: Any, container_id: str, user_spec: str, environment: dict[str, str], timeout_s: float
    ) -> PersistentShell:
        """Start the controller and wait for its hello. ShellUnavailable when none comes.

        The exec runs in `/`, which always exists: the image's working directory (where a
        command without workdir runs) may have been removed by a command, and the engine then
        refuses the exec. A handshake something else wrote into is tried once more: the new
        controller's first act was to kill every writer it may have had."""
        deadline = time.monotonic() + timeout_s
        home = _working_dir(api, container_id)
        argv = ["/bin/sh", "-c", LAUNCHER, "rollhub-shell", CONTROLLER_SOURCE, home]
        failure = "no attempt"
        for _attempt in range(2):
            exec_id = api.exec_create(
                container_id,
                argv,
                stdin=True,
                stdout=True,
                stderr=True,
                user=user_spec,
                environment=environment,
                workdir="/",
            )["Id"]
            stream = open_exec_stream(api, exec_id, separate_stderr=True)
            shell = cls(stream, secrets.token_bytes(KEY_BYTES))
            try:
                shell._handshake(deadline)
                return shell
            except TimeoutError:
                stream.close()
                raise ShellUnavailable(f"no hello within {timeout_s:g}s") from None
            except ShellProtocolError as exc:
                failure = f"{exc}; {_leftover_text(stream)}"
                logger.info("the handshake of a shell in %s was written into (%s)", container_id[:12], failure)
            except (ShellLost, OSError) as exc:
                failure = _leftover_text(stream) or f"{exc}"
                stream.close()
                raise ShellUnavailable(failure) from None
            stream.close()
        raise ShellUnavailable(failure)

    def _handshake(self, deadline: float) -> None:
        """Ready frame (the controller is non-dumpable and has swept), then the key, then
        the first authenticated frame. Anything else is refused, never interpreted: an
        engine error ("OCI runtime exec failed: ...") is text on this stream too."""
        kind, payload = self._read_frame(deadline, authenticated=False)
        if kind != b"R":
            raise ShellProtocolError(f"the first frame is {kind!r}, not the controller's ready frame")
        self.stream.send(REQUEST_HEADER.pack(KEY_BYTES) + self._key)
        kind, payload = self._read_frame(deadline)
        if kind != b"H":
            raise ShellProtocolError(f"unexpected frame {kind!r} after the key")
        self.pid = int(json.loads(payload)["pid"])

    def run(
        self,
        argv: list[str],
        timeout_s: float,
        workdir: str | None,
        env: dict[str, str],
        sink: Any,
        deadline: float,
    ) -> ShellOutcome:
        """Run one command; its output goes to `sink.append`. Raises TimeoutError past
        `deadline` (monotonic), ShellLost (with whether the command had begun), or
        ShellProtocolError (a frame the controller did not write: the command's doing)."""
        token = secrets.token_hex(16)
        body = json.dumps(
            {"token": token, "argv": argv, "timeout_s": timeout_s, "workdir": workdir, "env": env}
        ).encode()
        if len(body) > MAX_REQUEST_BYTES:
            raise ValueError(f"command and env take {len(body)} bytes; at most {MAX_REQUEST_BYTES} are accepted")
        try:
            self.stream.send(REQUEST_HEADER.pack(len(body)) + body)
        except OSError:  # the controller is gone: nothing (or a part the controller waits on) was sent
            raise ShellLost(False) from None
        started = False
        while True:
            try:
                kind, payload = self._read_frame(deadline)
            except TimeoutError:  # an OSError too, but the caller's business: the deadline passed
                raise
            except (ShellLost, OSError):  # a reset connection too: the command may have run
                raise ShellLost(started) from None
            if kind == b"O":
                sink.append(payload)
            elif kind == b"S":
                started = True
            elif kind == b"X":
                reply = json.loads(payload)
                if reply.get("token") != token:
                    raise ShellProtocolError("exit frame with a token that is not this command's")
                oom = reply.get("oom_kills")
                return ShellOutcome(
                    int(reply["exit_code"]), bool(reply["timed_out"]), None if oom is None else int(oom)
                )
            else:
                raise ShellProtocolError(f"unexpected frame type {kind!r}")

    def sweep(self, deadline: float) -> None:
        """Have the controller kill every process but the init, the idle command and itself
        (after a restart: what the command that killed the last controller left)."""
        token = secrets.token_hex(16)
        body = json.dumps({"token": token, "sweep": True}).encode()
        self.stream.send(REQUEST_HEADER.pack(len(body)) + body)
        kind, payload = self._read_frame(deadline)
        if kind != b"X" or json.loads(payload).get("token") != token:
            raise ShellProtocolError(f"unexpected reply {kind!r} to a sweep")

    def stderr_text(self) -> str:
        return self.stream.stderr_text()

    def close(self) -> None:
        self.stream.close()

    def _read_frame(self, deadline: float, authenticated: bool = True) -> tuple[bytes, bytes]:
        header = self.stream.read_exact(FRAME_HEADER.size, deadline)
        if header is None:
            raise ShellLost(False)
        kind, size = FRAME_HEADER.unpack(header)
        if size > (MAX_FRAME_BYTES if authenticated else MAX_READY_BYTES):
            raise ShellProtocolError(f"frame of {size} bytes")
        body = self.stream.read_exact(size + (TAG_BYTES if authenticated else 0), deadline)
        if body is None:
            raise ShellLost(False)
        if not authenticated:
            return kind, body
        payload, tag = body[:size], body[size:]
        if not hmac.compare_digest(tag, frame_tag(self._key, self._seq, header + payload)):
            raise ShellProtocolError("a frame failed authentication: something else wrote into the shell's stream")
        self._seq += 1
        return kind, payload


def frame_tag(key: bytes, seq: int, frame: bytes) -> bytes:
    """The controller's tag of its `seq`-th authenticated frame (header and payload)."""
    return hashlib.blake2b(SEQ.pack(seq) + frame, key=key, digest_size=TAG_BYTES).digest()


def _working_dir(api: Any, container_id: str) -> str:
    """The image's working directory, where commands without a workdir run ("/" if none)."""
    return api.inspect_container(container_id)["Config"].get("WorkingDir") or "/"


def _leftover_text(stream: ExecStream, wait_s: float = 5.0) -> str:
    """What else came on a stream whose handshake failed (stderr, an engine error written
    on stdout), for the message only: it is never read as frames. Ends the controller's
    stdin and waits (a while at most) for it to exit: a controller still sweeping would kill
    the next one."""
    sink = HeadTailBuffer(300)
    stream.close_stdin()
    try:
        stream.read_until_eof(sink, time.monotonic() + wait_s)
    except (TimeoutError, OSError):
        pass
    said = (stream.stderr_text() + " " + sink.text()[0]).strip()
    return " ".join(said.split())[-500:]
