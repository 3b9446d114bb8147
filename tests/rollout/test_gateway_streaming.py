"""Streaming as the engine samples: the first content chunk reaches the client while the engine is
still generating (the in-process HFEngine hands out tokens per decode step); an engine that returns
whole generations, and calls whose tool calls must be parsed first, keep the one-chunk-per-part form.
The real `openai` client reads both, and what it reads equals the recorded completion."""

from __future__ import annotations

import time

import openai
import pytest
from gateway_testing import ADD_TOOL, SampleLog, random_model, scripted_tool_model, served

from rollhub.inference.chat_templates import build_reasoning_tokenizer
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.gateway import Gateway

MODEL = "rollhub-policy"
MESSAGES = [{"role": "user", "content": "Say something long, héllo wörld."}]


@pytest.fixture(scope="module")
def tokenizer():
    return build_reasoning_tokenizer()


async def read_stream(stream, engine: HFEngine | None = None):
    """(content, finish, last chunk's extension, the engine's in-flight count at the first content chunk)."""
    text, finish, extension, in_flight_at_first = "", None, None, None
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content and in_flight_at_first is None and engine is not None:
                in_flight_at_first = engine.num_in_flight
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        extension = (chunk.model_extra or {}).get("rollhub", extension)
    return text, finish, extension, in_flight_at_first


async def test_the_first_chunk_arrives_while_the_engine_still_generates(tokenizer):
    engine = HFEngine(random_model(tokenizer, seed=2), tokenizer, threads=1, stop_token_ids=(0,))
    # tokens reach `on_token` once per engine call: on an idle machine a tiny model decodes all 40 in one
    # call of max_call_s, so the test would measure the machine; one step per call streams every token
    engine.max_call_s = 1e-6
    gateway = Gateway(engine, tokenizer)
    try:
        async with served(gateway) as url:
            session = gateway.start_session("t/S-v0", 0)
            client = openai.AsyncOpenAI(base_url=f"{url}/sessions/{session.session_id}/v1", api_key="x", max_retries=0)
            began = time.perf_counter()
            stream = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=40, temperature=1.0, seed=3, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            text, finish, extension, in_flight = await read_stream(stream, engine)
            elapsed = time.perf_counter() - began
            plain = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=40, temperature=1.0, seed=3
            )
            await client.close()
    finally:
        await engine.close()
    assert in_flight == 1, "the first content chunk came only after the generation had ended"
    assert finish == "length" and elapsed > 0
    (first, second) = gateway.sessions[session.session_id].nodes
    assert text == plain.choices[0].message.content  # same seed: the streamed text is the plain call's
    assert text == tokenizer.decode(first.response_ids, skip_special_tokens=True) and len(first.response_ids) == 40
    assert extension["prompt_token_ids"] == first.prompt_ids  # the call's extension rides on the last chunk


async def test_tool_calls_and_whole_generation_engines_stream_in_one_chunk_per_part(tokenizer):
    engine = HFEngine(scripted_tool_model(tokenizer), tokenizer, threads=1)
    for wrapped in (engine, SampleLog(engine)):  # SampleLog hands out no tokens: a whole-generation engine
        gateway = Gateway(wrapped, tokenizer)
        async with served(gateway) as url:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            for tools in ([ADD_TOOL], None):
                extra = {"tools": tools} if tools else {}
                plain = await client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0, **extra
                )
                stream = await client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0, stream=True, **extra
                )
                calls, text, finish = [], "", None
                async for chunk in stream:
                    for choice in chunk.choices:
                        calls += choice.delta.tool_calls or []
                        text += choice.delta.content or ""
                        finish = choice.finish_reason or finish
                expected = plain.choices[0]
                assert finish == expected.finish_reason
                assert text == (expected.message.content or "")
                assert [c.function.name for c in calls] == [c.function.name for c in expected.message.tool_calls or []]
            await client.close()
    await engine.close()
    assert expected.finish_reason == "stop" and not calls  # the no-tools call: the call's text is content
