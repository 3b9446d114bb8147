"""Fixtures of the SWE docker tests: the shipped tasks (skipped, with the reason, when no
engine answers or their images are not built) and a DockerBackend that must end empty."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def _shipped_tasks():
    from rollhub.envs.checker import docker_available
    from rollhub.envs.swe.tasks import SHIPPED_TASKS, load_tasks

    if not docker_available():
        return None, 0
    import docker

    from rollhub.envs.swe.factory.images import instance_image_current

    tasks = load_tasks(SHIPPED_TASKS)
    client = docker.from_env()
    try:  # one inspect per image (a filtered list costs seconds each on a busy engine); stale = missing
        missing = [t.image for t in tasks if not instance_image_current(client, t.image)]
    finally:
        client.close()
    return tasks, len(missing)


@pytest.fixture
def tasks():
    from rollhub.envs.swe.tasks import SHIPPED_TASKS

    tasks, missing = _shipped_tasks()
    if tasks is None:
        pytest.skip("no Docker engine answers (start dockerd or set DOCKER_HOST)")
    if missing:
        pytest.skip(
            f"{missing} shipped task images are not built or predate the current recipe: "
            f"run `rollhub swe build-images {SHIPPED_TASKS}`"
        )
    return tasks


@pytest.fixture
async def backend():
    from rollhub.sandbox.docker_backend import DockerBackend

    backend = DockerBackend()
    yield backend
    await backend.close()
    assert backend.live_count == 0
