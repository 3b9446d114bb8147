"""A model that plays an env from its chat messages: a local checkpoint or an OpenAI-compatible URL.

`rollhub envs try --agent model` and `rollhub eval ENV --model` take the model a newcomer has:
a folder written by `rollhub train` / `rollhub model init-tiny` / transformers' `save_pretrained`
(played by rollhub's in-process CPU engine, with the tokenizer's own chat template), or any
server speaking OpenAI's chat completions API (vLLM, SGLang, llama.cpp, a hosted API), through
the `openai` package's client. Both answer the same call: the conversation so far -> the text
of the next action. This is the serving view (messages in, text out), not the trainer's
token-exact view (rollhub.rollout.agent): evaluation by message is what a served model sees.

The key of an endpoint comes from OPENAI_API_KEY (local servers usually want none).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from rollhub.core.errors import UserError
from rollhub.envs.base import Observation


class ChatModel(Protocol):
    """What plays: the next reply to a conversation (env tools passed where the env wants them
    rendered by the model's template)."""

    async def reply(self, conversation: Observation, tools: list[dict[str, Any]] | None) -> str: ...

    async def close(self) -> None: ...


def open_chat_model(
    model: str,
    *,
    model_name: str | None = None,
    temperature: float = 0.0,
    max_new_tokens: int = 256,
) -> ChatModel:
    """A URL (http:// or https://) -> `EndpointModel`; a folder with config.json -> `LocalModel`."""
    if not temperature >= 0:
        raise UserError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if model.startswith(("http://", "https://")):
        return EndpointModel(model, model_name=model_name, temperature=temperature, max_new_tokens=max_new_tokens)
    path = Path(model)
    if not (path / "config.json").is_file():
        raise UserError(
            f"--model {model}: neither an http(s) URL nor a model folder with config.json "
            "(e.g. runs/NAME/final_model, or make one with 'rollhub model init-tiny')"
        )
    if model_name is not None:
        raise UserError("--model-name names an endpoint's model; a model folder needs none")
    return LocalModel(path, temperature=temperature, max_new_tokens=max_new_tokens)


def endpoint_base_url(url: str) -> str:
    """The client's base URL: `http://host:port` and `http://host:port/` mean `.../v1`, as every
    OpenAI-compatible server serves there; a URL with a path is taken as given."""
    stripped = url.rstrip("/")
    scheme, _, rest = stripped.partition("://")
    return stripped if "/" in rest else f"{stripped}/v1"


class EndpointModel:
    """An OpenAI-compatible chat completions endpoint, through the `openai` package's client."""

    def __init__(self, url: str, *, model_name: str | None, temperature: float, max_new_tokens: int):
        try:
            import openai
        except ImportError:
            raise UserError("--model URL needs the 'openai' package: pip install 'openai>=2.9,<3'") from None
        self.url = endpoint_base_url(url)
        self._openai = openai
        self.client = openai.AsyncOpenAI(
            base_url=self.url, api_key=os.environ.get("OPENAI_API_KEY") or "none", max_retries=1, timeout=600
        )
        self.model_name = model_name
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens

    async def _name(self) -> str:
        if self.model_name is None:
            listing = await self.client.models.list()
            names = [entry.id for entry in listing.data]
            if not names:
                raise UserError(f"{self.url} serves no model; name one with --model-name")
            self.model_name = names[0]
        return self.model_name

    async def reply(self, conversation: Observation, tools: list[dict[str, Any]] | None) -> str:
        # a `tool` message needs the id of a call the API made; the env's replies are plain text
        messages = [
            {"role": "user" if m["role"] == "tool" else m["role"], "content": m["content"]} for m in conversation
        ]
        arguments: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_new_tokens}
        if tools:
            arguments["tools"] = tools
        try:
            response = await self.client.chat.completions.create(
                model=await self._name(), messages=messages, **arguments
            )
        except self._openai.APIConnectionError:
            raise UserError(f"cannot reach the model endpoint {self.url}: is the server running?") from None
        except self._openai.APIStatusError as exc:
            raise UserError(f"the model endpoint {self.url} answered {exc.status_code}: {_first_line(exc)}") from None
        message = response.choices[0].message
        text = message.content or ""
        for call in message.tool_calls or []:  # back into the env's text form of a call
            try:
                call_arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError:
                call_arguments = call.function.arguments
            text += f"<tool_call>{json.dumps({'name': call.function.name, 'arguments': call_arguments})}</tool_call>"
        return text

    async def close(self) -> None:
        await self.client.close()


class LocalModel:
    """A transformers checkpoint folder on rollhub's in-process CPU engine, prompted with the
    tokenizer's chat template."""

    def __init__(self, path: Path, *, temperature: float, max_new_tokens: int):
        from rollhub.inference.engines.build import EngineConfig, build_engine

        self.engine = build_engine(EngineConfig(threads=1, max_batch_size=1), path, device="cpu")
        self.tokenizer = self.engine.tokenizer
        if not getattr(self.tokenizer, "chat_template", None):
            raise UserError(f"{path}: its tokenizer has no chat template, so it cannot be given chat messages")
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens

    async def reply(self, conversation: Observation, tools: list[dict[str, Any]] | None) -> str:
        from rollhub.inference.engines.base import SamplingParams

        text = self.tokenizer.apply_chat_template(
            list(conversation), tools=tools, add_generation_prompt=True, tokenize=False
        )
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        room = self.engine.max_positions - len(ids)
        if room < 1:
            raise UserError(
                f"the conversation ({len(ids)} tokens) outgrew the model's context ({self.engine.max_positions})"
            )
        sampling = SamplingParams(max_new_tokens=min(self.max_new_tokens, room), temperature=self.temperature)
        generation = await self.engine.generate(ids, sampling)
        return self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)

    async def close(self) -> None:
        await self.engine.close()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
