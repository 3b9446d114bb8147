"""The grading collector: the process that runs the tests in the grading container and
carries what they wrote to the grader through a channel they cannot write.

The grader writes one file: this source with its SETTINGS filled in (keys included). It
makes itself non-dumpable first (no capability is left in the sandbox, so no process, even of
the same uid, can then read its memory or open its descriptors through /proc), deletes its
own file, writes the test script, the reporter plugin and the reporter's key into a folder
of its own, and only then starts the test script, with pytest's
stdout and stderr on one pipe (the log: a pipe cannot be seeked or truncated, unlike the log
file the official script writes) and the reporter's records on another. When the script has
ended (or the deadline passed) it kills what the script left, writes both streams to files
and prints one line to its own stdout, the exec's output: the digests of both files, the
script's exit status and whether it timed out, MACed with its key. The code under test
never holds the key, so a line it forges, or a file it rewrites after the fact, does not
verify.

Run by the grader with the image's Python: standard library only.
"""

import ctypes
import hashlib
import hmac
import json
import os
import selectors
import signal
import subprocess
import sys
import time

PR_SET_DUMPABLE = 4
GRACE_S = 2.0
MAX_BYTES = 16 * 1024 * 1024
#: filled in by the grader (rollhub.envs.swe.grading.reporter.GradingRun.collector_source)
SETTINGS = None


def _non_dumpable():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except Exception:
        return False


def _write(path, data, mode=0o600):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def main():
    sealed = _non_dumpable()
    os.unlink(os.path.abspath(__file__))
    settings = SETTINGS
    key = bytes.fromhex(settings["key"])
    here = settings["folder"]
    os.mkdir(here, 0o700)
    os.mkdir(os.path.join(here, "plugin"), 0o700)
    _write(os.path.join(here, "tests.sh"), settings["script"].encode())
    _write(os.path.join(here, "plugin", settings["module"] + ".py"), settings["plugin"].encode())
    _write(os.path.join(here, "reporter.key"), bytes.fromhex(settings["reporter_key"]))
    started = time.monotonic()
    deadline = started + float(settings["timeout_s"])

    log_r, log_w = os.pipe()
    rec_r, rec_w = os.pipe()
    fd = int(settings["fd"])
    os.dup2(rec_w, fd, inheritable=True)
    os.close(rec_w)
    env = dict(os.environ)
    env.update(settings["env"])
    plugin_dir = os.path.join(here, "plugin")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (plugin_dir, env.get("PYTHONPATH", "")) if p)
    env["PYTEST_ADDOPTS"] = " ".join(p for p in (env.get("PYTEST_ADDOPTS", ""), "-p " + settings["module"]) if p)
    devnull = os.open(os.devnull, os.O_RDONLY)
    proc = subprocess.Popen(
        ["bash", os.path.join(here, "tests.sh")],
        stdin=devnull,
        stdout=log_w,
        stderr=log_w,
        pass_fds=(fd,),
        cwd=settings["workdir"],
        env=env,
        start_new_session=True,
    )
    for own in (log_w, fd, devnull):
        os.close(own)

    streams = {log_r: bytearray(), rec_r: bytearray()}
    overflow = False
    selector = selectors.DefaultSelector()
    for r in streams:
        selector.register(r, selectors.EVENT_READ)
    exited_at = None
    timed_out = False
    while selector.get_map():
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now > exited_at + GRACE_S:
            break  # something the script left holds a pipe open: what it writes now is not read
        if now > deadline:
            timed_out = True
            break
        for event, _ in selector.select(timeout=0.2):
            chunk = os.read(event.fd, 65536)
            if not chunk:
                selector.unregister(event.fd)
                continue
            buffer = streams[event.fd]
            if len(buffer) + len(chunk) > MAX_BYTES:
                overflow = True
                chunk = chunk[: max(0, MAX_BYTES - len(buffer))]
            buffer += chunk
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        exit_code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        exit_code = None

    log, records = bytes(streams[log_r]), bytes(streams[rec_r])
    _write(os.path.join(here, "test.log"), log)
    _write(os.path.join(here, "records"), records)
    body = json.dumps(
        {
            "log_sha256": hashlib.sha256(log).hexdigest(),
            "records_sha256": hashlib.sha256(records).hexdigest(),
            "exit_code": exit_code,
            "timed_out": timed_out,
            "overflow": overflow,
            "sealed": sealed,
            "duration_s": round(time.monotonic() - started, 3),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    sys.stdout.write(f"\n{settings['tag']} {body} {mac}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
