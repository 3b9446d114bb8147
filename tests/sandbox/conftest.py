"""Sandbox test fixtures: a real Docker engine (skipped with the reason when none answers)
and the process backend, plus a guard that no test leaves a rollhub container behind."""

from __future__ import annotations

import os
import warnings

import pytest
from sandbox_testing import TEST_RUN_PREFIX, new_test_run_id

BASE_IMAGE = "rollhub/base:bookworm"


def _docker_client_or_reason():
    """(client, None) when the engine answers and the base image exists, else (None, reason)."""
    try:
        from rollhub.sandbox.docker_backend import connect

        client = connect(api_timeout_s=30)
    except Exception as exc:  # SandboxError, or the docker SDK missing
        return None, f"no Docker engine: {exc}"
    from rollhub.sandbox.images import image_exists

    if not image_exists(client, BASE_IMAGE):
        return None, f"{BASE_IMAGE} missing: run `bash .ci/setup_docker.sh` (or `rollhub sandbox build-base`)"
    return client, None


@pytest.fixture(scope="session")
def docker_client():
    client, reason = _docker_client_or_reason()
    if client is None:
        # A warning shows in pytest's default summary; a skip reason alone needs -rs.
        warnings.warn(f"Docker sandbox tests skipped: {reason}", stacklevel=1)
        pytest.skip(reason)
    yield client
    from rollhub.sandbox.reaper import list_rollhub_containers

    # Ours: started by this process, or by a test's child process that is gone by now (a
    # concurrent pytest elsewhere on the machine has live owners and is left alone).
    leftovers = [
        r
        for r in list_rollhub_containers(client.api)
        if r.run_id.startswith(TEST_RUN_PREFIX)
        and (r.labels.get("rollhub.owner_pid") == str(os.getpid()) or not r.owner_alive)
    ]
    client.api.close()
    assert not leftovers, f"tests leaked containers: {[r.id[:12] for r in leftovers]}"


async def _docker_backend_with(docker_client, exec_mode: str):
    from rollhub.sandbox.docker_backend import DockerBackend
    from rollhub.sandbox.reaper import list_rollhub_containers

    backend = DockerBackend(run_id=new_test_run_id(), output_limit_chars=2000, max_threads=32, exec_mode=exec_mode)
    try:
        yield backend
    finally:
        await backend.close()
    assert list_rollhub_containers(docker_client.api, backend.run_id) == []


@pytest.fixture
async def docker_backend_shell(docker_client):
    """Commands through the persistent shell (the default exec mode)."""
    async for backend in _docker_backend_with(docker_client, "persistent-shell"):
        yield backend


@pytest.fixture
async def docker_backend_exec(docker_client):
    """Commands through one `docker exec` each (the old path, still selectable)."""
    async for backend in _docker_backend_with(docker_client, "docker-exec"):
        yield backend


EXEC_MODE_PARAMS = [pytest.param("shell", id="shell"), pytest.param("exec", id="exec")]


@pytest.fixture(params=EXEC_MODE_PARAMS)
def docker_backend(request):
    """Every docker test runs on both exec paths: they must behave the same."""
    return request.getfixturevalue(f"docker_backend_{request.param}")


async def _process_backend_in(tmp_path, use_bubblewrap: bool):
    """A process backend rooted in the test's tmp folder; checks nothing is left on close."""
    from rollhub.sandbox.process_backend import ProcessBackend

    roots = tmp_path / "sandbox-roots"
    roots.mkdir()
    backend = ProcessBackend(root_dir=str(roots), output_limit_chars=2000, use_bubblewrap=use_bubblewrap)
    yield backend
    await backend.close()
    assert list(roots.iterdir()) == [], "process sandboxes left folders behind"


@pytest.fixture
async def process_backend(tmp_path):
    from rollhub.sandbox.process_backend import bubblewrap_available

    if not bubblewrap_available():
        pytest.skip("bubblewrap not installed (apt-get install -y bubblewrap)")
    async for backend in _process_backend_in(tmp_path, use_bubblewrap=True):
        yield backend


@pytest.fixture
async def plain_process_backend(tmp_path):
    async for backend in _process_backend_in(tmp_path, use_bubblewrap=False):
        yield backend


def _backend_params():
    from rollhub.sandbox.process_backend import bubblewrap_available

    params = [
        pytest.param("docker-shell", marks=pytest.mark.docker),
        pytest.param("docker-exec", marks=pytest.mark.docker),
    ]
    params.append(
        pytest.param(
            "process-bwrap", marks=pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap not installed")
        )
    )
    params.append(pytest.param("process-plain"))
    return params


@pytest.fixture(params=_backend_params())
def any_backend(request):
    """The same interface tests run against every backend."""
    name = request.param
    if name.startswith("docker-"):
        return request.getfixturevalue(f"docker_backend_{name.removeprefix('docker-')}")
    if name == "process-bwrap":
        return request.getfixturevalue("process_backend")
    return request.getfixturevalue("plain_process_backend")
