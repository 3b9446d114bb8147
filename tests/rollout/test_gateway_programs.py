"""Agent programs as producers: groups of sessions into the real GroupBuffer, as the trainer takes them.

One program is an async function using the `openai` client; one is a separate process that
knows nothing of rollhub but the OpenAI environment variables and the session API."""

from __future__ import annotations

import sys
import textwrap

import pytest
from gateway_testing import ADD_TOOL, scripted_tool_model, served

from rollhub.inference.chat_templates import build_reasoning_tokenizer
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.gateway import Gateway
from rollhub.rollout.gateway.programs import ProgramTask, command_program, produce_groups, run_program_group
from rollhub.rollout.types import TrajectoryStatus


@pytest.fixture
async def gateway():
    tokenizer = build_reasoning_tokenizer()
    engine = HFEngine(scripted_tool_model(tokenizer), tokenizer, threads=1)
    yield Gateway(engine, tokenizer)
    await engine.close()


async def add_program(task: ProgramTask) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=task.base_url, api_key="x", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": f"{task.seed} + 2?"}]
    for _ in range(2):
        reply = await client.chat.completions.create(
            model="rollhub-policy", messages=messages, tools=[ADD_TOOL], max_tokens=12
        )
        message = reply.choices[0].message
        messages.append(message.model_dump())
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "2"} for c in message.tool_calls or []]
        if not message.tool_calls:
            messages.append({"role": "user", "content": "use the tool"})
    await client.close()
    task.set_reward(1.0 if task.member == 0 else 0.0)


async def test_program_groups_reach_the_buffer_with_exact_tokens_and_rewards(gateway):
    buffer = GroupBuffer(batch_size_groups=2, alpha=0.0)
    async with served(gateway) as url:
        produced = await produce_groups(
            gateway, url, add_program, buffer, env_id="test/Add-v0", seeds=[0, 1], group_size=3
        )
        batch = await buffer.get_batch(trainer_version=0, timeout_s=10)
    assert produced == 2 and len(batch) == 2
    assert sorted(g.seed for g in batch) == [0, 1]
    for group in batch:
        assert len(group.trajectories) == 3 and group.env_id == "test/Add-v0"
        assert sorted(t.total_reward for t in group.trajectories) == [0.0, 0.0, 1.0]
        for trajectory in group.trajectories:
            assert trajectory.status is TrajectoryStatus.COMPLETED and len(trajectory.turns) == 2
            first, second = trajectory.turns
            assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == (
                first.prompt_ids + first.response_ids
            )
    assert buffer.staleness_histogram[0] == sum(t.num_response_tokens for g in batch for t in g.trajectories)
    assert gateway.finished == [] and gateway.sessions == {}


PROCESS_PROGRAM = textwrap.dedent(
    """
    import os, sys, httpx, openai
    client = openai.OpenAI(max_retries=0, timeout=60)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    reply = client.chat.completions.create(model="rollhub-policy", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=6)
    seed = int(os.environ["ROLLHUB_SEED"])
    gateway, session = os.environ["ROLLHUB_GATEWAY_URL"], os.environ["ROLLHUB_SESSION_ID"]
    httpx.post(f"{gateway}/sessions/{session}/reward", json={"reward": seed / 10}).raise_for_status()
    sys.exit(3 if seed == 7 else 0)
    """
)


async def test_a_separate_process_is_a_program_and_its_failure_is_marked_not_dropped(gateway, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(PROCESS_PROGRAM)
    program = command_program([sys.executable, str(script)])
    async with served(gateway) as url:
        good = await run_program_group(gateway, url, program, env_id="test/Chat-v0", seed=4, group_size=2)
        bad = await run_program_group(gateway, url, program, env_id="test/Chat-v0", seed=7, group_size=1)
    assert [t.total_reward for t in good.trajectories] == [0.4, 0.4]
    assert all(t.status is TrajectoryStatus.COMPLETED and len(t.turns) == 1 for t in good.trajectories)
    (failed,) = bad.trajectories
    assert failed.status is TrajectoryStatus.INFRA_FAILED and "exited with 3" in failed.infra_error
    assert len(failed.turns) == 1  # what it generated is kept, unscored


async def test_program_rollout_fills_the_buffer_and_stamps_new_versions_after_a_weight_update():
    import asyncio
    import itertools

    from rollhub.rollout.gateway.rollout import ProgramRollout
    from rollhub.rollout.source import RolloutSource

    tokenizer = build_reasoning_tokenizer()
    model = scripted_tool_model(tokenizer)
    engine = HFEngine(model, tokenizer, threads=1)
    buffer = GroupBuffer(batch_size_groups=2, alpha=1.0)
    rollout = ProgramRollout(
        engine, tokenizer, add_program, env_id="test/Add-v0", group_size=2, seeds=itertools.count(), buffer=buffer
    )
    assert isinstance(rollout, RolloutSource)
    stop = asyncio.Event()
    producing = asyncio.ensure_future(rollout.run(stop))
    try:
        first = await buffer.get_batch(trainer_version=0, timeout_s=120)
        await rollout.update_weights({k: v.clone() for k, v in model.state_dict().items()}, version=1)
        later = []
        for _ in range(4):  # groups started after the update carry version 1
            later += await buffer.get_batch(trainer_version=1, timeout_s=120)
            if any(g.oldest_version == 1 for g in later):
                break
    finally:
        stop.set()
        await asyncio.wait_for(producing, timeout=60)
        await rollout.close()
        await engine.close()
    assert len(first) == 2 and all(len(g.trajectories) == 2 for g in first)
    assert all(g.newest_version == 0 for g in first)
    assert any(g.oldest_version == 1 for g in later)
    summary = rollout.summary()
    assert summary["groups_done"] >= 4 and summary["gateway/bridge_break_rate"] == 0.0
    assert summary["weight_updates"][0]["version"] == 1
