"""The SGLang server path as built for a GPU machine, checked on the CPU: the exact launch argv and
environment (dtype, GPUs, memory share), the weight update group's ranks and address, prompts at the
context length, and versions taken from the server's reply (tests/inference/sglang_stub.py)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from rollhub.core.errors import UserError
from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.build import EngineConfig, _build_server_engine, trainer_gpus
from rollhub.inference.engines.launcher import physical_gpus, plan_gpus
from rollhub.inference.engines.sglang import SGLangEngine
from rollhub.inference.weight_sync import DistributedWeightSync, WeightSyncError, check_master_address
from tests.inference.sglang_stub import StubState, start_stub


def _engine(tmp_path, monkeypatch, visible: int, **values):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    config = EngineConfig(backend="server", launch="sglang", **values)
    config.validate()
    return _build_server_engine(config, str(tmp_path / "model"), "cuda", tmp_path, visible_gpus=visible)


def test_sglang_argv_names_dtype_tp_and_each_replica_gets_gpus_the_trainer_does_not_use(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch, visible=5, replicas=2, tp=2, server_python="/venv/bin/python")
    command = engine.command_for(1, 30001)
    assert command == [
        "/venv/bin/python", "-m", "sglang.launch_server", "--model-path", str(tmp_path / "model"),
        "--host", "127.0.0.1", "--port", "30001", "--api-key", engine.api_key,
        "--random-seed", "1", "--dtype", "bfloat16", "--tp-size", "2",
    ]  # fmt: skip
    assert "--mem-fraction-static" not in command  # own GPUs: SGLang's default share
    assert engine.env_for(0, {})["CUDA_VISIBLE_DEVICES"] == "1,2"  # GPU 0 is the trainer's
    assert engine.env_for(1, {})["CUDA_VISIBLE_DEVICES"] == "3,4"
    # this process's GPU indices map through its own CUDA_VISIBLE_DEVICES
    assert engine.env_for(1, {"CUDA_VISIBLE_DEVICES": "7,6,5,4,3"})["CUDA_VISIBLE_DEVICES"] == "4,3"


def test_a_float32_engine_dtype_reaches_sglang_as_float32_never_auto(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch, visible=2, dtype="float32")
    command = engine.command_for(0, 30000)
    assert command[command.index("--dtype") + 1] == "float32"
    assert "auto" not in command


def test_one_gpu_is_refused_unless_shared_and_then_split_with_gloo_or_disk(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="share_gpu"):
        _engine(tmp_path, monkeypatch, visible=1)
    engine = _engine(tmp_path, monkeypatch, visible=1, share_gpu=True, weight_sync="distributed")
    command = engine.command_for(0, 30000)
    assert command[-2:] == ["--mem-fraction-static", "0.3"]
    assert engine.env_for(0, {})["CUDA_VISIBLE_DEVICES"] == "0"
    assert engine._sync().backend == "gloo"  # NCCL refuses two ranks on one GPU
    with pytest.raises(UserError, match="NCCL refuses two ranks"):
        _engine(tmp_path, monkeypatch, visible=1, share_gpu=True, weight_sync="distributed", weight_sync_backend="nccl")
    engine = _engine(tmp_path, monkeypatch, visible=1, share_gpu=True, mem_fraction=0.45)
    assert engine.command_for(0, 30000)[-1] == "0.45"


def _gpu_trainer(monkeypatch, nccl=(2, 29, 7)):
    """This process as a CUDA trainer whose torch links `nccl` (only what a GPU box would answer)."""
    import torch

    import rollhub.inference.weight_sync as weight_sync

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(weight_sync, "local_nccl_version", lambda: nccl)


def test_distributed_pushes_to_own_gpus_are_nccl_in_the_serving_dtype(tmp_path, monkeypatch):
    _gpu_trainer(monkeypatch)
    engine = _engine(tmp_path, monkeypatch, visible=2, weight_sync="distributed")
    sync = engine._sync()
    assert (sync.backend, sync.dtype, sync.load_format) == ("nccl", "bfloat16", "flattened_bucket")
    engine = _engine(tmp_path, monkeypatch, visible=2, weight_sync="distributed", weight_sync_master_address="10.0.0.7")
    assert engine._sync().master_address == "10.0.0.7"


def test_gpu_plans_exclude_every_trainer_rank_and_refuse_what_cannot_fit():
    assert trainer_gpus("cuda:3", {}) == [3]
    assert trainer_gpus("cuda", {"LOCAL_WORLD_SIZE": "2"}) == [0, 1]
    assert trainer_gpus("cpu", {"LOCAL_WORLD_SIZE": "2"}) == []
    assert plan_gpus(replicas=2, tp=1, visible=4, trainer_gpus=[0, 1]) == ([[2], [3]], False)
    assert plan_gpus(replicas=1, tp=1, visible=0, trainer_gpus=[]) == (None, False)
    with pytest.raises(UserError, match="need 4 GPU"):
        plan_gpus(replicas=2, tp=2, visible=4, trainer_gpus=[0])
    with pytest.raises(UserError, match="trainer's GPU"):
        plan_gpus(replicas=1, tp=1, visible=4, trainer_gpus=[0], gpus=[0])
    with pytest.raises(UserError, match="distinct"):
        plan_gpus(replicas=2, tp=1, visible=4, trainer_gpus=[0], gpus=[2, 2])
    assert physical_gpus([0, 2], {}) == "0,2"


def test_the_rollhub_template_gets_the_replicas_gpu_as_cuda_and_an_explicit_dtype(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    config = EngineConfig(backend="server", launch="rollhub", replicas=1)
    engine = _build_server_engine(config, str(tmp_path), "cuda:0", tmp_path, visible_gpus=2)
    command = engine.command_for(0, 30000)
    assert command[0] == sys.executable
    assert command[command.index("--device") + 1] == "cuda"  # its own CUDA_VISIBLE_DEVICES=1
    assert command[command.index("--dtype") + 1] == "bfloat16"
    assert engine.env_for(0, {})["CUDA_VISIBLE_DEVICES"] == "1"
    cpu = _build_server_engine(config, str(tmp_path), "cpu", tmp_path, visible_gpus=0)
    assert cpu.command_for(0, 30000)[cpu.command_for(0, 30000).index("--dtype") + 1] == "float32"
    assert "CUDA_VISIBLE_DEVICES" not in cpu.env_for(0, {})


async def test_tensor_parallel_servers_join_the_update_group_at_their_own_rank_offsets():
    states = [StubState(server_info={"tp_size": 2}), StubState(server_info={"parallel": {"tp_size": 1}})]
    stubs = [await start_stub(state) for state in states]
    clients = [SGLangEngine(url, api_key="") for _, url in stubs]
    sync = DistributedWeightSync(backend="gloo", timeout_s=2.0)
    try:
        with pytest.raises(WeightSyncError, match="stub has no rank"):
            await sync._form_group(clients)
        bodies = [next(b for p, b in s.calls if p == "/init_weights_update_group") for s in states]
        assert [b["rank_offset"] for b in bodies] == [1, 3]  # SGLang puts tp rank r at rank_offset + r
        assert {b["world_size"] for b in bodies} == {4}
        assert all(any(p == "/destroy_weights_update_group" for p, _ in s.calls) for s in states)
    finally:
        for client in clients:
            await client.close()
        for runner, _ in stubs:
            await runner.cleanup()


async def test_data_parallel_servers_are_refused_for_distributed_pushes():
    state = StubState(server_info={"tp_size": 1, "dp_size": 2})
    runner, url = await start_stub(state)
    client = SGLangEngine(url, api_key="")
    try:
        with pytest.raises(WeightSyncError, match="dp_size=2"):
            await DistributedWeightSync(backend="gloo", timeout_s=2.0)._form_group([client])
    finally:
        await client.close()
        await runner.cleanup()


def test_a_loopback_master_address_is_refused_for_a_server_on_another_host():
    check_master_address("127.0.0.1", ["http://127.0.0.1:30000", "http://localhost:1"])
    with pytest.raises(WeightSyncError, match="weight_sync_master_address"):
        check_master_address("127.0.0.1", ["http://10.254.1.2:30000"])
    check_master_address("10.0.0.1", ["http://10.254.1.2:30000"])


async def test_prompts_at_the_context_length_finish_length_like_the_in_process_engine():
    state = StubState(context_length=64, token_delay_s=0.0)
    runner, url = await start_stub(state)
    client = SGLangEngine(url, api_key="")
    try:
        full = await client.generate(list(range(70)), SamplingParams(max_new_tokens=8), "g-0-0")
        assert (full.token_ids, full.finish_reason) == ([], "length")
        near = await client.generate(list(range(50)), SamplingParams(max_new_tokens=40), "g-0-1")
        assert near.finish_reason == "length" and len(near.token_ids) == 64 - 1 - 50
        assert client.context_length == 64  # learned once: later requests are clamped before sending
        sent = [b for p, b in state.calls if p == "/generate"]
        assert sent[-1]["sampling_params"]["max_new_tokens"] == 13
    finally:
        await client.close()
        await runner.cleanup()


async def test_token_versions_come_from_the_servers_reply_not_the_clients_guess():
    state = StubState(token_delay_s=0.0)
    runner, url = await start_stub(state)
    client = SGLangEngine(url, api_key="")
    try:
        client.weight_version = 2
        before = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=3))
        assert before.token_versions == [2, 2, 2]  # SGLang's "default": no version of ours yet
        state.weight_version = "3"  # the request reached the server after a push the client had not seen
        after = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=3))
        assert after.token_versions == [3, 3, 3]
    finally:
        await client.close()
        await runner.cleanup()


async def test_the_client_does_not_cap_requests_in_flight_at_aiohttps_default_of_100():
    state = StubState(token_delay_s=0.5)
    runner, url = await start_stub(state)
    client = SGLangEngine(url, api_key="")
    try:
        sampling = SamplingParams(max_new_tokens=2)
        await asyncio.gather(*(client.generate([1, 2, 3], sampling, f"g-{k}-0") for k in range(150)))
        assert state.most_in_flight > 100  # the server's batch sees the rollout's concurrency
    finally:
        await client.close()
        await runner.cleanup()


def test_the_clients_own_sglang_command_names_its_dtype_and_interpreter():
    from rollhub.inference.engines.sglang import sglang_command

    command = sglang_command("/m", host="127.0.0.1", port=30000, api_key="k", python="/venv/bin/python")
    assert command[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    assert command[command.index("--dtype") + 1] == "bfloat16" and command[-2:] == ["--api-key", "k"]
    with pytest.raises(ValueError, match="never auto"):
        sglang_command("/m", host="h", port=1, api_key=None, dtype="auto")


def test_auto_never_picks_nccl_across_interpreters_whose_nccl_differs(tmp_path, monkeypatch, caplog):
    """Each torch wheel pins its own NCCL and NCCL refuses a peer of another version: a server venv
    is asked for its version at start; auto falls back to gloo with the reason, nccl is refused."""
    import rollhub.inference.weight_sync as weight_sync

    _gpu_trainer(monkeypatch, nccl=(2, 29, 7))
    monkeypatch.setattr(weight_sync, "nccl_version_of", lambda python, timeout_s=60.0: (2, 27, 5))
    options = {"visible": 2, "weight_sync": "distributed", "server_python": "/venv/bin/python"}
    with caplog.at_level("WARNING"):
        engine = _engine(tmp_path, monkeypatch, **options)
    assert engine._sync().backend == "gloo"
    assert "NCCL 2.29.7 and the server's 2.27.5 differ" in caplog.text
    with pytest.raises(UserError, match="cannot form a group: the trainer's NCCL 2.29.7 and the server's 2.27.5"):
        _engine(tmp_path, monkeypatch, weight_sync_backend="nccl", **options)
    monkeypatch.setattr(weight_sync, "nccl_version_of", lambda python, timeout_s=60.0: (2, 29, 7))
    assert _engine(tmp_path, monkeypatch, **options)._sync().backend == "nccl"  # the same NCCL: it forms


def test_a_server_interpreter_is_asked_for_its_nccl_in_a_subprocess():
    """The probe runs the real interpreter: this CPU torch has no NCCL, and says so as None."""
    from rollhub.inference.weight_sync import local_nccl_version, nccl_version_of

    assert nccl_version_of(sys.executable) == local_nccl_version()
    assert nccl_version_of("/nonexistent/python") is None
