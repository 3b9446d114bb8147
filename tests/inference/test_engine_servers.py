"""The `server` engine backend: routing, attach by URL, config checks (fast: in-process apps),
and launched `rollhub serve` replicas that flood stderr, hang (SIGSTOP) or die (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.build import EngineConfig, build_engine
from rollhub.inference.engines.launcher import ServerEngine, template_words
from rollhub.inference.engines.router import EngineRouter, ReplicaError, group_key

PROMPT = [1, 300, 301, 302, 2, 200, 17, 18]
SHORT = SamplingParams(max_new_tokens=2, temperature=1.0, stop_token_ids=(10**9,))
LONG = SamplingParams(max_new_tokens=400, temperature=1.0, stop_token_ids=(10**9,))


@pytest.fixture
async def apps(engine_apps):
    """Two HFEngines behind the SGLang-native app, each on its own port (conftest: engine_apps)."""
    return engine_apps


# --- config ----------------------------------------------------------------------------


def test_engine_section_checks_backend_launch_urls_and_template_fields():
    config = load_config(EngineConfig, None, ["backend=server", "replicas=2", "urls=[]"])
    assert config.backend == "server" and config.replicas == 2 and config.launch is None
    bad = [
        ["backend=grpc"],
        ["replicas=0"],
        ["launch=rollhub", "urls=[http://127.0.0.1:1]"],
        ["urls=[127.0.0.1:30000]"],
        ["launch=serve --port {port} --gpu {gpu}"],
        ["weight_sync=nfs"],
        ["watchdog_timeout_s=0"],
    ]
    for overrides in bad:
        with pytest.raises(UserError):
            load_config(EngineConfig, None, overrides)
    words = template_words("my-server --model '{model}' --port {port}")
    assert words == ["my-server", "--model", "{model}", "--port", "{port}"]  # a path with spaces stays one word
    assert template_words("rollhub")[1:4] == ["-m", "rollhub.cli", "serve"]


def test_model_device_is_checked_and_cuda_never_falls_back(monkeypatch):
    import torch

    from rollhub.inference.engines.build import resolve_device
    from rollhub.trainer.config import RunConfig

    with pytest.raises(UserError, match="model.device"):
        load_config(RunConfig, None, ["model.device=gpu"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(UserError, match="no CUDA device"):
        resolve_device("cuda")


def test_ray_env_shards_need_the_fleet_on_ray():
    from rollhub.trainer.config import RunConfig

    for engine in (["engine.backend=inprocess"], ["engine.backend=server"]):  # placement: local
        with pytest.raises(UserError, match="cluster.backend=ray serves rollouts from engine servers on Ray"):
            load_config(RunConfig, None, [*engine, "cluster.backend=ray", "model.device=cpu"])
    config = load_config(RunConfig, None, ["engine.backend=server", "engine.placement=ray", "cluster.backend=ray"])
    assert config.engine.placement == "ray"


# --- routing -----------------------------------------------------------------------------


def test_group_key_is_the_group_of_the_request():
    assert group_key("g3-abc123-1-7", [1]) == "g3-abc123"  # <group>-<trajectory>-<request>
    assert group_key("g3-abc123-0-1", [1]) == group_key("g3-abc123-3-9", [2])
    assert group_key("eval-17-0-2", [1]) == "eval-17"
    assert group_key("trajA-3", [1]) == "trajA"
    assert group_key(None, [1, 2, 3]) == group_key(None, [1, 2, 3]) != group_key(None, [1, 2, 4])


async def test_a_group_sticks_to_one_replica_and_new_groups_go_to_the_least_outstanding_tokens(apps):
    engines, _, urls = apps
    router = EngineRouter({"a": urls[0], "b": urls[1]})
    try:
        # group g1 is heavy (a long prompt generating 400 tokens) and takes a replica
        heavy = asyncio.ensure_future(router.generate(PROMPT * 20, LONG, "g1-x-0-1"))
        await asyncio.sleep(0.05)
        busy = next(r for r, n in router.outstanding_tokens().items() if n)
        assert router.outstanding_tokens()[busy] == len(PROMPT) * 20 + 400
        # a new group goes to the other replica; every member and turn of g1 stays on g1's
        for turn in range(3):
            await router.generate(PROMPT, SHORT, f"g2-y-{turn}-1")
        for member in range(3):
            await router.generate(PROMPT + [member], SHORT, f"g1-x-{member}-2")
        counts = [e.stats.requests_finished for e in engines]
        index = {"a": 0, "b": 1}
        assert counts[index[busy]] == 3 and counts[1 - index[busy]] == 3
        assert router.stats.affinity_hits >= 5
        await heavy
        assert router.outstanding_tokens() == {"a": 0, "b": 0}
    finally:
        await router.close()


async def test_attach_by_urls_waits_for_health_generate_and_generates(apps, tiny_model_dir):
    engines, _, urls = apps
    config = load_config(EngineConfig, None, ["backend=server", f"urls=[{urls[0]}, {urls[1]}]"])
    engine = build_engine(config, tiny_model_dir, run_dir=tiny_model_dir.parent / "attach")
    assert isinstance(engine, ServerEngine) and engine.servers == []
    try:
        await engine.start()
        results = await asyncio.gather(*(engine.generate(PROMPT, SHORT, f"g{k}-a-0-1") for k in range(4)))
        assert all(len(r.token_ids) == 2 and len(r.logprobs) == 2 for r in results)
        assert sum(e.stats.requests_finished for e in engines) >= 4
        assert engine.tokenizer is not None  # prompts are built client-side from the model dir
    finally:
        await engine.close()
    assert all(e.num_in_flight == 0 for e in engines)  # attached servers are left running, not killed


async def test_a_request_whose_replica_dies_is_sent_once_more_then_fails_as_infra(apps):
    engines, runners, urls = apps
    router = EngineRouter({"a": urls[0], "b": urls[1]}, max_reroutes=1)
    try:
        await router.generate(PROMPT, SHORT, "g1-x-0-1")
        pinned = next(i for i, e in enumerate(engines) if e.stats.requests_finished)
        await runners[pinned].cleanup()
        again = await router.generate(PROMPT, SHORT, "g1-x-0-2")  # re-sent to the other replica
        assert len(again.token_ids) == 2 and router.stats.requests_rerouted == 1
        await runners[1 - pinned].cleanup()
        with pytest.raises(ReplicaError, match="no live engine server"):
            await router.generate(PROMPT, SHORT, "g1-x-0-3")
        assert router.stats.requests_failed == 1
    finally:
        await router.close()


async def test_update_weights_pauses_pushes_to_every_live_replica_and_resumes(apps, tiny_model_dir, tmp_path):
    from rollhub.inference.engines.build import make_weight_sync
    from rollhub.inference.models import load_model_and_tokenizer

    engines, _, urls = apps
    sync = make_weight_sync("disk", tmp_path / "weights", str(tiny_model_dir))
    router = EngineRouter({"a": urls[0], "b": urls[1]}, weight_sync=sync)
    model, _ = load_model_and_tokenizer(tiny_model_dir)
    try:
        for version in (1, 2, 3):
            await router.update_weights(model.state_dict(), version)
        assert [e.weight_version for e in engines] == [3, 3] and not any(e.paused for e in engines)
        assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v3"]  # older versions removed
        generation = await router.generate(PROMPT, SHORT, "g1-x-0-1")
        assert set(generation.token_versions) == {3}
    finally:
        await router.close()


# --- launched servers ---------------------------------------------------------------------

FLOOD = textwrap.dedent(
    """
    import runpy, sys, threading, time
    line = "flood " * 170 + "\\n"
    sys.stderr.write(line * 4096)  # ~4 MiB before serving: an unread pipe would block here for good
    sys.stderr.flush()
    def keep_flooding():
        while True:
            sys.stderr.write(line * 16)
            sys.stderr.flush()
            time.sleep(0.05)
    threading.Thread(target=keep_flooding, daemon=True).start()
    sys.argv = ["rollhub", *sys.argv[1:]]
    runpy.run_module("rollhub.cli", run_name="__main__")
    """
)


def _launch_config(script: Path, **extra: object) -> EngineConfig:
    template = (
        f"{{python}} {script} serve --model {{model}} --host {{host}} --port {{port}} --threads 1 "
        "--max-batch-size 8 --seed {seed}"
    )
    values = {"backend": "server", "launch": template, "replicas": 2, "watchdog_interval_s": 0.5}
    values |= {"watchdog_timeout_s": 2.0, **extra}
    return EngineConfig(**values)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped by whoever inherited it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def _seconds_until_down(engine: ServerEngine, index: int, limit_s: float = 60.0) -> float:
    started = time.monotonic()
    while engine.replicas[index].live and time.monotonic() - started < limit_s:
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def _pin_long_requests(engine: ServerEngine, count: int) -> tuple[list[asyncio.Future], int]:
    """`count` long requests of one group in flight; returns them and the index of their replica."""
    calls = [asyncio.ensure_future(engine.generate(PROMPT, LONG, f"g9-z-{k}-1")) for k in range(count)]
    for _ in range(200):
        await asyncio.sleep(0.05)
        loaded = [r for r in engine.replicas if r.in_flight]
        if loaded:
            return calls, engine.replicas.index(loaded[0])
    raise AssertionError("requests never reached a replica")


@pytest.mark.slow  # two launched servers: ~30 s on a loaded 2-core machine
async def test_launched_replicas_survive_a_stderr_flood_and_a_hung_one_is_routed_around(tiny_model_dir, tmp_path):
    script = tmp_path / "flood_serve.py"
    script.write_text(FLOOD)
    engine = build_engine(_launch_config(script), tiny_model_dir, run_dir=tmp_path / "run")
    try:
        await engine.start()
        logs = [s.log_path for s in engine.servers]
        assert all(p.parent == tmp_path / "run" / "servers" for p in logs)
        assert all(p.stat().st_size > 4 << 20 for p in logs)  # the flood went to files, and both serve
        warm = await asyncio.gather(*(engine.generate(PROMPT, SHORT, f"g{k}-a-0-1") for k in range(4)))
        assert all(len(g.token_ids) == 2 for g in warm)

        calls, hung = await _pin_long_requests(engine, 3)
        os.killpg(engine.servers[hung].pid, signal.SIGSTOP)  # wedged: the port is open, nothing answers
        detected_s = await _seconds_until_down(engine, hung)
        # /health missed twice at 2 s each, probed every 0.5 s: ~5 s, plus slack for a loaded machine
        assert detected_s < 15, detected_s
        results = await asyncio.wait_for(asyncio.gather(*calls), timeout=120)
        assert all(len(r.token_ids) == 400 for r in results)  # re-sent whole to the other replica
        assert "unanswered" in engine.replicas[hung].down_reason
        assert engine.stats.watchdog_detections == 1 and engine.stats.requests_rerouted == 3
        assert not _alive(engine.servers[hung].pid)  # a wedged replica is killed
        assert len((await engine.generate(PROMPT, SHORT, "g10-b-0-1")).token_ids) == 2
    finally:
        await engine.close()
    assert not any(_alive(s.pid) for s in engine.servers)


@pytest.mark.slow
async def test_a_launched_replica_that_dies_is_detected_and_its_requests_move(tiny_model_dir, tmp_path):
    config = EngineConfig(backend="server", launch="rollhub", replicas=2, watchdog_interval_s=0.5)
    engine = build_engine(config, tiny_model_dir, run_dir=tmp_path)
    try:
        await engine.start()
        calls, dying = await _pin_long_requests(engine, 3)
        os.kill(engine.servers[dying].pid, signal.SIGKILL)
        assert await _seconds_until_down(engine, dying) < 5  # a reset connection or the exit, whichever first
        results = await asyncio.wait_for(asyncio.gather(*calls), timeout=120)
        assert all(len(r.token_ids) == 400 for r in results)
        assert engine.stats.requests_rerouted == 3 and engine.replicas[dying].down_reason is not None
        assert engine.live_engine_ids == [engine.replicas[1 - dying].replica_id]
    finally:
        await engine.close()


@pytest.mark.slow
def test_launched_servers_die_with_a_killed_parent(tiny_model_dir, tmp_path):
    """kill -9 of the run: the parent-death signal takes its servers along."""
    pids = tmp_path / "pids"
    program = textwrap.dedent(
        f"""
        import asyncio, time
        from rollhub.inference.engines.build import EngineConfig, build_engine
        async def main():
            engine = build_engine(EngineConfig(backend="server", replicas=2), {str(tiny_model_dir)!r},
                                  run_dir={str(tmp_path)!r})
            await engine.start()
            open({str(pids)!r}, "w").write(" ".join(str(s.pid) for s in engine.servers))
            time.sleep(600)
        asyncio.run(main())
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", program])
    try:
        deadline = time.monotonic() + 300
        while not pids.exists() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
        servers = [int(p) for p in pids.read_text().split()]
        assert all(_alive(p) for p in servers)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in servers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in servers)


def test_a_server_that_cannot_start_is_a_user_error_with_its_log(tiny_model_dir, tmp_path):
    config = EngineConfig(backend="server", launch="{python} -c 'import sys; sys.exit(\"no GPU here\")' {port}")
    engine = build_engine(config, tiny_model_dir, run_dir=tmp_path)

    async def start() -> None:
        try:
            await engine.start()
        finally:
            await engine.close()

    with pytest.raises(UserError, match="(?s)did not start.*no GPU here"):
        asyncio.run(start())


async def test_attaching_where_nothing_listens_fails_at_once(tiny_model_dir, tmp_path):
    config = EngineConfig(backend="server", urls=["http://127.0.0.1:1"])
    engine = build_engine(config, tiny_model_dir, run_dir=tmp_path)
    started = time.monotonic()
    try:
        with pytest.raises(UserError, match="no engine server at http://127.0.0.1:1"):
            await engine.start()
    finally:
        await engine.close()
    assert time.monotonic() - started < 10  # not the startup timeout meant for launched servers
