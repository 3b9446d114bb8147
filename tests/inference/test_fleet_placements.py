"""One engine fleet, two placements: the same launcher, watchdog, replacement and weight sync
whether the servers are children of this process (`engine.placement: local`) or Ray actors
on a local Ray cluster (`engine.placement: ray`). Each test runs once per placement."""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

import pytest
import torch

from rollhub.core.errors import UserError
from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.build import EngineConfig, build_engine
from rollhub.inference.engines.hosts import LocalHost, RayHost

torch.set_num_threads(1)
PROMPT = [1, 300, 301, 302, 2, 200, 17, 18]
SHORT = SamplingParams(max_new_tokens=2, temperature=1.0, stop_token_ids=(10**9,))


@pytest.fixture(scope="module")
def ray_cluster():
    """A 2-CPU local Ray whose node IP is loopback, so servers and the gloo rendezvous stay on 127.0.0.1."""
    ray = pytest.importorskip("ray", reason="needs the 'ray' extra: pip install -e '.[ray]'")
    from ray._private import ray_constants

    if ray.is_initialized():
        pytest.skip("Ray already initialised by another test module")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # else the node IP is the host's outward one
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


@pytest.fixture(params=["local", "ray"])
def placement(request) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return request.param


def _config(placement: str, **fields) -> EngineConfig:
    # half a CPU per server: two servers fit the 2-CPU test cluster
    config = EngineConfig(backend="server", placement=placement, ray_num_cpus=0.5, watchdog_interval_s=0.5, **fields)
    config.validate()
    return config


def _command_of(server) -> list[str]:
    """The command line a launched server ran: the last one its log records (a replacement
    appends to its slot's log; Ray's servers write theirs on this machine too)."""
    lines = [line for line in Path(server.log_path).read_text().splitlines() if line.startswith("# rollhub: ")]
    return shlex.split(lines[-1].removeprefix("# rollhub: "))


def _alive(pid: int) -> bool:
    """Running (a zombie counts as gone); Ray's servers run on this machine too."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _state(model_dir: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's own weights as a trainer's state dict (what a push carries)."""
    from rollhub.inference.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(model_dir)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


async def _versions(engine, count: int = 4) -> set[int]:
    results = [await engine.generate(PROMPT, SHORT, f"g{k}-a-0-1") for k in range(count)]
    return {v for r in results for v in r.token_versions}


def test_placements_are_hosts_of_their_own_kind():
    local = build_engine(_config("local", replicas=1), "unused-model-dir")
    assert isinstance(local.placement, LocalHost)
    ray_config = EngineConfig(backend="server", placement="ray", launch="sglang", tp=2)
    placed = build_engine(ray_config, "unused-model-dir").placement
    assert isinstance(placed, RayHost) and placed.num_gpus == 2  # sglang: engine.tp GPUs each


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"backend": "inprocess"}, "engine.backend=server"),
        ({"backend": "server", "urls": ["http://127.0.0.1:1"]}, "no engine.urls"),
        ({"backend": "server", "base_port": 30000}, "Ray picks node, port and GPUs"),
        ({"backend": "server", "ray_num_gpus": -1.0}, "must be >= 0"),
    ],
)
def test_ray_placement_refuses_what_only_local_servers_have(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(placement="ray", **fields).validate()


@pytest.mark.slow  # two launched servers per placement: ~30-60 s on a loaded 2-core machine
async def test_fleet_launches_generates_and_pushes_by_disk(placement, tiny_model_dir, tmp_path):
    """Both placements run the launcher's command line (explicit --dtype, server_python, a seed
    per replica) and take disk pushes through the shared weight sync."""
    python = tmp_path / "server-python"
    python.symlink_to(sys.executable)  # a distinct path: proves {python} is engine.server_python
    engine = build_engine(_config(placement, replicas=2, server_python=str(python)), tiny_model_dir, run_dir=tmp_path)
    try:
        await engine.start()
        commands = [_command_of(s) for s in engine.servers]
        assert [c[0] for c in commands] == [str(python)] * 2
        assert all(c[c.index("--dtype") + 1] == "float32" for c in commands)  # never the server's own auto
        assert sorted(c[c.index("--seed") + 1] for c in commands) == ["0", "1"]
        if placement == "ray":
            assert all(type(s).__name__ == "RayServerProcess" and s.node_ip == "127.0.0.1" for s in engine.servers)
        assert await _versions(engine) == {0}
        await engine.update_weights(_state(tiny_model_dir), 1)  # the same weights, as version 1
        assert engine.last_push["method"] == "disk" and engine.last_push["servers"] == 2
        assert [await r.client.server_weight_version() for r in engine.replicas] == ["1", "1"]
        assert await _versions(engine) == {1}
    finally:
        await engine.close()
    for _ in range(100):  # a Ray actor's death reaches the driver shortly after ray.kill
        if all(s.exit_reason() is not None for s in engine.servers):
            break
        await asyncio.sleep(0.1)
    assert all(s.exit_reason() is not None and not _alive(s.pid) for s in engine.servers)


@pytest.mark.slow
async def test_fleet_pushes_over_gloo_on_both_placements(placement, tiny_model_dir, tmp_path):
    config = _config(placement, replicas=1, weight_sync="distributed", weight_sync_backend="gloo")
    engine = build_engine(config, tiny_model_dir, run_dir=tmp_path)
    try:
        await engine.start()
        await engine.update_weights(_state(tiny_model_dir), 2)
        assert engine.last_push["method"] == "distributed" and engine.last_push["backend"] == "gloo"
        assert await engine.replicas[0].client.server_weight_version() == "2"
        assert await _versions(engine, 2) == {2}
    finally:
        await engine.close()


@pytest.mark.slow
async def test_a_dead_server_is_replaced_from_the_latest_weights_on_both_placements(
    placement, tiny_model_dir, tmp_path
):
    """One replacement policy: the watchdog sees the exit, the slot is relaunched from the
    newest version folder and serves that version; the second death finds the budget spent."""
    engine = build_engine(_config(placement, replicas=2, max_replacements=1), tiny_model_dir, run_dir=tmp_path)
    changes: list[dict[str, str]] = []
    engine.on_replicas_changed(changes.append)
    try:
        await engine.start()
        await engine.update_weights(_state(tiny_model_dir), 3)
        first = engine.replicas[0]
        old_url, old_server = first.url, first.process
        old_server.kill()  # local: SIGKILL of the process group; ray: ray.kill of its actor
        for _ in range(600):
            if engine.stats.engines_replaced:
                break
            await asyncio.sleep(0.2)
        assert engine.stats.engines_replaced == 1 and first.live and first.url != old_url
        assert first.process is not old_server and len(engine.servers) == 3
        command = _command_of(first.process)
        assert command[command.index("--model") + 1] == str(tmp_path / "weights" / "v3")
        assert await first.client.server_weight_version() == "3"
        assert changes == [engine.serving_urls()] and set(changes[0]) == {"replica-0", "replica-1"}
        assert await _versions(engine) == {3}
        engine.replicas[1].process.kill()  # the budget (1) is spent: it stays down, replica-0 serves
        for _ in range(300):
            if not engine.replicas[1].live:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        assert not engine.replicas[1].live and engine.stats.engines_replaced == 1
        assert engine.live_engine_ids == ["replica-0"] and await _versions(engine, 2) == {3}
    finally:
        await engine.close()


async def test_a_ray_server_no_node_can_hold_is_a_user_error_naming_the_resources(
    ray_cluster, tiny_model_dir, tmp_path
):
    config = _config("ray", replicas=1, ray_num_gpus=1.0, startup_timeout_s=3)  # the test cluster has no GPU
    engine = build_engine(config, tiny_model_dir, run_dir=tmp_path)
    try:
        with pytest.raises(UserError, match=r"no node has 0.5 CPU\(s\) and 1 GPU\(s\) free"):
            await engine.start()
    finally:
        await engine.close()


async def test_a_ray_server_that_cannot_start_is_a_user_error(ray_cluster, tiny_model_dir, tmp_path):
    config = _config("ray", replicas=1, server_python=str(tmp_path / "no-such-python"), startup_timeout_s=60)
    engine = build_engine(config, tiny_model_dir, run_dir=tmp_path)
    try:
        with pytest.raises(UserError, match="cannot start engine server replica-0 on Ray node 127.0.0.1"):
            await engine.start()
    finally:
        await engine.close()
    await asyncio.sleep(0.5)
    assert not [n for n in ray_cluster.util.list_named_actors() if n.startswith("rollhub-engine")]


@pytest.mark.slow
async def test_a_replacement_under_distributed_sync_serves_only_after_the_next_push(
    placement, tiny_model_dir, tmp_path
):
    """No version folder to start from: the replacement loads the base model, stays out of
    routing (its tokens would carry a version it does not hold) and joins the next broadcast."""
    config = _config(placement, replicas=2, max_replacements=1, weight_sync="distributed", weight_sync_backend="gloo")
    engine = build_engine(config, tiny_model_dir, run_dir=tmp_path)
    try:
        await engine.start()
        await engine.update_weights(_state(tiny_model_dir), 1)
        first = engine.replicas[0]
        first.process.kill()
        for _ in range(600):
            if engine.stats.engines_replaced:
                break
            await asyncio.sleep(0.2)
        assert engine.stats.engines_replaced == 1 and first.up and first.awaiting_push and not first.live
        assert engine.live_engine_ids == ["replica-1"] and await _versions(engine, 2) == {1}
        await engine.update_weights(_state(tiny_model_dir), 2)
        assert engine.last_push["servers"] == 2 and first.live and not first.awaiting_push
        assert [await r.client.server_weight_version() for r in engine.replicas] == ["2", "2"]
    finally:
        await engine.close()
