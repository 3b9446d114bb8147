"""The session gateway end to end: the real `openai` client, the real HFEngine, real tokenizers.

The model is a tiny real Qwen3 that tends to write a Hermes tool call (gateway_testing), on
rollhub's Qwen-style reasoning template (tool roles, `<tool_call>` tokens). What is checked
is what training needs: the ids a session exports are the ids the engine sampled, each
turn's prompt extends the previous turn's prompt and completion exactly, a rewritten history
branches instead of failing and every leaf exports, and user mistakes get OpenAI's errors.
"""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import openai
import pytest
from aiohttp import web
from gateway_testing import ADD_TOOL, SampleLog, random_model, scripted_tool_model, served

from rollhub.inference.chat_templates import build_reasoning_tokenizer
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.gateway import Gateway, GatewayConfig, group_trajectories
from rollhub.rollout.serialization import trajectory_from_dict

MODEL = "rollhub-policy"


@pytest.fixture(scope="module")
def reasoning_tokenizer():
    return build_reasoning_tokenizer()


@pytest.fixture
async def tool_engine(reasoning_tokenizer):
    engine = HFEngine(scripted_tool_model(reasoning_tokenizer), reasoning_tokenizer, threads=1, max_batch_size=64)
    yield SampleLog(engine)
    await engine.close()


async def start_session(url: str, **body) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/rl/sessions", json=body) as response:
            assert response.status == 200, await response.text()
            return (await response.json())["session_id"]


async def post(url: str, path: str, body) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}{path}", json=body) as response:
            return response.status, await response.json()


def client(url: str, session_id: str | None = None) -> openai.AsyncOpenAI:
    base = f"{url}/sessions/{session_id}/v1" if session_id else f"{url}/v1"
    return openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0, timeout=120)


async def tool_agent(url: str, session_id: str, seed: int, turns: int = 3) -> tuple[list[list[dict]], list]:
    """An agent program as people write them: append the assistant message it got back and the tool results.
    Returns the messages each call sent, and the responses."""
    openai_client = client(url, session_id)
    messages = [
        {"role": "system", "content": "You add numbers with the add tool."},
        {"role": "user", "content": f"What is {seed} + 2? Use the tool."},
    ]
    responses, sent = [], []
    for turn in range(turns):
        sent.append(list(messages))
        response = await openai_client.chat.completions.create(
            model=MODEL, messages=messages, tools=[ADD_TOOL], max_tokens=14, temperature=1.0, seed=seed * 100 + turn
        )
        responses.append(response)
        message = response.choices[0].message
        messages.append(message.model_dump())
        if message.tool_calls:
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(seed + 2)})
        else:
            messages.append({"role": "user", "content": f"Turn {turn}: call add, please."})
    await openai_client.close()
    sent.append(messages)
    return sent, responses


async def test_fifty_tool_sessions_export_exactly_the_sampled_ids(tool_engine, reasoning_tokenizer):
    gateway = Gateway(tool_engine, reasoning_tokenizer)
    async with served(gateway) as url:
        session_ids = [await start_session(url, env_id="test/Add-v0", seed=s % 10) for s in range(50)]
        runs = await asyncio.gather(*(tool_agent(url, sid, seed) for seed, sid in enumerate(session_ids)))
        for seed, sid in enumerate(session_ids):
            status, _ = await post(url, f"/sessions/{sid}/reward", {"reward": float(seed % 2)})
            assert status == 200
        ended = [await post(url, f"/sessions/{sid}/end", {}) for sid in session_ids]
        async with aiohttp.ClientSession() as http, http.get(f"{url}/rl/metrics") as response:
            metrics = await response.json()
    assert all(status == 200 for status, _ in ended)
    trajectories = gateway.take_trajectories()
    assert len(trajectories) == 50  # one leaf per session: every call extended the one before
    assert metrics["calls_by_kind"] == {"first": 50, "extend": 100, "fork": 0, "new_root": 0}
    assert metrics["bridge_break_rate"] == 0.0 and metrics["branches_per_session"] == 1.0
    tool_calls = sum(1 for _, responses in runs for r in responses if r.choices[0].message.tool_calls)
    assert 30 <= tool_calls < 150  # the model mostly calls the tool, sometimes writes garbage
    by_session = {t.info["session_id"]: t for t in trajectories}
    for sid, (_, responses) in zip(session_ids, runs):
        trajectory = by_session[sid]
        assert len(trajectory.turns) == 3
        for turn, response in zip(trajectory.turns, responses):
            # byte for byte the ids the engine sampled for exactly this prompt
            assert turn.response_ids in tool_engine.sampled_for(turn.prompt_ids)
            extension = response.choices[0].model_extra["rollhub"]
            assert extension["token_ids"] == turn.response_ids
            assert response.model_extra["rollhub"]["prompt_token_ids"] == turn.prompt_ids
            assert len(turn.behaviour_logprobs) == len(turn.response_ids) == len(turn.token_versions)
            assert turn.token_versions == [0] * len(turn.response_ids)
            assert response.usage.completion_tokens == len(turn.response_ids)
        for earlier, later in zip(trajectory.turns, trajectory.turns[1:]):
            done = earlier.prompt_ids + earlier.response_ids
            assert later.prompt_ids[: len(done)] == done
        (sequence,) = trajectory.packed_sequences()  # one training sequence, the model's tokens masked in
        assert sum(sequence.response_mask) == trajectory.num_response_tokens
    # the reward lands on the last turn; sessions of one task and seed form one group
    assert sorted(t.total_reward for t in trajectories) == [0.0] * 25 + [1.0] * 25
    groups = group_trajectories(trajectories)
    assert len(groups) == 10 and all(len(g.trajectories) == 5 and g.env_id == "test/Add-v0" for g in groups)
    # the /end reply carries the same trajectories, serialised
    first = trajectory_from_dict(ended[0][1]["trajectories"][0])
    assert first.turns[0].response_ids == by_session[session_ids[0]].turns[0].response_ids


async def test_tool_result_is_rendered_by_the_template_between_the_sampled_ids(tool_engine, reasoning_tokenizer):
    """Greedy, the model writes the clean call; the prompt after it is the template's own rendering."""
    gateway = Gateway(tool_engine, reasoning_tokenizer)
    async with served(gateway) as url:
        sid = await start_session(url)
        openai_client = client(url, sid)
        messages = [{"role": "user", "content": "2+3?"}]
        first = await openai_client.chat.completions.create(
            model=MODEL, messages=messages, tools=[ADD_TOOL], max_tokens=20, temperature=0
        )
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        assert message.content is None
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [("add", {})]
        messages += [message.model_dump(), {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "5"}]
        second = await openai_client.chat.completions.create(
            model=MODEL, messages=messages, tools=[ADD_TOOL], max_tokens=20, temperature=0
        )
        await openai_client.close()
    first_ids = first.choices[0].model_extra["rollhub"]["token_ids"]
    assert reasoning_tokenizer.decode(first_ids) == '<tool_call>{"name":"add"}</tool_call><|im_end|>'
    prompt_1 = first.model_extra["rollhub"]["prompt_token_ids"]
    prompt_2 = second.model_extra["rollhub"]["prompt_token_ids"]
    assert second.model_extra["rollhub"]["call_kind"] == "extend"
    between = prompt_2[len(prompt_1) + len(first_ids) :]
    assert reasoning_tokenizer.decode(between) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


async def test_rewritten_history_branches_and_every_leaf_exports(tool_engine, reasoning_tokenizer):
    gateway = Gateway(tool_engine, reasoning_tokenizer)
    async with served(gateway) as url:
        sid = await start_session(url, env_id="test/Add-v0", seed=3)
        sent, _ = await tool_agent(url, sid, seed=3, turns=2)
        openai_client = client(url, sid)
        # a retry of the second call: the same messages again, a sibling of its answer
        retried = await openai_client.chat.completions.create(
            model=MODEL, messages=sent[1], tools=[ADD_TOOL], max_tokens=14, seed=7
        )
        # a client that drops the earlier assistant message's content: history rewritten
        rewritten = [dict(m) for m in sent[-1]]
        first_answer = next(i for i, m in enumerate(rewritten) if m["role"] == "assistant")
        rewritten[first_answer] = {"role": "assistant", "content": "I will add them."}
        branched = await openai_client.chat.completions.create(
            model=MODEL, messages=rewritten, tools=[ADD_TOOL], max_tokens=14, seed=8
        )
        await openai_client.close()
        status, ended = await post(url, f"/sessions/{sid}/end", {})
        async with aiohttp.ClientSession() as http, http.get(f"{url}/rl/metrics") as response:
            metrics = await response.json()
    assert retried.model_extra["rollhub"]["call_kind"] == "fork"
    assert branched.model_extra["rollhub"]["call_kind"] == "new_root"
    assert status == 200 and ended["calls"] == 4 and ended["branched_calls"] == 2 and ended["leaves"] == 3
    assert metrics["bridge_break_rate"] == pytest.approx(2 / 4)
    assert metrics["branches_per_session"] == 3.0
    trajectories = gateway.take_trajectories()
    assert sorted(len(t.turns) for t in trajectories) == [1, 2, 2]
    for trajectory in trajectories:
        for turn in trajectory.turns:
            assert turn.response_ids in tool_engine.sampled_for(turn.prompt_ids)
    # the rewritten branch is the template's rendering of what the client sent
    root = next(t for t in trajectories if len(t.turns) == 1).turns[0]
    assert "I will add them." in reasoning_tokenizer.decode(root.prompt_ids)


async def test_streaming_gives_the_same_completion_as_a_plain_call(reasoning_tokenizer):
    engine = HFEngine(random_model(reasoning_tokenizer, seed=5), reasoning_tokenizer, threads=1)
    gateway = Gateway(engine, reasoning_tokenizer)
    try:
        async with served(gateway) as url:
            openai_client = client(url)
            messages = [{"role": "user", "content": "Say something, héllo wörld."}]
            for temperature, seed in ((0.0, None), (1.0, 11)):
                plain = await openai_client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=24, temperature=temperature, seed=seed, logprobs=True
                )
                stream = await openai_client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=24,
                    temperature=temperature,
                    seed=seed,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                text, finish, usage = "", None, None
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
                        finish = choice.finish_reason or finish
                assert plain.choices[0].message.content
                assert text == plain.choices[0].message.content
                assert finish == plain.choices[0].finish_reason
                assert usage.completion_tokens == plain.usage.completion_tokens
                token_logprobs = [entry.logprob for entry in plain.choices[0].logprobs.content]
                assert token_logprobs == plain.choices[0].model_extra["rollhub"]["logprobs"]
            await openai_client.close()
    finally:
        await engine.close()


async def test_n_choices_stop_strings_and_completions(reasoning_tokenizer):
    engine = HFEngine(scripted_tool_model(reasoning_tokenizer), reasoning_tokenizer, threads=1)
    gateway = Gateway(engine, reasoning_tokenizer)
    try:
        async with served(gateway) as url:
            sid = await start_session(url)
            openai_client = client(url, sid)
            several = await openai_client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=10, seed=1
            )
            assert [c.index for c in several.choices] == [0, 1, 2]
            stopped = await openai_client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10, temperature=0, stop=["add"]
            )
            choice = stopped.choices[0]
            assert choice.message.content == '<tool_call>{"name":"' and choice.finish_reason == "stop"
            # the recorded ids end with the token that completed the stop string
            assert reasoning_tokenizer.decode(choice.model_extra["rollhub"]["token_ids"]).endswith("add")
            completion = await openai_client.completions.create(
                model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=0
            )
            assert len(completion.choices[0].logprobs.token_logprobs) == completion.usage.completion_tokens
            continued = await openai_client.completions.create(
                model=MODEL, prompt="Once upon a time" + completion.choices[0].text + " then", max_tokens=4
            )
            await openai_client.close()
        first_ids = (
            completion.model_extra["rollhub"]["prompt_token_ids"]
            + completion.choices[0].model_extra["rollhub"]["token_ids"]
        )
        assert continued.model_extra["rollhub"]["call_kind"] == "extend"
        assert continued.model_extra["rollhub"]["prompt_token_ids"][: len(first_ids)] == first_ids
    finally:
        await engine.close()


async def test_user_mistakes_get_openai_errors(tool_engine, reasoning_tokenizer):
    gateway = Gateway(tool_engine, reasoning_tokenizer)
    async with served(gateway) as url:
        openai_client = client(url)
        hello = [{"role": "user", "content": "hi"}]
        bad_calls = [
            ({"temperature": 5.0}, "temperature"),
            ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
            ({"n": 0}, "n"),
            ({"max_tokens": -1}, "max_tokens"),
            ({"top_p": 0}, "top_p"),
            ({"response_format": {"type": "json_object"}}, "response_format"),
            ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [ADD_TOOL]}, "tool_choice"),
        ]
        for extra, param in bad_calls:
            with pytest.raises(openai.BadRequestError) as caught:
                await openai_client.chat.completions.create(model=MODEL, messages=hello, **extra)
            assert caught.value.body["param"] == param, extra
            assert caught.value.body["type"] == "invalid_request_error" and caught.value.body["message"]
        with pytest.raises(openai.BadRequestError):
            await openai_client.chat.completions.create(model=MODEL, messages=[])
        with pytest.raises(openai.NotFoundError) as caught:
            await openai_client.chat.completions.create(model="gpt-4o", messages=hello)
        assert caught.value.body["code"] == "model_not_found"
        unknown = client(url, "no-such-session")
        with pytest.raises(openai.NotFoundError) as caught:
            await unknown.chat.completions.create(model=MODEL, messages=hello)
        assert caught.value.body["code"] == "session_not_found"
        await unknown.close()
        await openai_client.close()
        async with aiohttp.ClientSession() as http:
            raw = b'{"model": "rollhub-policy", "messages": ['
            headers = {"Content-Type": "application/json"}
            async with http.post(f"{url}/v1/chat/completions", data=raw, headers=headers) as response:
                body = await response.json()
                assert response.status == 400 and body["error"]["code"] == "invalid_json"
            deep = b"[" * 100_000 + b"]" * 100_000  # deeper than the parser recurses: the client's mistake, a 400
            async with http.post(f"{url}/v1/chat/completions", data=deep, headers=headers) as response:
                body = await response.json()
                assert response.status == 400 and body["error"]["code"] == "invalid_json"
            async with http.get(f"{url}/v2/nothing") as response:
                body = await response.json()
                assert response.status == 404 and body["error"]["type"] == "not_found_error"
        sid = await start_session(url)
        assert (await post(url, f"/sessions/{sid}/reward", {"reward": "high"}))[0] == 400
        assert (await post(url, f"/sessions/{sid}/reward", {"reward": 1.0, "node_id": "nope"}))[0] == 404
        assert (await post(url, f"/sessions/{sid}/end", {}))[0] == 200
        status, body = await post(url, f"/sessions/{sid}/end", {})
        assert status == 409 and body["error"]["code"] == "session_ended"
        assert (await post(url, "/rl/sessions", {"seed": "one"}))[0] == 400


async def test_in_flight_cap_answers_429_with_retry_after(tool_engine, reasoning_tokenizer):
    gateway = Gateway(tool_engine, reasoning_tokenizer, GatewayConfig(max_in_flight=1, retry_after_s=2))
    async with served(gateway) as url:
        openai_client = client(url)
        hello = [{"role": "user", "content": "hi"}]
        await tool_engine.pause()  # the first call waits in the engine, holding the only slot
        first = asyncio.create_task(openai_client.chat.completions.create(model=MODEL, messages=hello, max_tokens=4))
        for _ in range(200):
            if gateway.in_flight == 1:
                break
            await asyncio.sleep(0.01)
        assert gateway.in_flight == 1
        with pytest.raises(openai.RateLimitError) as caught:
            await openai_client.chat.completions.create(model=MODEL, messages=hello, max_tokens=4)
        assert caught.value.response.headers["Retry-After"] == "2"
        assert caught.value.body["code"] == "too_many_requests"
        await tool_engine.resume()
        answered = await asyncio.wait_for(first, timeout=60)
        assert answered.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert gateway.metrics.rejected_busy == 1 and gateway.in_flight == 0
        await openai_client.close()


async def test_models_list_names_the_served_model(tool_engine, reasoning_tokenizer):
    gateway = Gateway(tool_engine, reasoning_tokenizer, GatewayConfig(model_name="my-policy"))
    async with served(gateway) as url:
        sid = await start_session(url)
        for openai_client in (client(url), client(url, sid)):
            models = await openai_client.models.list()
            assert [m.id for m in models.data] == ["my-policy"]
            await openai_client.close()


async def test_gateway_over_a_served_engine_through_the_same_contract(reasoning_tokenizer):
    """`rollhub serve`'s app (SGLang's native API) behind SGLangEngine, the client of SGLang and the router:
    the gateway needs nothing else to sit in front of a server fleet."""
    from rollhub.inference.engines.sglang import SGLangEngine
    from rollhub.inference.server import build_app

    hf_engine = HFEngine(scripted_tool_model(reasoning_tokenizer), reasoning_tokenizer, threads=1)
    server = web.AppRunner(build_app(hf_engine))
    await server.setup()
    await web.TCPSite(server, "127.0.0.1", 0).start()
    engine = SGLangEngine(f"http://127.0.0.1:{server.addresses[0][1]}", api_key="")
    gateway = Gateway(engine, reasoning_tokenizer)
    try:
        async with served(gateway) as url:
            sid = await start_session(url, env_id="test/Add-v0", seed=1)
            _, responses = await tool_agent(url, sid, seed=1, turns=2)
            (trajectory,) = gateway.end_session(sid)
    finally:
        await engine.close()
        await server.cleanup()
        await hf_engine.close()
    first, second = trajectory.turns
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == first.prompt_ids + first.response_ids
    for turn, response in zip(trajectory.turns, responses):
        extension = response.choices[0].model_extra["rollhub"]
        assert extension["token_ids"] == turn.response_ids and extension["logprobs"] == turn.behaviour_logprobs
        assert all(lp <= 0 for lp in turn.behaviour_logprobs) and len(turn.response_ids) > 0


async def test_an_engine_that_is_down_is_a_502_not_a_crash(reasoning_tokenizer):
    from rollhub.inference.engines.sglang import SGLangEngine

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    engine = SGLangEngine(f"http://127.0.0.1:{dead_port}", api_key="", timeout_s=5)
    gateway = Gateway(engine, reasoning_tokenizer)
    try:
        async with served(gateway) as url:
            openai_client = client(url)
            with pytest.raises(openai.APIStatusError) as caught:
                await openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
            assert caught.value.status_code == 502 and caught.value.body["code"] == "engine_unavailable"
            await openai_client.close()
    finally:
        await engine.close()


async def test_a_training_gateway_pins_temperature_and_top_p(tool_engine, reasoning_tokenizer):
    """The trainer scores tokens at the run's temperature: a session sampled otherwise is refused, not mis-trained."""
    gateway = Gateway(tool_engine, reasoning_tokenizer, GatewayConfig(temperature=0.7, top_p=0.9))
    async with served(gateway) as url:
        openai_client = client(url)
        hello = [{"role": "user", "content": "hi"}]
        for key, value in (("temperature", 1.0), ("top_p", 1.0)):
            with pytest.raises(openai.BadRequestError) as caught:
                await openai_client.chat.completions.create(model=MODEL, messages=hello, max_tokens=2, **{key: value})
            assert caught.value.body["param"] == key
        answered = await openai_client.chat.completions.create(model=MODEL, messages=hello, max_tokens=2)
        assert answered.choices[0].model_extra["rollhub"]["token_ids"]
        await openai_client.close()
