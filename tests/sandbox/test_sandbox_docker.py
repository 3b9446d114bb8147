"""Docker-only behaviour: limits as configured, OOM kills reported, infra failures raised."""

from __future__ import annotations

import pytest

from rollhub.sandbox import ownership
from rollhub.sandbox.base import Limits, SandboxError

pytestmark = pytest.mark.docker
IMAGE = "rollhub/base:bookworm"


async def test_container_is_configured_as_asked(docker_backend, docker_client):
    limits = Limits(cpus=0.5, memory_mb=96, pids=64)
    async with await docker_backend.start(IMAGE, limits, labels={"rollhub.trajectory": "t-7"}) as box:
        attrs = docker_client.api.inspect_container(box.id)
        host = attrs["HostConfig"]
        assert host["Init"] is True
        assert host["NetworkMode"] == "none"
        assert host["NanoCpus"] == 500_000_000
        assert host["Memory"] == 96 * 1024 * 1024
        assert host["MemorySwap"] == 96 * 1024 * 1024
        assert host["PidsLimit"] == 64
        assert attrs["Config"]["Cmd"] == ["sleep", "infinity"]
        labels = attrs["Config"]["Labels"]
        assert labels[ownership.LABEL_RUN] == docker_backend.run_id
        assert labels[ownership.LABEL_OWNER_PID].isdigit()
        assert labels["rollhub.trajectory"] == "t-7"
        # PID 1 is the init, not our idle command, so signals and zombies are handled.
        result = await box.exec("cat /proc/1/cmdline | tr '\\0' ' '", timeout_s=10)
        assert "sleep" not in result.output.split()[0]


async def test_memory_hog_is_killed_and_reported(docker_backend):
    async with await docker_backend.start(IMAGE, Limits(memory_mb=64)) as box:
        hog = await box.exec(
            "python3 -c 'blocks = [bytearray(16 * 2**20) for _ in range(64)]; print(\"survived\")'", timeout_s=30
        )
        assert hog.oom_killed
        assert hog.exit_code == 137
        assert not hog.timed_out
        assert "survived" not in hog.output
        # A SIGKILL that is not an OOM kill is not reported as one.
        plain_kill = await box.exec("kill -9 $$", timeout_s=10)
        assert plain_kill.exit_code == 137 and not plain_kill.oom_killed
        after = await box.exec("echo alive", timeout_s=10)
        assert after.ok and after.output == "alive\n"


async def test_pids_limit_stops_a_fork_bomb(docker_backend):
    async with await docker_backend.start(IMAGE, Limits(pids=32)) as box:
        result = await box.exec("for i in $(seq 100); do sleep 5 & done; wait", timeout_s=20)
        assert "retry" in result.output.lower() or "resource temporarily unavailable" in result.output.lower()
        assert (await box.exec("echo ok", timeout_s=10)).ok


async def test_missing_image_raises_without_pulling_or_leaking(docker_backend_shell, docker_client):
    with pytest.raises(SandboxError, match="nothing is pulled"):
        await docker_backend_shell.start("rollhub/does-not-exist:never")
    from rollhub.sandbox.reaper import list_rollhub_containers

    assert list_rollhub_containers(docker_client.api, docker_backend_shell.run_id) == []


async def test_container_removed_underneath_is_an_infra_failure(docker_backend, docker_client):
    box = await docker_backend.start(IMAGE)
    docker_client.api.remove_container(box.id, force=True)
    with pytest.raises(SandboxError):
        await box.exec("true", timeout_s=5)
    with pytest.raises(SandboxError):
        await box.write_file("/tmp/x", "y")
    await box.close()  # idempotent on an already-gone container


async def test_backend_close_removes_everything_it_started(docker_backend, docker_client):
    from rollhub.sandbox.reaper import list_rollhub_containers

    boxes = [await docker_backend.start(IMAGE) for _ in range(3)]
    assert len(list_rollhub_containers(docker_client.api, docker_backend.run_id)) == 3
    await docker_backend.close()
    assert list_rollhub_containers(docker_client.api, docker_backend.run_id) == []
    await boxes[0].close()  # a sandbox outliving its backend still closes quietly
    with pytest.raises(SandboxError):
        await boxes[1].exec("true", timeout_s=5)
    with pytest.raises(SandboxError):
        await docker_backend.start(IMAGE)


async def test_closing_a_sandbox_during_a_long_exec_ends_it_as_an_infra_failure(docker_backend):
    import asyncio
    import time

    box = await docker_backend.start(IMAGE)
    running = asyncio.ensure_future(box.exec("sleep 60", timeout_s=120))
    await asyncio.sleep(1.0)
    began = time.monotonic()
    await box.close()
    with pytest.raises(SandboxError):
        await running
    assert time.monotonic() - began < 30  # not the 60 s sleep, nor the 120 s timeout


async def test_backend_caps_starts_in_flight(docker_client):
    import asyncio
    import threading

    from sandbox_testing import new_test_run_id

    from rollhub.sandbox.docker_backend import DockerBackend

    backend = DockerBackend(run_id=new_test_run_id(), max_threads=16, max_concurrent_starts=2)
    inside, peak = 0, 0
    lock = threading.Lock()
    create = backend._create_and_start

    def counting_create(*args):
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
        try:
            return create(*args)
        finally:
            with lock:
                inside -= 1

    backend._create_and_start = counting_create
    try:
        boxes = await asyncio.gather(*(backend.start(IMAGE) for _ in range(4)))
        assert len({box.id for box in boxes}) == 4
    finally:
        await backend.close()
    assert peak == 2  # four starts requested at once, two at a time on the engine


async def test_a_cancelled_start_does_not_leave_its_container_running(docker_backend_shell, docker_client):
    import asyncio

    from rollhub.sandbox.reaper import list_rollhub_containers

    starting = asyncio.ensure_future(docker_backend_shell.start(IMAGE))
    await asyncio.sleep(0.05)  # the worker thread is creating the container now
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    for _ in range(300):  # the worker thread finishes the start regardless
        if docker_backend_shell._starts_in_flight == 0:
            break
        await asyncio.sleep(0.1)
    assert docker_backend_shell._starts_in_flight == 0
    for _ in range(100):  # then its container is removed in the background
        if not list_rollhub_containers(docker_client.api, docker_backend_shell.run_id):
            break
        await asyncio.sleep(0.1)
    assert list_rollhub_containers(docker_client.api, docker_backend_shell.run_id) == []
    assert docker_backend_shell.live_count == 0
