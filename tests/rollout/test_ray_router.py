"""EngineRouter over two real `rollhub serve` apps (no Ray needed), as the Ray shards use it:
affinity, balance, re-routing around a dead server, and exact versions across hold -> update
-> release."""

from __future__ import annotations

import asyncio

import pytest

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.router import EngineRouter, affinity_key

PROMPT = [1, 300, 301, 302, 2, 200, 17, 18]
SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0, stop_token_ids=(10**9,))


@pytest.fixture
async def servers(engine_apps):
    """Two HFEngines, each behind the SGLang-native app on its own port, named engine-0/1."""
    engines, runners, urls = engine_apps
    return engines, runners, {f"engine-{index}": url for index, url in enumerate(urls)}


def test_cluster_config_rejects_bad_values_as_user_errors():
    from rollhub.core.config import load_config
    from rollhub.core.errors import UserError
    from rollhub.trainer.config import RunConfig

    config = load_config(
        RunConfig,
        None,
        [
            "cluster.backend=ray",
            "cluster.num_env_shards=4",
            "cluster.shard_resources={sandbox_host: 1}",
            "engine.backend=server",
            "engine.placement=ray",
        ],
    )
    assert config.cluster.num_env_shards == 4 and config.cluster.shard_resources == {"sandbox_host": 1.0}
    assert load_config(RunConfig, None, []).cluster.backend == "local"
    for bad in ("cluster.backend=k8s", "cluster.num_env_shards=0", "cluster.max_replacements=-1"):
        with pytest.raises(UserError, match="cluster"):
            load_config(RunConfig, None, [bad])


@pytest.mark.parametrize(
    "old, new",
    [
        ("num_engines=2", "engine.replicas"),
        ("engine=sglang", "engine.launch"),
        ("engine_num_cpus=1", "engine.ray_num_cpus"),
        ("engine_num_gpus=1", "engine.ray_num_gpus"),
        ("engine_extra_args=[--tp, '2']", "engine.launch"),
        ("weights_dir=/shared/w", "engine.weights_dir"),
        ("keep_weight_versions=2", "engine.weights_dir"),
        ("health_interval_s=1", "engine.watchdog_interval_s"),
    ],
)
def test_the_old_cluster_engine_keys_are_refused_naming_the_new_key(old, new):
    """One line, naming where the setting lives now; in a YAML file as on the command line."""
    from rollhub.core.config import load_config
    from rollhub.core.errors import UserError
    from rollhub.trainer.config import RunConfig

    key = old.split("=")[0]
    with pytest.raises(UserError, match=f"config key 'cluster.{key}' is gone: use {new}") as caught:
        load_config(RunConfig, None, [f"cluster.{old}"])
    assert "\n" not in str(caught.value)


def test_affinity_key_is_the_group_id():
    assert affinity_key("g3-abc123-1-7", [1, 2]) == "g3-abc123"  # every member of a GRPO group on one server
    assert affinity_key(None, [1, 2, 3]) == affinity_key(None, [1, 2, 3])
    assert affinity_key(None, [1, 2, 3]) != affinity_key(None, [1, 2, 4])


async def test_turns_of_a_trajectory_stay_on_one_server_and_trajectories_spread(servers):
    engines, _, urls = servers
    router = EngineRouter(urls)
    try:
        # two trajectories start at once: least-loaded puts them on different servers
        await asyncio.gather(router.generate(PROMPT, SAMPLING, "trajA-0"), router.generate(PROMPT, SAMPLING, "trajB-0"))
        assert [e.stats.requests_finished for e in engines] == [1, 1]
        first = {e: e.stats.requests_finished for e in engines}
        for turn in range(1, 4):  # later turns of trajA follow its first turn
            await router.generate(PROMPT + [5] * turn, SAMPLING, f"trajA-{turn}")
        grown = [e.stats.requests_finished - first[e] for e in engines]
        assert sorted(grown) == [0, 3]
        assert router.stats.affinity_hits == 3
    finally:
        await router.close()


async def test_a_dead_server_is_routed_around_and_the_request_is_not_lost(servers):
    engines, runners, urls = servers
    router = EngineRouter(urls)
    try:
        await router.generate(PROMPT, SAMPLING, "trajA-0")
        pinned = next(i for i, e in enumerate(engines) if e.stats.requests_finished == 1)
        await runners[pinned].cleanup()  # the server of trajA goes away
        generation = await router.generate(PROMPT + [5], SAMPLING, "trajA-1")
        assert len(generation.token_ids) == 4 and len(generation.logprobs) == 4
        assert router.stats.requests_rerouted == 1
        assert router.live_engine_ids == [f"engine-{1 - pinned}"]
        # the replacement table drops the dead server; traffic keeps flowing
        router.set_engines({f"engine-{1 - pinned}": urls[f"engine-{1 - pinned}"]})
        assert router.engine_ids == [f"engine-{1 - pinned}"]
        await router.generate(PROMPT, SAMPLING, "trajB-0")
    finally:
        await router.close()


async def test_versions_are_exact_across_hold_update_release(servers, tiny_model_dir):
    """Requests submitted while held wait, and carry the new version once released."""
    engines, _, urls = servers
    router = EngineRouter(urls)
    try:
        before = await router.generate(PROMPT, SAMPLING, "trajA-0")
        assert set(before.token_versions) == {0}
        await router.pause()  # gate closed + servers paused
        waiting = asyncio.ensure_future(router.generate(PROMPT, SAMPLING, "trajA-1"))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await router.update_weights(str(tiny_model_dir), 1)
        assert [e.weight_version for e in engines] == [1, 1]
        await router.resume()
        after = await asyncio.wait_for(waiting, timeout=60)
        assert set(after.token_versions) == {1}
    finally:
        await router.close()
