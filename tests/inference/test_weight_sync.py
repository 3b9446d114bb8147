"""Weight sync to servers over both SGLang protocols (rollhub/inference/weight_sync.py).

The collective path runs against a real second process (`rollhub serve` started here), so
the rendezvous, the gloo group and every broadcast cross a process boundary as they do with
SGLang. Correctness is checked by what the server computes: after a push, the log-probs it
returns must be those of a local model holding the pushed weights, and every token must
carry the pushed version. Hostile requests run against the server app in this process
(fast), each with a fresh engine so no test sees another's weights.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from aiohttp import web

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine
from rollhub.inference.engines.sglang import SGLangEngine
from rollhub.inference.server import build_app
from rollhub.inference.weight_sync import (
    DiskWeightSync,
    DistributedWeightSync,
    UpdateGroup,
    WeightSyncError,
    build_weight_sync,
    dtype_name,
    parse_dtype,
    unique_tensors,
)

KEY = "weight-sync-test-key"
SERVER_TIMEOUT_S = 4.0  # the server's bound on a broadcast that never comes
NO_STOP = (10**9,)
PROMPT = [1, 300, 301, 302, 2, 17]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _perturbed(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """The model's weights plus seeded noise: a policy no server has seen yet."""
    from safetensors.torch import load_file

    generator = torch.Generator().manual_seed(seed)
    state = load_file(str(model_dir / "model.safetensors"))
    state = {name: t + 0.02 * torch.randn(t.shape, generator=generator) for name, t in state.items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()  # as Policy.engine_state_dict has it
    return state


def _reference_logprobs(model_dir: Path, state: dict[str, torch.Tensor], output: list[int]) -> list[float]:
    """log_softmax of a local copy holding `state`, at the tokens the server produced (T = 1)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(state, strict=False)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + output])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(PROMPT) - 1 + i, token]) for i, token in enumerate(output)]


async def _generate(client: SGLangEngine, seed: int = 3) -> Any:
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=NO_STOP, seed=seed)
    return await client.generate(PROMPT, sampling)


async def _assert_serves(client: SGLangEngine, model_dir: Path, state: dict[str, torch.Tensor], version: int) -> None:
    generation = await _generate(client)
    assert generation.token_versions == [version] * len(generation.token_ids) and generation.token_ids
    assert generation.meta["server_weight_version"] == str(version)
    assert await client.server_weight_version() == str(version)
    reference = _reference_logprobs(model_dir, state, generation.token_ids)
    assert generation.logprobs == pytest.approx(reference, abs=1e-4)


# --- a real `rollhub serve` process -----------------------------------------------------------


@pytest.fixture(scope="module")
def serve_process(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """`python -m rollhub.cli serve` with an API key, logging to a file; yields its URL."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [
        sys.executable,
        "-m",
        "rollhub.cli",
        "serve",
        "--model",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--weight-sync-timeout-s",
        str(SERVER_TIMEOUT_S),
    ]
    env = {**os.environ, "ROLLHUB_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"rollhub serve exited with {process.returncode}: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"rollhub serve not healthy after 180 s: {log_path.read_text()[-2000:]}")
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_distributed_push_reaches_a_serve_process_and_every_token_carries_the_version(
    serve_process, tiny_model_dir
):
    client = SGLangEngine(serve_process, api_key=KEY)
    sync = DistributedWeightSync(backend="gloo", timeout_s=30)
    try:
        first = _perturbed(tiny_model_dir, seed=1)
        timings = await sync.push([client], first, 1)
        assert timings["method"] == "distributed" and timings["backend"] == "gloo" and timings["group_s"] > 0
        assert timings["tensors"] == len(first) - 1  # the tied lm_head rides on the embedding
        await _assert_serves(client, tiny_model_dir, first, 1)

        second = _perturbed(tiny_model_dir, seed=2)
        timings = await sync.push([client], second, 2)
        assert timings["group_s"] == 0.0  # the group is formed once and kept
        await _assert_serves(client, tiny_model_dir, second, 2)
        assert not torch.distributed.is_initialized()  # the default group was never touched
    finally:
        await sync.close([client])
        await client.close()


async def test_disk_push_to_a_serve_process_writes_versions_atomically_and_removes_old_ones(
    serve_process, tiny_model_dir, tmp_path
):
    client = SGLangEngine(serve_process, api_key=KEY)
    sync = DiskWeightSync(tmp_path / "weights")
    try:
        for version, seed in ((5, 5), (6, 6)):
            state = _perturbed(tiny_model_dir, seed=seed)
            timings = await sync.push([client], state, version)
            assert timings["method"] == "disk" and timings["path"] == str(tmp_path / "weights" / f"v{version}")
            assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == [f"v{version}"]
            await _assert_serves(client, tiny_model_dir, state, version)
        # a server that refuses (a tensor its model does not have) keeps every folder it may still need
        bad = {**_perturbed(tiny_model_dir, seed=7), "model.not_a_layer.weight": torch.zeros(2)}
        with pytest.raises(WeightSyncError, match="update_weights_from_disk failed on 1 of 1"):
            await sync.push([client], bad, 7)
        assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v6", "v7"]
        assert await client.server_weight_version() == "6"
    finally:
        await client.close()


# --- hostile input, against the app in this process -----------------------------------------


@pytest.fixture
async def served(tiny_model_dir):
    """A fresh engine (its own weights) behind the app, with the API key and a short timeout."""
    engine = HFEngine(str(tiny_model_dir), threads=1)
    runner = web.AppRunner(build_app(engine, api_key=KEY, weight_sync_timeout_s=SERVER_TIMEOUT_S))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    client = SGLangEngine(url, api_key=KEY)
    yield engine, url, client
    await client.close()
    await runner.cleanup()


def _init_body(**changes: Any) -> dict[str, Any]:
    body = {
        "master_address": "127.0.0.1",
        "master_port": 29500,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "g",
        "backend": "gloo",
    }
    return {**body, **changes}


async def _post(url: str, path: str, body: Any, key: str | None = KEY) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, json=body, headers=headers) as response:
            return response.status, await response.json(content_type=None)


BAD_INITS = [
    (_init_body(master_port=0), "master_port must be an integer in [1, 65535]"),
    (_init_body(master_port="29500"), "master_port must be an integer"),
    (_init_body(world_size=1), "world_size must be an integer in [2,"),
    (_init_body(rank_offset=0), "rank_offset must be an integer in [1, 1]"),
    (_init_body(rank_offset=2), "rank_offset must be an integer in [1, 1]"),
    (_init_body(world_size=10**9), "world_size must be an integer"),
    (_init_body(master_address="a b"), "master_address must be"),
    (_init_body(master_address=["x"]), "master_address must be"),
    (_init_body(group_name="../etc"), "group_name must match"),
    (_init_body(backend="mpi"), "backend must be 'gloo' or 'nccl'"),
    (_init_body(backend="nccl"), "needs a GPU engine"),
]


async def test_bad_group_inits_are_refused_with_the_reason(served):
    engine, url, _ = served
    for body, message in BAD_INITS:
        status, reply = await _post(url, "/init_weights_update_group", body)
        assert status == 400 and message in reply["error"]["message"], reply
    status, reply = await _post(url, "/update_weights_from_distributed", {"names": ["x"], "dtypes": [], "shapes": []})
    assert status == 400 and "call /init_weights_update_group first" in reply["error"]["message"]
    assert engine.weight_version == 0


async def test_weight_endpoints_require_the_api_key(served):
    _, url, _ = served
    for path in ("/init_weights_update_group", "/update_weights_from_distributed", "/destroy_weights_update_group"):
        for key in (None, "wrong"):
            status, reply = await _post(url, path, _init_body(), key=key)
            assert status == 401, (path, key, reply)


async def test_updates_are_checked_against_the_model_before_receiving_and_a_refusal_fails_the_push_fast(
    served, tiny_model_dir
):
    engine, url, client = served
    sync = DistributedWeightSync(backend="gloo", timeout_s=60)
    await sync.push([client], _perturbed(tiny_model_dir, seed=1), 1)
    name, tensor = "model.layers.0.mlp.up_proj.weight", engine.model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    shape = list(tensor.shape)
    bad = {
        "unknown name": ({"names": ["model.evil"], "dtypes": ["float32"], "shapes": [[1]]}, "unknown parameter"),
        "wrong shape": ({"names": [name], "dtypes": ["float32"], "shapes": [[1, 1]]}, "shape of"),
        "huge shape": ({"names": [name], "dtypes": ["float32"], "shapes": [[10**12, 10**12]]}, "shape of"),
        "integer dtype": ({"names": [name], "dtypes": ["int64"], "shapes": [shape]}, "dtype must be one of"),
        "repeated name": ({"names": [name, name], "dtypes": ["float32"] * 2, "shapes": [shape] * 2}, "not repeat"),
        "length mismatch": ({"names": [name], "dtypes": [], "shapes": [shape]}, "equal length"),
        "names not a list": ({"names": name, "dtypes": ["float32"], "shapes": [shape]}, "must be lists"),
    }
    for case, (body, message) in bad.items():
        await sync.push([client], _perturbed(tiny_model_dir, seed=2), 2)  # a group to refuse inside
        before = engine.model.state_dict()[name].clone()
        await client.begin_weight_update()
        status, reply = await _post(url, "/update_weights_from_distributed", {**body, "group_name": sync.group_name})
        await client.end_weight_update()
        assert status == 400 and message in reply["error"]["message"], (case, reply)
        assert torch.equal(engine.model.state_dict()[name], before) and engine.weight_version == 2
        assert "group was dropped" in reply["error"]["message"]  # rank 0 must not wait for its timeout
        sync._group.close()  # our side of the group the server just left
        sync._group = None

    # a trainer whose model does not match the server's: the push fails at once, not after the 60 s timeout
    mismatched = _perturbed(tiny_model_dir, seed=3)
    mismatched[name] = torch.zeros(3, 3)
    started = time.perf_counter()
    with pytest.raises(WeightSyncError, match="shape of"):
        await sync.push([client], mismatched, 3)
    assert time.perf_counter() - started < 10 and engine.weight_version == 2
    good = _perturbed(tiny_model_dir, seed=4)
    timings = await sync.push([client], good, 4)  # the next push forms a fresh group
    assert timings["group_s"] > 0 and engine.weight_version == 4
    assert torch.equal(engine.model.state_dict()[name], good[name])
    await sync.close([client])


async def test_a_second_init_and_an_init_while_busy_are_refused_and_a_missing_broadcast_times_out(
    served, tiny_model_dir
):
    engine, url, client = served
    sync = DistributedWeightSync(backend="gloo", timeout_s=60)
    await sync.push([client], _perturbed(tiny_model_dir, seed=1), 1)
    status, reply = await _post(url, "/init_weights_update_group", _init_body())
    assert status == 400 and "already in weight update group" in reply["error"]["message"]

    # an update whose broadcast never comes (rank 0 stays silent): the server waits, then gives up
    name = "model.norm.weight"
    body = {"names": [name], "dtypes": ["float32"], "shapes": [[256]], "group_name": sync.group_name}
    started = time.perf_counter()
    await client.begin_weight_update()
    waiting = asyncio.create_task(_post(url, "/update_weights_from_distributed", body))
    await asyncio.sleep(0.5)
    status, reply = await _post(url, "/init_weights_update_group", _init_body())
    assert status == 400 and "weight operation is running" in reply["error"]["message"]
    generation = await _generate(client)  # generation goes on while the server waits for bytes
    assert generation.token_versions == [1] * len(generation.token_ids)
    status, reply = await waiting
    elapsed = time.perf_counter() - started
    assert status == 400 and "receiving weights failed" in reply["message"] and not reply["success"]
    assert SERVER_TIMEOUT_S - 0.5 < elapsed < SERVER_TIMEOUT_S + 10
    assert engine.weight_version == 1 and (await client.server_weight_version()) == "1"

    sync._group.close()  # the trainer side learns of the failure on its next push in real runs
    sync._group = None
    state = _perturbed(tiny_model_dir, seed=9)
    timings = await sync.push([client], state, 2)  # the server dropped its group: a fresh one forms
    assert timings["group_s"] > 0 and engine.weight_version == 2
    await sync.close([client])
    status, reply = await _post(url, "/destroy_weights_update_group", {"group_name": sync.group_name})
    assert status == 400 and "no weight update group" in reply["message"]


async def test_two_replicas_then_one_after_the_other_goes_away(served, tiny_model_dir):
    """World size follows the replica set: 1 + 2 servers, then a fresh group of 1 + 1."""
    engine, _, client = served
    other_engine = HFEngine(str(tiny_model_dir), threads=1)
    runner = web.AppRunner(build_app(other_engine, api_key=KEY, weight_sync_timeout_s=SERVER_TIMEOUT_S))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    other = SGLangEngine(f"http://127.0.0.1:{runner.addresses[0][1]}", api_key=KEY)
    sync = DistributedWeightSync(backend="gloo", timeout_s=30)
    state = _perturbed(tiny_model_dir, seed=1)
    timings = await sync.push([client, other], state, 1)
    assert timings["servers"] == 2 and engine.weight_version == other_engine.weight_version == 1
    for served_engine in (engine, other_engine):
        assert torch.equal(served_engine.model.state_dict()["model.norm.weight"], state["model.norm.weight"])
    await other.close()
    await runner.cleanup()  # the replica goes away (its side of the group with it)
    timings = await sync.push([client], _perturbed(tiny_model_dir, seed=2), 2)
    assert timings["servers"] == 1 and timings["group_s"] > 0 and engine.weight_version == 2
    await sync.close([client])


async def test_the_update_group_lives_beside_a_default_torch_distributed_group(served, tiny_model_dir, tmp_path):
    """A trainer that is itself a torch.distributed rank: its default group is untouched."""
    import torch.distributed as dist

    _, _, client = served
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        sync = DistributedWeightSync(backend="gloo", timeout_s=30)
        await sync.push([client], _perturbed(tiny_model_dir, seed=1), 1)
        value = torch.ones(3)
        dist.all_reduce(value)  # the default group still works and still has one rank
        assert dist.get_world_size() == 1 and value.tolist() == [1.0, 1.0, 1.0]
        await sync.close([client])
    finally:
        dist.destroy_process_group()


def test_a_receiver_that_builds_its_group_the_way_sglang_does_meets_our_trainer_side():
    """SGLang's receiver joins with a `tcp://` store prefixed by the group name and torch's own
    group helper; our rank 0 must land on the same store keys, or a real SGLang server would
    wait for a trainer that never arrives (the same store and helper, gloo instead of NCCL)."""
    import datetime
    import threading
    import uuid

    import torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

    name = f"sglang-style-{uuid.uuid4().hex[:8]}"
    timeout = datetime.timedelta(seconds=30)
    store = UpdateGroup.host_store("127.0.0.1", 0, 2, 30)
    received: dict[str, Any] = {}

    def sglang_receiver() -> None:
        client_store = PrefixStore(name, dist.TCPStore("127.0.0.1", store.port, 2, is_master=False, timeout=timeout))
        group, _ = _new_process_group_helper(2, 1, [], Backend("gloo"), client_store, group_name=name, timeout=timeout)
        _world.pg_group_ranks[group] = {0: 0, 1: 1}
        buffer = torch.zeros(4, 3)
        dist.broadcast(buffer, src=0, group=group)
        received["tensor"] = buffer
        received["group"] = group

    receiver = threading.Thread(target=sglang_receiver)
    receiver.start()
    trainer = UpdateGroup.join(
        master_address="127.0.0.1",
        master_port=store.port,
        rank=0,
        world_size=2,
        group_name=name,
        backend="gloo",
        timeout_s=30,
        store=store,
    )
    sent = torch.arange(12.0).reshape(4, 3)
    trainer.broadcast(sent)
    receiver.join(60)
    assert torch.equal(received["tensor"], sent)
    trainer.close()
    dist.destroy_process_group(received["group"])


# --- pieces ---------------------------------------------------------------------------------


def test_tied_heads_and_shared_storage_are_sent_once():
    embedding = torch.randn(8, 4)
    state = {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding.clone(), "norm": torch.ones(4)}
    assert list(unique_tensors(state)) == ["model.embed_tokens.weight", "norm"]
    untied = {**state, "lm_head.weight": embedding + 1}
    assert list(unique_tensors(untied)) == ["model.embed_tokens.weight", "lm_head.weight", "norm"]
    shared = {"a": embedding, "b": embedding}
    assert list(unique_tensors(shared)) == ["a"]


def test_dtypes_names_and_configuration_are_checked():
    assert dtype_name(torch.bfloat16) == "bfloat16" and parse_dtype("torch.float16") is torch.float16
    for bad in ("int64", "bool", 5, None, "float64"):
        with pytest.raises(ValueError):
            parse_dtype(bad)
    with pytest.raises(ValueError, match="group_name"):
        DistributedWeightSync(group_name="a/b")
    with pytest.raises(ValueError, match="backend"):
        DistributedWeightSync(backend="mpi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weights_dir"):
        build_weight_sync("disk")
    with pytest.raises(ValueError, match="'disk', 'distributed' or 'lora_adapter'"):
        build_weight_sync("ipc")
    with pytest.raises(ValueError, match="weights_dir"):
        build_weight_sync("lora_adapter")
    assert isinstance(build_weight_sync("distributed", timeout_s=5), DistributedWeightSync)
    with pytest.raises(ValueError, match="backend"):
        UpdateGroup.join(
            master_address="127.0.0.1", master_port=1, rank=0, world_size=2, group_name="g", backend="x", timeout_s=1
        )


async def test_every_push_runs_inside_a_weight_update_session_and_closes_it(served, tiny_model_dir):
    """`rollhub serve` keeps SGLang 0.5.23's rule: no distributed update outside a session. A push
    opens one, and closes it whether it succeeds or fails, so the next push can open its own."""
    engine, url, client = served
    sync = DistributedWeightSync(backend="gloo", timeout_s=60)
    await sync.push([client], _perturbed(tiny_model_dir, seed=1), 1)
    assert client.weight_update_sessions is True
    status, reply = await _post(url, "/end_weight_update", {})
    assert status == 400 and "no weight-update session is open" in reply["message"]
    bad = _perturbed(tiny_model_dir, seed=2)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(WeightSyncError, match="shape of"):
        await sync.push([client], bad, 2)
    status, reply = await _post(url, "/end_weight_update", {})
    assert status == 400 and "no weight-update session is open" in reply["message"]
    await sync.push([client], _perturbed(tiny_model_dir, seed=3), 3)
    assert engine.weight_version == 3
    await sync.close([client])
