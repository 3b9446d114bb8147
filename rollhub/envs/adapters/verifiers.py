"""verifiers environments as rollhub envs: `make("verifiers:my_env_module")` calls the module's
`load_environment(**kwargs)` (or `module:function`), as the Environments Hub does.

A verifiers env drives its own rollout: it calls a model client for each turn and its
`env_response(messages, state)` for the replies, then its rubric scores the finished rollout.
The adapter inverts that control without touching the env: it runs the env's own
`run_rollout` as a per-episode task with a client whose "model" is the next `step` call, so
stop conditions, state setup, cleanup and rubric scoring are verifiers' own.

Semantics pinned by the tests:
* `reset(seed)` plays dataset row `seed % len(dataset)` of the env's train split (`eval=True`:
  its eval split).
* The reward is the rubric's score, paid on the step that ends the rollout; earlier steps pay 0.
* A reply the env's parser cannot read (`parser.parse_answer` is None) never reaches the env:
  the state stays and `format_ok` is False. A parser that reads any text (the base `Parser`)
  lets every reply through.
* Ended by `max_turns` (or a truncated turn): `truncated`; by any other stop condition:
  `terminated`. The adapter also truncates at `max_steps` (the env's `max_turns`, else 20).
* An error in the rollout: `vf.InfraError` (sandbox, tunnel) is machinery (`infra_failure`);
  any other error counts against the model (reward 0, terminated).
* Anchor: a digest of the env's last reply (verifiers exposes no state key; common.state_anchor).
* `success`: the rubric's reward >= 1 when the rollout ended.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.adapters.common import digest, require, split_target, user_message
from rollhub.envs.base import Env, Observation, StepResult, invalid_step_info

MODEL_NAME = "rollhub-policy"


def _as_dict(message: Any) -> dict[str, str]:
    get = message.get if isinstance(message, dict) else lambda k, d=None: getattr(message, k, d)
    content = get("content", "") or ""
    if not isinstance(content, str):  # content parts: keep the text ones
        content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return {"role": str(get("role", "user")), "content": content}


def _subclass_names(cls: type) -> set[str]:
    names, todo = set(), [cls]
    while todo:
        klass = todo.pop()
        names.add(klass.__name__)
        todo.extend(klass.__subclasses__())
    return names


def _bridge_client(session: VerifiersEnv) -> Any:
    """A verifiers Client whose model is the adapter's caller (each turn waits for `step`)."""
    import verifiers as vf
    from verifiers.clients.client import Client
    from verifiers.types import Response, ResponseMessage

    class PolicyBridge(Client):
        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

        async def get_response(self, prompt: Any, model: str, *args: Any, **kwargs: Any) -> Any:
            text = await session._turn(prompt)
            if text is None:
                raise vf.InfraError("the episode was closed")
            message = ResponseMessage(content=text, finish_reason="stop", is_truncated=False, tokens=None)
            return Response(id=f"rollhub-{session._turns}", created=int(time.time()), model=model, message=message)

    return PolicyBridge(None)


class VerifiersEnv(Env):
    """One verifiers environment behind the rollhub contract (module docstring: the mapping)."""

    action_tag = ""  # the env's own parser reads the reply

    def __init__(self, vf_env: Any, *, eval: bool = False, max_steps: int | None = None):
        self.vf_env = vf_env
        dataset = vf_env.get_eval_dataset() if eval else vf_env.get_dataset()
        if dataset is None or len(dataset) == 0:
            raise UserError(f"{type(vf_env).__name__} has no {'eval' if eval else 'train'} dataset to play")
        self.dataset = dataset
        turns = getattr(vf_env, "max_turns", -1)
        self.max_steps = int(max_steps or (turns if isinstance(turns, int) and turns > 0 else 20))
        self._task: asyncio.Task | None = None
        self._to_env: asyncio.Queue = asyncio.Queue()
        self._to_agent: asyncio.Queue = asyncio.Queue()
        self._seen = 0
        self._turns = 0
        self._steps = 0
        self._anchor: str | None = None
        self._first_text = ""

    async def _turn(self, prompt: Any) -> str | None:
        """Called by the rollout for each model turn: hand the prompt out, wait for the reply."""
        self._turns += 1
        await self._to_agent.put(("prompt", prompt))
        return await self._to_env.get()

    async def _run(self, rollout_input: dict[str, Any]) -> None:
        try:
            output = await self.vf_env.run_rollout(rollout_input, _bridge_client(self), MODEL_NAME, {})
            await self._to_agent.put(("done", output))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported to the waiting reset/step, which decides how to score it
            await self._to_agent.put(("error", exc))

    def _input(self, seed: int | None) -> dict[str, Any]:
        index = (seed or 0) % len(self.dataset)
        row = dict(self.dataset[index])
        row.setdefault("example_id", index)
        return {k: row[k] for k in ("prompt", "example_id", "answer", "task", "info") if k in row}

    async def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        await self._stop()
        self._to_env, self._to_agent = asyncio.Queue(), asyncio.Queue()
        self._seen = self._turns = self._steps = 0
        self._task = asyncio.create_task(self._run(self._input(seed)))
        kind, payload = await self._to_agent.get()
        if kind != "prompt":
            reason = payload if kind == "error" else (payload or {}).get("error")
            raise ConnectionError(f"verifiers rollout ended before its first turn: {reason}")
        messages = [_as_dict(m) for m in payload]
        self._seen = len(messages)
        self._first_text = "\n".join(m["content"] for m in messages)
        self._anchor = "o:" + digest(messages[-1]["content"])
        return messages, {"anchor": self._anchor, "success": False, "source": "verifiers"}

    async def step(self, action: str) -> StepResult:
        if self._task is None or self._anchor is None:
            raise RuntimeError("step() before reset()")
        self._steps += 1
        cut = self._steps >= self.max_steps
        parser = getattr(self.vf_env, "parser", None)
        if parser is not None and parser.parse_answer([{"role": "assistant", "content": action}]) is None:
            reply = "No answer found: answer in the format the instructions give."
            info = invalid_step_info(self._anchor, "the env's parser found no answer", format_ok=False)
            if cut:  # the step limit ends the rollout: close it so nothing keeps waiting
                await self._stop()
            return [user_message(reply)], 0.0, False, cut, info
        await self._to_env.put(action)
        kind, payload = await self._to_agent.get()
        if kind == "prompt":
            messages = [_as_dict(m) for m in payload]
            new = [m for m in messages[self._seen :] if m["role"] != "assistant"] or [user_message("")]
            self._seen = len(messages)
            self._anchor = "o:" + digest(new[-1]["content"])
            info = {"anchor": self._anchor, "success": False, "action_valid": True, "format_ok": True}
            if cut:
                await self._stop()
            return new, 0.0, False, cut, info
        self._task = None
        if kind == "error":
            return self._ended(None, f"{type(payload).__name__}: {payload}")
        return self._ended(payload, None)

    def _ended(self, output: dict[str, Any] | None, crash: str | None) -> StepResult:
        import verifiers as vf

        info: dict[str, Any] = {"anchor": self._anchor, "action_valid": True, "format_ok": True, "success": False}
        error = output.get("error") if output else None
        if crash is not None or error is not None:
            name = error.get("error") if isinstance(error, dict) else type(error).__name__
            if name in _subclass_names(vf.InfraError):  # the rollout output keeps the error's class name
                info["infra_failure"] = (
                    f"verifiers {name}: {error.get('message') if isinstance(error, dict) else error}"
                )
            reply = f"The episode ended with an error: {crash or error}"
            return [user_message(reply)], 0.0, True, False, info
        completion = [_as_dict(m) for m in output.get("completion") or []]
        last = max((i for i, m in enumerate(completion) if m["role"] == "assistant"), default=-1)
        tail = [m for m in completion[last + 1 :] if m["role"] != "assistant"] or [user_message("Episode over.")]
        reward = float(output.get("reward") or 0.0)
        truncated = output.get("stop_condition") == "max_turns_reached" or bool(output.get("is_truncated"))
        info["success"] = reward >= 1.0
        info["anchor"] = self._anchor = "o:" + digest(tail[-1]["content"])
        return tail, reward, not truncated, truncated, info

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # the episode is being thrown away
                pass

    def task_key(self) -> str | None:
        return digest(self._first_text) if self._first_text else None

    async def close(self) -> None:
        await self._stop()


def make_verifiers_env(target: str, *, eval: bool = False, max_steps: int | None = None, **kwargs: Any) -> VerifiersEnv:
    """Registry entry point for `verifiers:<module>` or `verifiers:<module:function>`; kwargs go to it."""
    require("verifiers", "verifiers", f"env verifiers:{target}")
    module_name, attr = split_target(target)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UserError(f"verifiers:{target}: no module {exc.name} (pip install the environment first)") from None
    load = getattr(module, attr or "load_environment", None)
    if not callable(load):
        raise UserError(f"verifiers:{target}: {module_name} has no {attr or 'load_environment'}()")
    return VerifiersEnv(load(**kwargs), eval=eval, max_steps=max_steps)
