"""A scripted MathTool policy at a real model's pace, for `rollhub bench async ENV --set agent=mathtool-script`.

A random-init model never writes a tool call, so on MathTool's sandbox backend `bench async`
would never start a container and would measure nothing of the sandbox's latency. A trained
policy calls `python` on the question first and then copies the tool's output into
`<answer>`; `mathtool_reply` writes exactly that from the prompt text alone (the engine sees no
env), and `ScriptedReplyEngine` gives it a model's timing: the wrapped engine decodes as many
tokens as the scripted reply has (stop tokens off, in the same batch as every other request),
then the reply's ids replace the sampled ones. Prefill, decode steps and batching are thus the
real engine's, and the env gets well-formed actions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams

#: a stop id no vocabulary has: the wrapped engine decodes the full scripted length
NO_STOP = (-1,)

# The question forms of rollhub/envs/mathtool/problems.py the script can turn into a program
# (word problems are prose: a script would have to solve them, which is the task itself).
_COMPUTE = re.compile(r"Compute (?P<expr>\d[\d +*-]*\d)\.")
_REMAINDER = re.compile(r"What is the remainder when (?P<a>\d+) \* (?P<b>\d+) is divided by (?P<m>\d+)\?")
_POWER = re.compile(r"What is the remainder when (?P<a>\d+) to the power of (?P<b>\d+) is divided by (?P<m>\d+)\?")
_INTEGER = re.compile(r"-?\d+")
#: the problem kinds the script reads
SCRIPTED_KINDS = ("product", "sum", "expression", "modular")


def _question_program(prompt_text: str) -> tuple[int, str]:
    """(where the episode's question ends, the program that prints its value) for the last
    question in the prompt (the few-shot example comes before the episode's own)."""
    found: list[tuple[int, int, str]] = []
    for match in _COMPUTE.finditer(prompt_text):
        found.append((match.start(), match.end(), match.group("expr")))
    for match in _REMAINDER.finditer(prompt_text):
        found.append((match.start(), match.end(), f"{match['a']} * {match['b']} % {match['m']}"))
    for match in _POWER.finditer(prompt_text):
        found.append((match.start(), match.end(), f"pow({match['a']}, {match['b']}, {match['m']})"))
    if not found:
        raise ValueError(
            "the scripted MathTool policy found no arithmetic question in the prompt; it reads the kinds "
            f"{list(SCRIPTED_KINDS)} (set the env's kinds to those)"
        )
    _, end, expression = max(found)
    return end, f"print({expression})"


def mathtool_reply(prompt_text: str, tool: str = "python") -> str:
    """The reply a trained MathTool policy writes next: a `python` call that prints the question's
    value, or, once that call's output is in the prompt, the output's integer as the answer (a
    call whose output holds no integer is made again, as a policy would retry)."""
    end, program = _question_program(prompt_text)
    after = prompt_text[end:]
    if "</tool_call>" in after:
        output = after.rsplit("</tool_call>", 1)[1]
        numbers = _INTEGER.findall(output)
        if numbers:
            return f"<answer>{numbers[0]}</answer>"
    return "<tool_call>" + json.dumps({"name": tool, "arguments": {"code": program}}) + "</tool_call>"


class ScriptedReplyEngine(InferenceEngine):
    """`inner`'s timing with `script`'s text: each request decodes len(reply ids) tokens on `inner`
    (stop ids off), and the reply's ids (with the end-of-turn id, cut to `max_new_tokens`) are
    returned in their place, with `inner`'s logprobs, versions and timing meta."""

    def __init__(self, inner: InferenceEngine, tokenizer: Any, script: Callable[[str], str] = mathtool_reply):
        self.inner = inner
        self.tokenizer = tokenizer
        self.script = script
        self.replies = 0
        self.cut = 0  # replies longer than the request's max_new_tokens: cut, so the env saw a broken action
        self.longest = 0

    @property
    def weight_version(self) -> int:  # type: ignore[override]
        return self.inner.weight_version

    def reply_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        text = self.script(self.tokenizer.decode(input_ids, skip_special_tokens=False))
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        self.longest = max(self.longest, len(ids))
        self.cut += len(ids) > max_new_tokens
        return ids[:max_new_tokens]

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> Generation:
        ids = self.reply_ids(input_ids, sampling.max_new_tokens)
        timed = SamplingParams(
            max_new_tokens=len(ids),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop_token_ids=NO_STOP,
            seed=sampling.seed,
        )
        generation = await self.inner.generate(input_ids, timed, request_id=request_id)
        n = len(generation.token_ids)
        if generation.finish_reason == "abort" or n != len(ids):  # an abort mid-reply keeps what was decoded
            finish = generation.finish_reason
        else:
            finish = "stop" if ids and ids[-1] == self.tokenizer.eos_token_id else "length"
        self.replies += 1
        return Generation(
            ids[:n],
            list(generation.logprobs),
            list(generation.token_versions),
            finish,
            request_id=generation.request_id,
            prompt_tokens=generation.prompt_tokens,
            meta=dict(generation.meta),
        )

    async def update_weights(self, source: Any, version: int) -> None:
        await self.inner.update_weights(source, version)

    async def pause(self) -> None:
        await self.inner.pause()

    async def resume(self) -> None:
        await self.inner.resume()

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def abort_all(self) -> None:
        await self.inner.abort_all()

    async def close(self) -> None:
        await self.inner.close()
