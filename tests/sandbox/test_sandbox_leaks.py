"""Zero leaked containers: after a normal end, an exception, SIGINT/SIGTERM, and after
SIGKILL followed by `rollhub sandbox gc`. Each case runs a real child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_testing import new_test_run_id

from rollhub.sandbox.reaper import list_rollhub_containers

pytestmark = pytest.mark.docker

CHILD = str(Path(__file__).with_name("leak_child.py"))
COUNT = 3


def start_child(run_id: str, mode: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, CHILD, run_id, str(COUNT), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    ready = child.stdout.readline()
    assert ready.startswith("READY"), (
        f"child did not start its containers: {ready!r} {child.stderr.read() if child.poll() is not None else ''}"
    )
    return child


def containers_of(docker_client, run_id: str):
    return list_rollhub_containers(docker_client.api, run_id)


@pytest.mark.parametrize("mode", ["close", "raise"])
def test_no_leak_after_normal_end_or_exception(docker_client, mode):
    run_id = new_test_run_id()
    child = start_child(run_id, mode)
    _, stderr = child.communicate(timeout=60)
    assert (child.returncode == 0) == (mode == "close"), stderr
    if mode == "raise":
        assert "simulated crash" in stderr
    assert containers_of(docker_client, run_id) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_no_leak_after_sigterm_or_sigint(docker_client, signum):
    run_id = new_test_run_id()
    child = start_child(run_id, "wait")
    assert len(containers_of(docker_client, run_id)) == COUNT
    child.send_signal(signum)
    child.communicate(timeout=60)
    assert child.returncode != 0
    assert containers_of(docker_client, run_id) == []


def test_sigkill_leaves_orphans_that_gc_removes_without_touching_live_runs(docker_client):
    from rollhub.sandbox.docker_backend import DockerBackend

    run_id = new_test_run_id()
    child = start_child(run_id, "wait")
    os.kill(child.pid, signal.SIGKILL)
    child.communicate(timeout=30)
    orphans = containers_of(docker_client, run_id)
    assert len(orphans) == COUNT and not any(record.owner_alive for record in orphans)

    # A live run's containers (this test process owns them) must survive gc.
    import asyncio

    async def start_live():
        backend = DockerBackend(run_id=new_test_run_id(), max_threads=4)
        await backend.start("rollhub/base:bookworm")
        return backend

    live_backend = asyncio.run(start_live())
    try:
        listing = subprocess.run(
            [sys.executable, "-m", "rollhub.cli", "sandbox", "ls"], capture_output=True, text=True, timeout=60
        )
        assert listing.returncode == 0, listing.stderr
        lines = {line.split()[0]: line for line in listing.stdout.splitlines()[1:-1]}
        assert all("GONE" in lines[record.id[:12]] for record in orphans)
        (live_record,) = containers_of(docker_client, live_backend.run_id)
        assert "alive" in lines[live_record.id[:12]]
        gc = subprocess.run(
            [sys.executable, "-m", "rollhub.cli", "sandbox", "gc"], capture_output=True, text=True, timeout=60
        )
        assert gc.returncode == 0, gc.stderr
        assert f"removed {COUNT} container(s)" in gc.stdout
        assert containers_of(docker_client, run_id) == []
        assert len(containers_of(docker_client, live_backend.run_id)) == 1
    finally:
        asyncio.run(live_backend.close())
    assert containers_of(docker_client, live_backend.run_id) == []


def test_a_forked_child_does_not_remove_its_parents_sandboxes(docker_client):
    """Children inherit the exit hooks; a SIGTERM to a forked worker must leave the parent's
    containers alone."""
    import asyncio

    from rollhub.sandbox.docker_backend import DockerBackend

    async def start():
        backend = DockerBackend(run_id=new_test_run_id(), max_threads=4)
        await backend.start("rollhub/base:bookworm")
        return backend

    backend = asyncio.run(start())
    try:
        pid = os.fork()
        if pid == 0:  # the child: terminated by the default-chained SIGTERM handler
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(0)  # not reached
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert len(containers_of(docker_client, backend.run_id)) == 1
    finally:
        asyncio.run(backend.close())
