"""`rollhub serve` and the Ray engine servers under hostile input: malformed requests get a
400 and never touch the engine (so requests batched with them are unharmed), servers bind
loopback / the node IP, and a bearer token guards every endpoint but /health."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from aiohttp import web

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine
from rollhub.inference.engines.sglang import SGLangEngine, SGLangError
from rollhub.inference.server import RequestError, build_app, limits_for, sampling_from_json

NO_STOP = [10**9]  # never matches: every good request runs to max_new_tokens
NEW_TOKENS = 8
KEY = "test-key-5e1f"
CONTROL_ENDPOINTS = [
    ("POST", "/generate"),
    ("POST", "/abort_request"),
    ("POST", "/pause_generation"),
    ("POST", "/continue_generation"),
    ("POST", "/update_weights_from_disk"),
    ("POST", "/init_weights_update_group"),
    ("POST", "/update_weights_from_distributed"),
    ("POST", "/destroy_weights_update_group"),
    ("POST", "/flush_cache"),
    ("GET", "/get_model_info"),
    ("GET", "/get_weight_version"),
    ("POST", "/update_weight_version"),
    ("GET", "/health_generate"),
    ("GET", "/v1/loads"),
]


async def _serve(engine: HFEngine, api_key: str | None = None) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(build_app(engine, api_key=api_key))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def served(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, threads=1, max_batch_size=32)
    runner, url = await _serve(engine)
    yield engine, url
    await runner.cleanup()


@pytest.fixture
async def served_with_key(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, threads=1)
    runner, url = await _serve(engine, api_key=KEY)
    yield engine, url
    await runner.cleanup()


def good_body(index: int) -> dict[str, Any]:
    prompt = [1, 40 + index, 200, 300 + index, 17] * (1 + index % 3)
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0.7, "sampling_seed": index, "stop_token_ids": NO_STOP}
    return {"input_ids": prompt, "sampling_params": params, "return_logprob": True, "rid": f"good-{index}"}


def bad_bodies(vocab: int) -> dict[str, Any]:
    """name -> raw JSON text of a request that must be refused with 400."""
    ok = {"max_new_tokens": 4}
    cases: dict[str, Any] = {
        "ids_are_a_string": {"input_ids": "abc", "sampling_params": ok},
        "id_equal_to_vocab": {"input_ids": [1, 2, vocab], "sampling_params": ok},
        "id_far_beyond_vocab": {"input_ids": [1, 10**12], "sampling_params": ok},
        "negative_id": {"input_ids": [5, -1, 7], "sampling_params": ok},
        "float_id": {"input_ids": [5, 1.5], "sampling_params": ok},
        "bool_id": {"input_ids": [True, 5], "sampling_params": ok},
        "empty_prompt": {"input_ids": [], "sampling_params": ok},
        "batch_with_one_bad_prompt": {"input_ids": [[1, 2, 3], [1, vocab + 3]], "sampling_params": ok},
        "batch_with_a_string_prompt": {"input_ids": [[1, 2, 3], "x"], "sampling_params": ok},
        "batch_with_an_empty_prompt": {"input_ids": [[1, 2, 3], []], "sampling_params": ok},
        "nan_temperature": {"input_ids": [1, 2], "sampling_params": {"temperature": math.nan}},
        "infinite_temperature": {"input_ids": [1, 2], "sampling_params": {"temperature": math.inf}},
        "negative_temperature": {"input_ids": [1, 2], "sampling_params": {"temperature": -0.5}},
        "string_temperature": {"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}},
        "zero_top_p": {"input_ids": [1, 2], "sampling_params": {"top_p": 0}},
        "top_p_above_one": {"input_ids": [1, 2], "sampling_params": {"top_p": 1.5}},
        "nan_top_p": {"input_ids": [1, 2], "sampling_params": {"top_p": math.nan}},
        "zero_top_k": {"input_ids": [1, 2], "sampling_params": {"top_k": 0}},
        "top_k_below_minus_one": {"input_ids": [1, 2], "sampling_params": {"top_k": -2}},
        "negative_max_new_tokens": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}},
        "huge_max_new_tokens": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10**9}},
        "string_max_new_tokens": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "5"}},
        "negative_stop_id": {"input_ids": [1, 2], "sampling_params": {"stop_token_ids": [-3]}},
        "negative_seed": {"input_ids": [1, 2], "sampling_params": {"sampling_seed": -1}},
        "sampling_params_a_list": {"input_ids": [1, 2], "sampling_params": [1]},
        "duplicate_rids": {"input_ids": [[1, 2], [3, 4]], "rid": ["r", "r"]},
        "rid_count_mismatch": {"input_ids": [[1, 2], [3, 4]], "rid": ["r1"]},
        "numeric_rid": {"input_ids": [1, 2], "rid": 7},
        "text_and_ids": {"input_ids": [1, 2], "text": "hi"},
        "neither_text_nor_ids": {"sampling_params": ok},
        "text_list_of_numbers": {"text": [1, 2]},
        "return_logprob_string": {"input_ids": [1, 2], "return_logprob": "yes"},
        "stream": {"input_ids": [1, 2], "stream": True},
    }
    raw = {name: json.dumps(body) for name, body in cases.items()}  # NaN/Infinity as Python's json writes them
    raw["json_array_body"] = "[1, 2, 3]"
    raw["json_string_body"] = '"generate"'
    raw["not_json"] = "input_ids=1,2"
    raw["over_long_integer"] = '{"input_ids": [' + "9" * 5000 + "]}"
    return raw


def direct_logprobs(model: Any, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, token]) for i, token in enumerate(output)]


async def post_raw(http: aiohttp.ClientSession, url: str, text: str) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    async with http.post(url + "/generate", data=text.encode(), headers=headers) as response:
        return response.status, await response.json(content_type=None)


async def test_bad_requests_get_400_and_every_concurrent_good_request_completes_correctly(served):
    engine, url = served
    vocab = limits_for(engine).vocab_size
    bad = bad_bodies(vocab)
    async with aiohttp.ClientSession() as http:

        async def good(index: int) -> dict[str, Any]:
            await asyncio.sleep(0.01 * index)  # joins a batch that is already decoding
            async with http.post(url + "/generate", json=good_body(index)) as response:
                assert response.status == 200, await response.text()
                return await response.json()

        async def hostile(index: int, text: str) -> tuple[int, Any]:
            await asyncio.sleep(0.005 * index)  # arrives while good requests are in the batch
            return await post_raw(http, url, text)

        goods = [asyncio.create_task(good(i)) for i in range(12)]
        answers = await asyncio.gather(*(hostile(i, text) for i, text in enumerate(bad.values())))
        replies = await asyncio.gather(*goods)

    for name, (status, reply) in zip(bad, answers):
        assert status == 400, (name, reply)
        assert isinstance(reply["error"]["message"], str) and reply["error"]["message"], name
    assert engine.stats.mean_batch_size > 1.0  # the good requests really shared decode steps
    for index, reply in enumerate(replies):
        meta = reply["meta_info"]
        assert meta["id"] == f"good-{index}"
        assert meta["finish_reason"] == {"type": "length", "length": NEW_TOKENS}
        tokens = reply["output_ids"]
        assert len(tokens) == NEW_TOKENS and all(0 <= t < vocab for t in tokens)
        reference = direct_logprobs(engine.model, good_body(index)["input_ids"], tokens, temperature=0.7)
        assert [t[0] for t in meta["output_token_logprobs"]] == pytest.approx(reference, abs=1e-4)
    assert engine.num_in_flight == 0


@pytest.mark.parametrize(
    "message_part, body",
    [
        ("token ids must be integers in [0,", {"input_ids": [1, 10**6]}),
        ("temperature must be a finite number", {"input_ids": [1], "sampling_params": {"temperature": math.nan}}),
        ("top_p must be in (0, 1]", {"input_ids": [1], "sampling_params": {"top_p": 2}}),
        ("must be a JSON object", [1, 2]),
    ],
)
async def test_the_400_says_what_is_wrong(served, message_part, body):
    _, url = served
    async with aiohttp.ClientSession() as http:
        status, reply = await post_raw(http, url, json.dumps(body))
    assert status == 400 and message_part in reply["error"]["message"]


async def test_json_arrays_and_bad_values_on_control_endpoints_are_400_not_500(served):
    engine, url = served
    async with aiohttp.ClientSession() as http:
        for path in (
            "/abort_request",
            "/pause_generation",
            "/update_weights_from_disk",
            "/update_weight_version",
            "/init_weights_update_group",
            "/update_weights_from_distributed",
            "/destroy_weights_update_group",
        ):
            async with http.post(url + path, data=b"[1, 2]", headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400, path
                assert "JSON object" in (await r.json())["error"]["message"]
        for body in ({}, {"new_version": "v2"}, {"new_version": -1}, {"new_version": True}):
            async with http.post(url + "/update_weight_version", json=body) as response:
                assert response.status == 400, body
        async with http.post(url + "/abort_request", json={"rid": ["a"]}) as response:
            assert response.status == 400
        async with http.post(url + "/update_weights_from_disk", json={"model_path": ["x"]}) as response:
            assert response.status == 400
        async with http.post(url + "/update_weight_version", json={"new_version": "7"}) as response:
            assert response.status == 200
    assert engine.weight_version == 7 and not engine.paused


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": math.nan},
        {"temperature": -math.inf},
        {"top_p": 0.0},
        {"top_p": math.nan},
        {"top_k": 0},
        {"top_k": 1.5},
        {"max_new_tokens": -1},
        {"max_new_tokens": 2.0},
        {"max_new_tokens": (1 << 20) + 1},
        {"stop_token_ids": "2"},
        {"stop_token_ids": [1.0]},
        {"sampling_seed": 1 << 63},
        {"sampling_seed": "1"},
    ],
)
def test_sampling_values_are_checked_before_the_engine(params):
    with pytest.raises(RequestError):
        sampling_from_json(params)


def test_valid_sampling_values_pass_and_tiny_temperatures_mean_greedy():
    params = {"max_new_tokens": 0, "temperature": 1e-9, "top_p": 1, "top_k": -1, "stop_token_ids": [10**9]}
    sampling = sampling_from_json({**params, "sampling_seed": 3, "unknown_sglang_key": 1})
    assert sampling == SamplingParams(max_new_tokens=0, temperature=0.0, top_p=1.0, stop_token_ids=(10**9,), seed=3)
    assert sampling_from_json(None) == SamplingParams()


async def test_api_key_guards_every_endpoint_but_health(served_with_key):
    _, url = served_with_key
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/health") as response:
            assert response.status == 200
        for method, path in CONTROL_ENDPOINTS:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"X-Api-Key": KEY}):
                async with http.request(method, url + path, json={}, headers=headers) as response:
                    assert response.status == 401, (path, headers)
                    assert response.headers["WWW-Authenticate"] == "Bearer"
                    assert "bearer token" in (await response.json())["error"]["message"]
        good = {"Authorization": f"Bearer {KEY}"}
        async with http.get(url + "/get_weight_version", headers=good) as response:
            assert response.status == 200 and (await response.json())["weight_version"] == "0"
        non_ascii = {"Authorization": "Bearer \u00e9t\u00e9"}  # a wrong token, not a 500 from the comparison
        async with http.post(url + "/generate", json={"input_ids": [1, 2]}, headers=non_ascii) as response:
            assert response.status == 401


async def test_clients_send_the_key_given_or_from_the_environment(served_with_key, monkeypatch):
    from rollhub.inference.engines.router import EngineRouter

    _, url = served_with_key
    sampling = SamplingParams(max_new_tokens=2, stop_token_ids=tuple(NO_STOP))
    monkeypatch.delenv("ROLLHUB_API_KEY", raising=False)
    anonymous = SGLangEngine(url)
    with pytest.raises(SGLangError, match="401"):
        await anonymous.generate([1, 2, 3], sampling)
    assert await anonymous.healthy()  # /health stays open for liveness probes
    await anonymous.close()
    for client in (SGLangEngine(url, api_key=KEY), EngineRouter({"e0": url}, api_key=KEY)):
        assert len((await client.generate([1, 2, 3], sampling, request_id="t-1")).token_ids) == 2
        await client.close()
    monkeypatch.setenv("ROLLHUB_API_KEY", KEY)
    from_env = SGLangEngine(url)
    assert await from_env.server_weight_version() == "0"
    await from_env.close()


def test_serve_listens_on_loopback_by_default_and_takes_an_api_key():
    from rollhub.cli import build_parser

    defaults = build_parser().parse_args(["serve", "--model", "m"])
    assert defaults.host == "127.0.0.1" and defaults.api_key is None
    given = build_parser().parse_args(["serve", "--model", "m", "--api-key", "k", "--host", "0.0.0.0"])
    assert given.api_key == "k" and given.host == "0.0.0.0"


def listening_addresses(port: int) -> set[str]:
    """Local addresses of this network namespace's TCP sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if int(port_hex, 16) != port or fields[3] != "0A":  # 0A = LISTEN
                continue
            raw = bytes.fromhex(address)
            if len(raw) == 4:
                found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


@pytest.mark.slow  # a fresh Python + transformers import: ~10-40 s on 2 shared cores
async def test_rollhub_serve_process_requires_the_key_from_the_environment(tiny_model_dir, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "rollhub.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port)]
    monkeypatch.delenv("ROLLHUB_API_KEY", raising=False)
    engine = await SGLangEngine.launch(str(tiny_model_dir), port=port, command=command, api_key=KEY)
    try:
        assert listening_addresses(port) == {"127.0.0.1"}
        assert len((await engine.generate([1, 2], SamplingParams(max_new_tokens=1))).token_ids) == 1
        anonymous = SGLangEngine(engine.url, api_key="")
        with pytest.raises(SGLangError, match="401"):
            await anonymous.server_weight_version()
        await anonymous.close()
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def loopback_ray():
    """A local Ray whose node IP is loopback, so the tests never leave 127.0.0.1."""
    ray = pytest.importorskip("ray", reason="needs the 'ray' extra: pip install -e '.[ray]'")
    from ray._private import ray_constants

    if ray.is_initialized():
        pytest.skip("Ray already initialised by another test module")
    with pytest.MonkeyPatch.context() as patch:
        # Ray turns "127.0.0.1" into the host's outward IP unless it thinks clusters are off
        # (its macOS mode); the node IP is fixed at init, and workers read it from the node
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


async def test_ray_engine_servers_bind_the_node_ip_and_require_the_runs_key(
    loopback_ray, tiny_model_dir, tmp_path, monkeypatch
):
    """Driver -> engine server (key as an argument) and driver -> shard (key in its
    environment): a group completes only if the shard's router authenticates."""
    from rollhub.rollout.agent import AgentConfig
    from rollhub.rollout.cluster.backend import RayRollout
    from rollhub.rollout.cluster.config import ClusterConfig
    from rollhub.rollout.config import EnvConfig, RolloutConfig

    monkeypatch.delenv("ROLLHUB_API_KEY", raising=False)
    env = EnvConfig(id="rollhub/Sokoban-v0", kwargs={"max_steps": 2})
    sections = {"env": env, "rollout": RolloutConfig(group_size=1), "agent": AgentConfig(max_new_tokens=4)}
    cluster = ClusterConfig(backend="ray", num_env_shards=1, max_replacements=0)
    rollout = RayRollout(tiny_model_dir, cluster, **sections, run_dir=tmp_path)  # the default fleet: 1 server on Ray
    try:
        (group,) = await asyncio.wait_for(rollout.collect_batch(1), timeout=300)
        assert rollout.ledger.groups_failed == 0 and len(group.trajectories) == 1
        assert group.trajectories[0].info["cluster_node"]
        url = rollout._engine_urls()["replica-0"]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        assert host == loopback_ray.util.get_node_ip_address() == "127.0.0.1"
        assert listening_addresses(int(port)) == {"127.0.0.1"}  # not 0.0.0.0
        anonymous = SGLangEngine(url, api_key="")
        with pytest.raises(SGLangError, match="401"):
            await anonymous.generate([1, 2], SamplingParams(max_new_tokens=1))
        await anonymous.close()
        assert len(rollout._api_key) >= 32 and "ROLLHUB_API_KEY" not in os.environ
    finally:
        await rollout.close()
