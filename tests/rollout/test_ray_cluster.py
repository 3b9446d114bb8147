"""cluster.backend=ray on a local Ray cluster (2 CPUs): 2 env shards + 2 `rollhub serve`
engines. A short async Sokoban training through the real CLI survives a shard kill; the
rollout's accounting matches the single-process backend's, with faults injected."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="cluster.backend=ray needs the 'ray' extra: pip install -e '.[ray]'")

from rollout_testing import sections  # noqa: E402

from rollhub.inference.engines.build import EngineConfig  # noqa: E402
from rollhub.rollout.agent import AgentConfig  # noqa: E402
from rollhub.rollout.buffer import GroupBuffer  # noqa: E402
from rollhub.rollout.cluster.backend import RayRollout  # noqa: E402
from rollhub.rollout.cluster.config import ClusterConfig  # noqa: E402
from rollhub.rollout.manager import EnvManager  # noqa: E402

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]
GROUP_SIZE, BATCH, ALPHA, STEPS = 2, 2, 1.0, 3


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _kill_first_shard_once_a_group_is_done(run_dir: Path, outcome: dict, deadline_s: float = 600.0) -> None:
    """Test thread: wait until the run has finished a group, then kill shard-0."""
    trajectories = run_dir / "trajectories.jsonl"
    stop_at = time.monotonic() + deadline_s
    while time.monotonic() < stop_at:
        names = [n for n in ray.util.list_named_actors() if ".shard-0." in n]
        if names and trajectories.exists() and trajectories.stat().st_size > 0:
            ray.kill(ray.get_actor(names[0]))
            outcome["killed"] = names[0]
            return
        time.sleep(0.2)


def test_rollhub_train_with_ray_backend_survives_a_shard_kill(ray_cluster, tiny_model_dir, tmp_path):
    from rollhub.cli import main

    run_dir = tmp_path / "run"
    outcome: dict = {}
    killer = threading.Thread(target=_kill_first_shard_once_a_group_is_done, args=(run_dir, outcome), daemon=True)
    killer.start()
    code = main(
        [
            "train",
            str(REPO / "configs" / "sokoban_tiny.yaml"),
            "--no-progress",
            "--set",
            f"run_dir={run_dir}",
            "--set",
            f"model.path={tiny_model_dir}",
            "--set",
            "sft.enabled=false",
            "--set",
            f"train.steps={STEPS}",
            "--set",
            "train.checkpoint_every=0",
            "--set",
            "eval.episodes=2",
            "--set",
            "eval.select.episodes=0",
            "--set",
            "env.kwargs={dim: 6, num_boxes: 1, max_steps: 4}",
            "--set",
            "agent.max_new_tokens=8",
            "--set",
            f"rollout.group_size={GROUP_SIZE}",
            "--set",
            f"rollout.groups_per_batch={BATCH}",
            "--set",
            f"rollout.async_ratio={ALPHA}",
            "--set",
            "cluster.backend=ray",
            "--set",
            "cluster.num_env_shards=2",
            "--set",
            "engine.backend=server",
            "--set",
            "engine.placement=ray",
            "--set",
            "engine.replicas=2",
        ]
    )
    killer.join(timeout=5)
    assert code == 0
    assert outcome.get("killed"), "the shard was never killed"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "cluster/groups_dispatched" in r][-1]
    assert last["policy/version"] == STEPS
    assert last["buffer/consumed_groups"] == STEPS * BATCH
    assert last["cluster/shards_replaced"] == 1
    assert last["cluster/groups_lost"] >= 1
    assert last["cluster/trajectories_lost"] == GROUP_SIZE * last["cluster/groups_lost"]
    settled = (
        last["cluster/groups_completed"]
        + last["cluster/groups_lost"]
        + last["cluster/groups_failed"]
        + last["cluster/groups_cancelled"]
    )
    assert last["cluster/groups_dispatched"] == settled + last["cluster/groups_running"]
    # tokens older than ceil(alpha) are trained only inside groups the newest-token rule kept
    # (rollout.staleness_rule: newest, the default), and those are counted
    assert last["staleness/max"] <= math.ceil(ALPHA) or last["staleness/kept_by_token_rule"] > 0
    assert (run_dir / "weights").is_dir() and (run_dir / "final_model" / "config.json").exists()


async def _consume(producer, buffer: GroupBuffer, weights: dict, faults=None) -> list:
    """The trainer's side: STEPS batches, a weight push after each, faults injected on the way."""
    stop = asyncio.Event()
    running = asyncio.ensure_future(producer.run(stop))
    consumed = []
    try:
        for version in range(STEPS):
            if faults is not None:
                await faults(version)
            batch = await asyncio.wait_for(buffer.get_batch(version), timeout=600)
            consumed.append((version, batch))
            await producer.update_weights(weights, version + 1)
    finally:
        stop.set()
        await running
        await producer.close()
    return consumed


def _check_consumed(consumed: list, buffer: GroupBuffer) -> None:
    assert len(consumed) == STEPS
    for version, batch in consumed:
        assert len(batch) == BATCH
        for group in batch:
            assert len(group.trajectories) == GROUP_SIZE
            assert len({t.seed for t in group.trajectories}) == 1
            tokens = [v for t in group.trajectories for turn in t.turns for v in turn.token_versions]
            assert tokens and max(tokens) <= version and version - min(tokens) <= math.ceil(ALPHA)
    assert buffer.put_groups == buffer.consumed_groups + buffer.dropped_stale + buffer.buffered
    assert buffer.peak_occupancy <= buffer.capacity


async def test_ray_accounting_matches_single_process_with_faults(ray_cluster, tiny_model_dir, tmp_path):
    from rollhub.inference.engines.hf import HFEngine
    from rollhub.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    config = sections(
        "rollhub/Sokoban-v0", env_kwargs={"max_steps": 4}, group_size=GROUP_SIZE, agent=AgentConfig(max_new_tokens=8)
    )

    # single process: one EnvManager, in-process engine
    engine = HFEngine(model, tokenizer, threads=1)
    local_buffer = GroupBuffer(BATCH, ALPHA)
    manager = EnvManager(engine, tokenizer, **config, buffer=local_buffer)
    try:
        local = await _consume(manager, local_buffer, weights)
    finally:
        await engine.close()
    _check_consumed(local, local_buffer)
    assert manager.metrics.groups_done == local_buffer.put_groups
    assert manager.metrics.trajectories_kept == GROUP_SIZE * manager.metrics.groups_done

    # Ray: shard 1 dies while it runs groups; engine 0 dies after the first batch
    cluster = ClusterConfig(backend="ray", num_env_shards=2)
    fleet = EngineConfig(backend="server", placement="ray", replicas=2, watchdog_interval_s=0.5, max_replacements=2)
    ray_buffer = GroupBuffer(BATCH, ALPHA)
    rollout = RayRollout(tiny_model_dir, cluster, **config, engine=fleet, buffer=ray_buffer, run_dir=tmp_path)
    await rollout.start()
    killed_running: list[int] = []

    async def faults(version: int) -> None:
        if version == 0:  # as soon as the buffer's capacity is dispatched (both shards busy)
            while rollout.ledger.groups_dispatched < ray_buffer.capacity:
                await asyncio.sleep(0.01)
            killed_running.append(rollout.kill_shard(1))
        if version == 1:
            rollout.kill_engine(0)

    remote = await _consume(rollout, ray_buffer, weights, faults)
    _check_consumed(remote, ray_buffer)
    trajectories = [t for _, batch in remote for g in batch for t in g.trajectories]
    assert all(t.info["cluster_shard"].startswith("shard-") and t.info["cluster_node"] for t in trajectories)
    ledger = rollout.ledger
    assert ledger.groups_completed == ray_buffer.put_groups
    assert (
        ledger.groups_dispatched
        == ledger.groups_completed + ledger.groups_lost + ledger.groups_failed + ledger.groups_cancelled
    )
    assert ledger.groups_failed == 0
    assert ledger.shards_replaced == 1 and ledger.engines_replaced == 1
    assert 1 <= ledger.groups_lost <= killed_running[0]  # lost: exactly the groups the dead shard was running
    assert ledger.trajectories_lost == GROUP_SIZE * ledger.groups_lost
    assert ledger.weight_pushes == STEPS
    summary = rollout.summary()
    assert summary["cluster/groups_running"] == 0
    assert not [n for n in ray.util.list_named_actors() if n.startswith(rollout.name_prefix)], "actors left behind"
