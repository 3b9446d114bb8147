"""One contract suite for every InferenceEngine: in-process HFEngine and SGLangEngine -> `rollhub serve`."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
import torch
from aiohttp import web

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine
from rollhub.inference.engines.sglang import SGLangEngine
from rollhub.inference.server import build_app

PROMPT = [1, 300, 301, 302, 2, 200, 17, 18]
NO_STOP = (10**9,)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
async def served(tiny_model_and_tokenizer):
    """An HFEngine behind the SGLang-native HTTP app on a local port."""
    model, tokenizer = tiny_model_and_tokenizer
    backend = HFEngine(model, tokenizer)
    runner = web.AppRunner(build_app(backend))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield backend, f"http://127.0.0.1:{port}"
    await runner.cleanup()  # closes the backend engine


@pytest.fixture(params=["hf", "sglang-client"])
async def any_engine(request, tiny_model_and_tokenizer, served):
    backend, url = served
    if request.param == "hf":
        model, tokenizer = tiny_model_and_tokenizer
        eng = HFEngine(model, tokenizer)
        yield eng, eng
        await eng.close()
    else:
        client = SGLangEngine(url)
        yield client, backend
        await client.close()


async def test_generate_returns_ids_logprobs_versions(any_engine):
    eng, backend = any_engine
    generation = await eng.generate(
        PROMPT, SamplingParams(max_new_tokens=7, temperature=0.8, seed=5, stop_token_ids=NO_STOP)
    )
    assert generation.finish_reason == "length"
    assert len(generation.token_ids) == len(generation.logprobs) == len(generation.token_versions) == 7
    with torch.no_grad():
        logits = backend.model(torch.tensor([PROMPT + generation.token_ids])).logits[0].float()
    reference = torch.log_softmax(logits / 0.8, -1)
    assert generation.logprobs == pytest.approx(
        [float(reference[len(PROMPT) - 1 + i, t]) for i, t in enumerate(generation.token_ids)], abs=1e-4
    )


async def test_abort_returns_partial_output(any_engine):
    eng, backend = any_engine
    task = asyncio.create_task(
        eng.generate(PROMPT, SamplingParams(max_new_tokens=500, stop_token_ids=NO_STOP), request_id="r-abort")
    )
    while backend.stats.generated_tokens < 3:
        await asyncio.sleep(0.01)
    await eng.abort("r-abort")
    generation = await task
    assert generation.finish_reason == "abort"
    assert 0 < len(generation.token_ids) < 500


async def test_pause_blocks_then_resume(any_engine):
    eng, backend = any_engine
    running = asyncio.create_task(eng.generate(PROMPT, SamplingParams(max_new_tokens=500, stop_token_ids=NO_STOP)))
    while backend.stats.generated_tokens < 2:
        await asyncio.sleep(0.01)
    await eng.pause()
    assert (await running).finish_reason == "abort"
    waiting = asyncio.create_task(eng.generate(PROMPT, SamplingParams(max_new_tokens=2)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await eng.resume()
    assert (await asyncio.wait_for(waiting, 30)).finish_reason in ("stop", "length")


async def test_weight_update_bumps_token_versions(any_engine, tiny_model_dir):
    eng, backend = any_engine
    await eng.pause()
    await eng.update_weights(str(tiny_model_dir), version=4)
    await eng.resume()
    generation = await eng.generate(PROMPT, SamplingParams(max_new_tokens=3, stop_token_ids=NO_STOP))
    assert generation.token_versions == [4, 4, 4]
    assert backend.weight_version == 4


async def test_cancelled_caller_aborts_server_request(any_engine):
    eng, backend = any_engine
    task = asyncio.create_task(eng.generate(PROMPT, SamplingParams(max_new_tokens=500, stop_token_ids=NO_STOP)))
    while backend.stats.generated_tokens < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if backend.num_in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert backend.num_in_flight == 0


async def test_server_speaks_sglang_shapes(served):
    backend, url = served
    async with aiohttp.ClientSession() as http:
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 4, "stop_token_ids": list(NO_STOP)},
            "return_logprob": True,
            "rid": "x1",
        }
        async with http.post(f"{url}/generate", json=body) as response:
            assert response.status == 200
            reply = await response.json()
        meta = reply["meta_info"]
        assert meta["id"] == "x1" and meta["finish_reason"] == {"type": "length", "length": 4}
        assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == 4 and meta["weight_version"] == "0"
        assert [t[1] for t in meta["output_token_logprobs"]] == reply["output_ids"] and all(
            t[2] is None for t in meta["output_token_logprobs"]
        )
        assert isinstance(reply["text"], str)
        batch = {"input_ids": [PROMPT, PROMPT[:4]], "sampling_params": {"max_new_tokens": 2}}
        async with http.post(f"{url}/generate", json=batch) as response:
            assert len(await response.json()) == 2
        async with http.post(f"{url}/generate", json={"input_ids": PROMPT, "stream": True}) as response:
            assert response.status == 400
        for path in ("/health", "/health_generate", "/get_model_info", "/get_weight_version", "/v1/loads"):
            async with http.get(url + path) as response:
                assert response.status == 200, path
        async with http.get(f"{url}/get_model_info") as response:
            assert (await response.json())["is_generation"] is True
        # flush_cache: 400 while a request runs, 200 when idle
        busy = asyncio.create_task(
            http.post(
                f"{url}/generate",
                json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 500, "stop_token_ids": list(NO_STOP)}},
            )
        )
        while backend.num_in_flight == 0:
            await asyncio.sleep(0.01)
        async with http.post(f"{url}/flush_cache") as response:
            assert response.status == 400
        async with http.post(f"{url}/abort_request", json={"abort_all": True}) as response:
            assert response.status == 200
        reply = await (await busy).json()
        assert reply["meta_info"]["finish_reason"]["type"] == "abort"
        async with http.post(f"{url}/flush_cache") as response:
            assert response.status == 200
        async with http.post(f"{url}/update_weights_from_disk", json={"model_path": "/nonexistent"}) as response:
            assert response.status == 400 and (await response.json())["success"] is False
        async with http.post(f"{url}/update_weight_version", json={"new_version": "9"}) as response:
            assert (await response.json())["new_version"] == "9"


async def test_env_manager_over_the_http_client_with_a_state_dict_update(served, tiny_model_and_tokenizer):
    """The full rollout stack on the SGLang client path: groups, then pause -> update -> resume."""
    from rollout_testing import CountdownEnv, sections

    from rollhub.rollout.agent import AgentConfig
    from rollhub.rollout.manager import EnvManager

    backend, url = served
    model, tokenizer = tiny_model_and_tokenizer
    client = SGLangEngine(url)
    config = sections(
        "test/Countdown-v0", group_size=2, agent=AgentConfig(max_new_tokens=4), env_kwargs={"max_steps": 2}
    )
    manager = EnvManager(client, tokenizer, **config, env_factory=lambda env_id, **kw: CountdownEnv(**kw))
    try:
        before = await manager.collect_batch(2)
        await manager.update_weights({k: v.clone() for k, v in model.state_dict().items()}, version=2)
        after = await manager.collect_batch(1)
    finally:
        await manager.close()
        await client.close()
    assert all(v == 0 for g in before for t in g.trajectories for turn in t.turns for v in turn.token_versions)
    assert all(v == 2 for g in after for t in g.trajectories for turn in t.turns for v in turn.token_versions)
    assert backend.weight_version == 2 and client.num_in_flight == 0
    await backend.update_weights({k: v.clone() for k, v in model.state_dict().items()}, version=0)
