"""Real agent frameworks driving the gateway, and the token-exactness count behind their tests.

Each framework runs through its own OpenAI client: the OpenAI Agents SDK (`Agent` with a
function tool over `OpenAIChatCompletionsModel`, multi-turn by feeding `to_input_list()` back
with a new user message) and LangChain (`ChatOpenAI.bind_tools`, tool results as
`ToolMessage`s, and a last turn that drops the oldest exchange, as memory-trimming agents do:
a rewritten history that must branch). Three chat-template families: rollhub's Qwen-style
reasoning template (tools in the template, tool role, rewrites history), SmolLM2's own, and a
Llama-3-style template (header tokens, `ipython` tool role) built here.

`exactness(...)` compares every exported trajectory with what the engine sampled: a mismatch is
a turn whose response ids the engine did not sample for exactly that prompt, or a turn whose
prompt does not start with the previous turn's prompt and response (the sequence the trainer
packs); it also checks that every sampled generation was exported.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from gateway_testing import SampleLog, random_model, scripted_tool_model, stop_prone_model

from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.gateway import Gateway
from rollhub.rollout.types import Trajectory

MODEL = "rollhub-policy"

LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if tools -%}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nYou can call these functions:\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson + '\\n' -}}{%- endfor -%}{{- '<|eot_id|>' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = 'ipython' if message['role'] == 'tool' else message['role'] -%}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + (message['content'] or '') -}}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{{- '{\"name\": \"' + call['function']['name'] + '\", \"parameters\": ' -}}"
    "{{- call['function']['arguments'] | tojson + '}' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)


def llama3_tokenizer() -> Any:
    """rollhub's small BPE with Llama-3's header tokens and a Llama-3-style template."""
    from rollhub.inference.models import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_TOKENS})
    tokenizer.bos_token = "<|begin_of_text|>"
    tokenizer.eos_token = "<|eot_id|>"
    tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


def template_tokenizer(family: str) -> Any:
    if family == "qwen":
        from rollhub.inference.chat_templates import build_reasoning_tokenizer

        return build_reasoning_tokenizer()
    if family == "smollm2":
        from tests.smollm2_testing import smollm2_tokenizer

        return smollm2_tokenizer()
    if family == "llama3":
        return llama3_tokenizer()
    raise ValueError(f"unknown template family {family!r}")


def family_model(family: str, tokenizer: Any, seed: int = 0) -> Any:
    """A tiny real Qwen3 over the family's tokenizer: one that writes tool calls where the tokenizer lets it."""
    if family == "qwen":
        return scripted_tool_model(tokenizer, seed=seed)
    if family == "smollm2":
        return stop_prone_model(tokenizer, seed=seed)
    return random_model(tokenizer, seed=seed)


@dataclass
class CallTimes:
    """Client-side latency of each HTTP call, and the engine's time for each generation."""

    client_s: list[float] = field(default_factory=list)

    def hooks(self) -> dict[str, list]:
        async def start(request: httpx.Request) -> None:
            request.extensions["rollhub_t0"] = time.perf_counter()

        async def end(response: httpx.Response) -> None:
            self.client_s.append(time.perf_counter() - response.request.extensions["rollhub_t0"])

        return {"request": [start], "response": [end]}


class TimedSampleLog(SampleLog):
    """SampleLog that also keeps how long each generation took in the engine."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.engine_s: list[float] = []

    async def generate(self, input_ids, sampling, request_id=None):
        began = time.perf_counter()
        generation = await super().generate(input_ids, sampling, request_id)
        self.engine_s.append(time.perf_counter() - began)
        return generation


def openai_client(base_url: str, times: CallTimes) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(event_hooks=times.hooks(), timeout=300)
    return openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, http_client=http)


async def agents_sdk_session(base_url: str, seed: int, times: CallTimes, turns: int = 2) -> None:
    """The Agents SDK: a function-tool agent, run `turns` times on one growing conversation."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.exceptions import MaxTurnsExceeded

    set_tracing_disabled(True)

    @function_tool
    def add(a: int = 0, b: int = 0) -> int:
        """Add two integers (both default to 0)."""
        return a + b

    client = openai_client(base_url, times)
    agent = Agent(
        name="adder",
        instructions="You add numbers with the add tool.",
        tools=[add],
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(max_tokens=12, temperature=1.0, extra_args={"seed": seed}),
    )
    conversation: Any = f"What is {seed} + 2?"
    for turn in range(turns):
        try:
            result = await Runner.run(agent, conversation, max_turns=3)
            conversation = result.to_input_list()
        except MaxTurnsExceeded:  # the model kept calling the tool: the episode ends there
            break
        conversation.append({"role": "user", "content": f"Now add {turn} more."})
    await client.close()


async def langchain_session(base_url: str, seed: int, times: CallTimes, turns: int = 3) -> None:
    """LangChain: `ChatOpenAI` with a bound tool; the last call drops the oldest exchange (a branch)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int = 0, b: int = 0) -> int:
        """Add two integers (both default to 0)."""
        return a + b

    http = httpx.AsyncClient(event_hooks=times.hooks(), timeout=300)
    llm = ChatOpenAI(
        model=MODEL, base_url=base_url, api_key="x", max_tokens=12, max_retries=0, seed=seed, http_async_client=http
    ).bind_tools([add])
    messages: list[Any] = [SystemMessage("You add numbers with the add tool."), HumanMessage(f"What is {seed} + 2?")]
    for turn in range(turns):
        reply = await llm.ainvoke(messages)
        messages.append(reply)
        for call in reply.tool_calls:
            messages.append(ToolMessage(content=str(add.invoke(call["args"])), tool_call_id=call["id"]))
        if not reply.tool_calls:
            messages.append(HumanMessage(f"Turn {turn}: add again."))
    last_reply = max(i for i, m in enumerate(messages) if isinstance(m, AIMessage))
    # memory trimming: the exchanges before the last reply become a one-line summary, a rewritten history
    await llm.ainvoke([messages[0], HumanMessage("(earlier turns trimmed) Keep adding."), *messages[last_reply:]])
    await http.aclose()


FRAMEWORKS = {"agents_sdk": agents_sdk_session, "langchain": langchain_session}


@dataclass
class ExactnessReport:
    sessions: int = 0
    calls: int = 0
    turns: int = 0
    leaves: int = 0
    mismatches: int = 0
    prefix_breaks: int = 0
    unexported_samples: int = 0
    kinds: Counter = field(default_factory=Counter)
    client_s: list[float] = field(default_factory=list)
    engine_s: list[float] = field(default_factory=list)
    gateway_s: list[float] = field(default_factory=list)  # Gateway.chat per call (prompt, engine, record)

    @property
    def overhead_ms(self) -> float:
        """Mean client-observed call latency minus mean engine time per generation (HTTP, JSON, the
        gateway's work, and any wait for the shared event loop the frameworks run on)."""
        return _mean_ms(self.client_s) - _mean_ms(self.engine_s)

    @property
    def gateway_overhead_ms(self) -> float:
        """Mean time in `Gateway.chat` beyond the engine's: building the prompt, parsing, recording."""
        return _mean_ms(self.gateway_s) - _mean_ms(self.engine_s)


def _mean_ms(values: list[float]) -> float:
    return 1000 * sum(values) / len(values) if values else 0.0


def exactness(trajectories: list[Trajectory], log: SampleLog, report: ExactnessReport) -> None:
    """Add `trajectories`' comparison with what `log` saw the engine sample to `report` (module docstring)."""
    exported: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for trajectory in trajectories:
        report.leaves += 1
        for index, turn in enumerate(trajectory.turns):
            report.turns += 1
            exported.add((tuple(turn.prompt_ids), tuple(turn.response_ids)))
            if turn.response_ids not in log.sampled_for(turn.prompt_ids):
                report.mismatches += 1
            if index:
                earlier = trajectory.turns[index - 1]
                done = earlier.prompt_ids + earlier.response_ids
                if turn.prompt_ids[: len(done)] != done:
                    report.prefix_breaks += 1
    sampled = {(prompt, tuple(ids)) for prompt, ids in log.pairs}
    report.unexported_samples += len(sampled - exported)


async def run_framework(
    framework: str, family: str, sessions: int, *, concurrency: int = 16, tokenizer: Any = None, seed: int = 0
) -> ExactnessReport:
    """`sessions` sessions of `framework` on `family`'s template through a served gateway; the exactness report."""
    from gateway_testing import served

    tokenizer = tokenizer if tokenizer is not None else template_tokenizer(family)
    engine = HFEngine(family_model(family, tokenizer, seed), tokenizer, threads=1, max_batch_size=64)
    log = TimedSampleLog(engine)
    gateway = Gateway(log, tokenizer)
    times = CallTimes()
    report = ExactnessReport()
    chat = gateway.chat

    async def timed_chat(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await chat(*args, **kwargs)
        finally:
            report.gateway_s.append(time.perf_counter() - began)

    gateway.chat = timed_chat  # type: ignore[method-assign]
    limit = asyncio.Semaphore(concurrency)
    program = FRAMEWORKS[framework]
    try:
        async with served(gateway) as url:

            async def one(index: int) -> None:
                async with limit:
                    session = gateway.start_session(f"test/{framework}-v0", index)
                    await program(f"{url}/sessions/{session.session_id}/v1", seed * 100_000 + index, times)
                    gateway.end_session(session.session_id)

            await asyncio.gather(*(one(i) for i in range(sessions)))
    finally:
        await engine.close()
    exactness(gateway.take_trajectories(), log, report)
    snapshot = gateway.metrics.snapshot()
    report.sessions = snapshot["sessions_ended"]
    report.calls = snapshot["calls"]
    report.kinds.update(snapshot["calls_by_kind"])
    report.client_s, report.engine_s = times.client_s, log.engine_s
    return report
