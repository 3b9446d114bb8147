"""Bucketed weight pushes: one broadcast per bucket in SGLang's flattened layout, in the serving
dtype, with one cache flush per push; the receiving side (rollhub serve, in this process) loads
exactly the pushed values."""

from __future__ import annotations

import pytest
import torch
from aiohttp import web

from rollhub.inference.engines.hf import HFEngine
from rollhub.inference.engines.sglang import SGLangEngine
from rollhub.inference.server import build_app
from rollhub.inference.weight_sync import (
    DistributedWeightSync,
    UpdateGroup,
    _buckets,
    flatten_bucket,
    unflatten_bucket,
    unique_tensors,
)

KEY = "bucket-test-key"


class CountingGroup:
    """The trainer's side of a group, counting its broadcasts (what one push costs in collectives)."""

    broadcasts = 0

    def __init__(self, inner: UpdateGroup) -> None:
        self._inner = inner
        self.device = inner.device
        self.backend_name = inner.backend_name

    def broadcast(self, tensor: torch.Tensor) -> None:
        CountingGroup.broadcasts += 1
        self._inner.broadcast(tensor)

    def close(self) -> None:
        self._inner.close()


def test_flattened_buckets_round_trip_every_dtype_and_refuse_a_wrong_size():
    tensors = [torch.randn(3, 5), torch.randn(7).to(torch.bfloat16), torch.randn(2, 2).half()]
    flat = flatten_bucket(tensors)
    assert flat.dtype == torch.uint8 and flat.numel() == 15 * 4 + 7 * 2 + 4 * 2
    back = unflatten_bucket(flat, ["a", "b", "c"], [t.dtype for t in tensors], [tuple(t.shape) for t in tensors])
    assert all(torch.equal(back[k], t) for k, t in zip("abc", tensors))
    with pytest.raises(ValueError, match="bytes"):
        unflatten_bucket(flat[:-2], ["a", "b", "c"], [t.dtype for t in tensors], [tuple(t.shape) for t in tensors])
    mixed = {"a": torch.zeros(3), "b": torch.zeros(3, dtype=torch.bfloat16), "c": torch.zeros(3)}
    assert _buckets(mixed, 1 << 20) == [["a"], ["b"], ["c"]]  # one dtype per bucket: aligned for SGLang


@pytest.fixture
async def served(tiny_model_dir):
    engine = HFEngine(str(tiny_model_dir), threads=1)
    runner = web.AppRunner(build_app(engine, api_key=KEY, weight_sync_timeout_s=20))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    client = SGLangEngine(f"http://127.0.0.1:{runner.addresses[0][1]}", api_key=KEY)
    yield engine, client
    await client.close()
    await runner.cleanup()


async def test_a_bucketed_push_is_one_broadcast_per_bucket_and_one_flush(served, monkeypatch):
    engine, client = served
    state = {name: t + 0.01 for name, t in engine.model.state_dict().items()}
    sent: list[dict] = []
    original = client.update_weights_from_distributed

    async def recording(**body):
        sent.append(body)
        return await original(**body)

    monkeypatch.setattr(client, "update_weights_from_distributed", recording)
    sync = DistributedWeightSync(backend="gloo", timeout_s=30, bucket_bytes=1 << 20)
    try:
        await sync._form_group([client])
        sync._group = CountingGroup(sync._group)
        CountingGroup.broadcasts = 0
        timings = await sync.push([client], state, 5)
        buckets = timings["buckets"]
        assert buckets == len(sent) > 1 and CountingGroup.broadcasts == buckets  # not one per tensor
        assert [body["flush_cache"] for body in sent] == [False] * (buckets - 1) + [True]
        assert {body["version"] for body in sent} == {5} and {body["load_format"] for body in sent} == {
            "flattened_bucket"
        }
        assert engine.weight_version == 5
        served_state = engine.model.state_dict()
        for name, tensor in unique_tensors(state).items():
            assert torch.equal(served_state[name], tensor), name
    finally:
        await sync.close([client])


async def test_a_push_in_the_serving_dtype_sends_half_the_bytes(served):
    engine, client = served
    state = {name: t - 0.01 for name, t in engine.model.state_dict().items()}
    sync = DistributedWeightSync(backend="gloo", timeout_s=30, dtype="bfloat16")
    try:
        timings = await sync.push([client], state, 1)
        full = sum(t.numel() * 4 for t in unique_tensors(state).values())
        assert timings["bytes"] == full // 2
        name = "model.layers.0.mlp.up_proj.weight"
        assert torch.equal(engine.model.state_dict()[name], state[name].to(torch.bfloat16).float())
    finally:
        await sync.close([client])
