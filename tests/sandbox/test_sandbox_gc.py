"""`rollhub sandbox gc` removes a container only when its owner is provably dead in this host
and PID namespace; other hosts' and namespaces' containers need `--all`. Real Docker engine.

Every gc here is scoped with `--run` to the test's own run id: a concurrent pytest on the same
engine must not lose its containers to these tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_testing import new_test_run_id

from rollhub.cli import main
from rollhub.sandbox import ownership
from rollhub.sandbox.reaper import list_rollhub_containers, remove_run

BASE_IMAGE = "rollhub/base:bookworm"
LEAK_CHILD = str(Path(__file__).with_name("leak_child.py"))


def dead_pid() -> str:
    """A pid that existed a moment ago in this namespace and is gone now."""
    child = subprocess.Popen(["true"])
    child.wait()
    return str(child.pid)


def run_gc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["sandbox", "gc", *args])
    return code, capsys.readouterr().out


def container_ids(docker_client, run_id: str) -> set[str]:
    return {record.id for record in list_rollhub_containers(docker_client.api, run_id)}


@contextlib.contextmanager
def cleaned_up(docker_client, run_id: str) -> Iterator[None]:
    """Whatever the test asserted, no container of `run_id` outlives it."""
    try:
        yield
    finally:
        remove_run(docker_client.api, run_id)


def create_labelled(docker_client, labels: dict[str, str]) -> str:
    """A created (not started) container carrying `labels`: gc looks only at labels."""
    api = docker_client.api
    host_config = api.create_host_config(network_mode="none")
    return api.create_container(BASE_IMAGE, command=["sleep", "infinity"], labels=labels, host_config=host_config)["Id"]


def test_owner_labels_name_this_boot_and_pid_namespace():
    labels = ownership.owner_labels("run-x")
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert labels[ownership.LABEL_BOOT_ID] == boot
    assert labels[ownership.LABEL_PID_NS] == str(os.stat("/proc/self/ns/pid").st_ino)
    assert labels[ownership.LABEL_OWNER_PID] == str(os.getpid())


def test_a_dead_pid_proves_nothing_outside_this_host_and_namespace():
    me = ownership.owner_labels("run-x")
    gone = dead_pid()
    assert ownership.owner_status({**me, ownership.LABEL_OWNER_PID: gone}).state == ownership.DEAD
    other_host = {**me, ownership.LABEL_BOOT_ID: str(uuid.uuid4()), ownership.LABEL_OWNER_PID: gone}
    other_ns = {**me, ownership.LABEL_PID_NS: "4026500001", ownership.LABEL_OWNER_PID: gone}
    legacy = {key: me[key] for key in (ownership.LABEL_RUN, ownership.LABEL_HOST, ownership.LABEL_OWNER_START)}
    for labels in (other_host, other_ns, {**legacy, ownership.LABEL_OWNER_PID: gone}):
        assert ownership.owner_status(labels).state == ownership.FOREIGN
        assert ownership.owner_is_alive(labels)


@pytest.mark.docker
def test_gc_keeps_foreign_owners_removes_provable_orphans_and_all_removes_the_rest(docker_client, capsys):
    run_id = new_test_run_id()
    me = ownership.owner_labels(run_id)
    gone = dead_pid()
    with cleaned_up(docker_client, run_id):
        # same host name as ours: another machine on a shared DOCKER_HOST, told apart by its boot id
        other_host = create_labelled(
            docker_client, {**me, ownership.LABEL_BOOT_ID: str(uuid.uuid4()), ownership.LABEL_OWNER_PID: gone}
        )
        other_ns = create_labelled(
            docker_client, {**me, ownership.LABEL_PID_NS: "4026500001", ownership.LABEL_OWNER_PID: gone}
        )
        legacy = create_labelled(
            docker_client,
            {
                ownership.LABEL_RUN: run_id,
                ownership.LABEL_HOST: me[ownership.LABEL_HOST],
                ownership.LABEL_OWNER_PID: gone,
            },
        )
        live = create_labelled(docker_client, me)
        orphan = create_labelled(docker_client, {**me, ownership.LABEL_OWNER_PID: gone})

        code, out = run_gc(capsys, "--run", run_id)
        assert code == 0, out
        assert container_ids(docker_client, run_id) == {other_host, other_ns, legacy, live}
        assert orphan not in container_ids(docker_client, run_id)
        assert f"removed 1 container(s) of run {run_id}" in out
        assert "skipped 1 container(s): another host" in out
        assert "skipped 1 container(s): another PID namespace" in out
        assert "skipped 1 container(s): labels lack boot id" in out
        assert "skipped 1 container(s): owner alive" in out
        assert "only removed with --all" in out

        code, out = run_gc(capsys, "--all", "--run", run_id)
        assert code == 0, out
        assert f"removed 4 container(s) of run {run_id}" in out
        assert container_ids(docker_client, run_id) == set()


@pytest.mark.docker
def test_gc_never_removes_a_live_owner_in_another_pid_namespace(docker_client, capsys):
    """A real owner in its own PID namespace runs as pid 1 there; here pid 1 is init, with
    another start time, which used to read as "pid reused, owner dead"."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to start a process in a new PID namespace")
    run_id = new_test_run_id()
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, LEAK_CHILD, run_id]
    child = subprocess.Popen([*command, "1", "wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with cleaned_up(docker_client, run_id):
        try:
            ready = child.stdout.readline()
            if not ready.startswith("READY"):
                child.kill()
                pytest.skip(f"could not start an owner in a new PID namespace: {child.communicate()[1][-500:]}")
            (record,) = list_rollhub_containers(docker_client.api, run_id)
            assert record.labels[ownership.LABEL_OWNER_PID] == "1"
            assert record.labels[ownership.LABEL_BOOT_ID] == ownership.boot_id()
            assert record.labels[ownership.LABEL_PID_NS] != ownership.pid_namespace()
            assert record.owner.state == ownership.FOREIGN

            code, out = run_gc(capsys, "--run", run_id)
            assert code == 0 and f"removed 0 container(s) of run {run_id}" in out
            assert "skipped 1 container(s): another PID namespace" in out
            assert container_ids(docker_client, run_id) == {record.id}
        finally:
            child.kill()  # unshare dies; --kill-child takes the namespace's pid 1 with it
            child.communicate(timeout=30)
        # the owner is gone, but from here that is unprovable: still kept without --all
        assert run_gc(capsys, "--run", run_id)[0] == 0
        assert container_ids(docker_client, run_id) == {record.id}
        code, out = run_gc(capsys, "--all", "--run", run_id)
        assert code == 0 and f"removed 1 container(s) of run {run_id}" in out
        assert container_ids(docker_client, run_id) == set()
