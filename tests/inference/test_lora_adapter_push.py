"""A LoRA policy's adapter pushed to SGLang servers (`engine.weight_sync: lora_adapter`), against the
SGLang stub's LoRA routes (tests/inference/sglang_stub.py, read from the released wheels): the router
pauses, every server loads the new adapter and takes the version, requests then name it, the previous
adapter is unloaded and its folder removed; a server that cannot hold the adapter fails the push."""

from __future__ import annotations

import json

import pytest
import torch

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.build import EngineConfig, _build_server_engine
from rollhub.inference.engines.router import EngineRouter
from rollhub.inference.engines.sglang import SGLangEngine
from rollhub.inference.weight_sync import LoraAdapterSync, WeightSyncError, sglang_lora_args
from rollhub.trainer.lora import LoraConfig
from rollhub.trainer.policy import Policy
from tests.inference.sglang_stub import StubState, start_stub

TARGETS = ["q_proj", "v_proj"]


@pytest.fixture(scope="module")
def lora_policy(tiny_model_dir):
    policy = Policy(tiny_model_dir, device="cpu", lora=LoraConfig(rank=4, alpha=8.0, target_modules=TARGETS))
    with torch.no_grad():  # B starts at zero; a trained adapter has moved
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    return policy


async def test_the_router_pushes_each_version_as_a_new_adapter_and_requests_name_it(lora_policy, tmp_path):
    states = [
        StubState(token_delay_s=0.0, enable_lora=True, max_lora_rank=8, lora_target_modules=TARGETS) for _ in range(2)
    ]
    stubs = [await start_stub(state) for state in states]
    router = EngineRouter({f"r{i}": url for i, (_, url) in enumerate(stubs)}, weight_sync=LoraAdapterSync(tmp_path))
    try:
        for version in (1, 2):
            await router.update_weights(lora_policy.engine_state_dict(), version)
        for state in states:
            assert list(state.loras) == ["rollhub-v2"]  # v1 unloaded once v2 was in place
            assert state.weight_version == "2" and not state.paused
            paths = [path for path, _ in state.calls]
            assert paths.count("/load_lora_adapter") == 2 and paths.count("/unload_lora_adapter") == 1
            assert paths.index("/pause_generation") < paths.index("/load_lora_adapter")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["lora-v2"]
        generation = await router.generate([1, 2, 3], SamplingParams(max_new_tokens=2), "g1-x-0-1")
        assert set(generation.token_versions) == {2}
        assert [s for state in states for s in state.served_by] == ["rollhub-v2"]
        config = json.loads((tmp_path / "lora-v2" / "adapter_config.json").read_text())
        assert config["r"] == 4 and sorted(config["target_modules"]) == TARGETS
    finally:
        await router.close()
        for runner, _ in stubs:
            await runner.cleanup()


async def test_the_pushed_adapter_is_the_trainers(lora_policy, tiny_model_dir, tmp_path):
    """The folder the servers load gives, through peft, the trainer's own logits."""
    from peft import PeftModel

    from rollhub.inference.models import load_model_and_tokenizer

    state = StubState(token_delay_s=0.0, enable_lora=True, lora_target_modules=TARGETS)
    runner, url = await start_stub(state)
    client = SGLangEngine(url, api_key="")
    try:
        await LoraAdapterSync(tmp_path).push([client], lora_policy.engine_state_dict(), 5)
    finally:
        await client.close()
        await runner.cleanup()
    base, _ = load_model_and_tokenizer(tiny_model_dir, dtype=torch.float32)
    served = PeftModel.from_pretrained(base, state.loras["rollhub-v5"]).eval()
    ids = torch.arange(1, 17).unsqueeze(0)
    lora_policy.model.eval()
    try:
        with torch.no_grad():
            gap = (served(input_ids=ids).logits - lora_policy.model(input_ids=ids).logits).abs().max()
    finally:
        lora_policy.model.train()
    assert float(gap) < 1e-5


async def test_a_server_that_cannot_hold_the_adapter_fails_the_push(lora_policy, tmp_path):
    cases = [
        (StubState(token_delay_s=0.0), "LoRA is not enabled"),
        (StubState(token_delay_s=0.0, enable_lora=True, max_lora_rank=2), "is incompatible"),
        (StubState(token_delay_s=0.0, enable_lora=True, lora_target_modules=["o_proj"]), "is incompatible"),
    ]
    for state, message in cases:
        runner, url = await start_stub(state)
        client = SGLangEngine(url, api_key="")
        try:
            with pytest.raises(WeightSyncError, match=message):
                await LoraAdapterSync(tmp_path).push([client], lora_policy.engine_state_dict(), 1)
            assert client.lora_name is None and not state.loras
        finally:
            await client.close()
            await runner.cleanup()
    with pytest.raises(WeightSyncError, match="set model.lora"):  # merged weights alone carry no adapter
        await LoraAdapterSync(tmp_path).push([client], dict(lora_policy.engine_state_dict()), 1)


def test_launched_sglang_servers_get_the_lora_flags(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    config = EngineConfig(backend="server", launch="sglang", weight_sync="lora_adapter")
    config.validate()
    engine = _build_server_engine(config, str(tmp_path / "model"), "cuda", tmp_path, visible_gpus=2)
    assert isinstance(engine._sync(), LoraAdapterSync)
    engine.server_args = sglang_lora_args(8, ["v_proj", "q_proj"])
    command = engine.command_for(0, 30000)
    assert command[-6:] == ["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "q_proj", "v_proj"]
