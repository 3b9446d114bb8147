"""OpenEnv environments (`openenv-core`) as rollhub envs, in-process or over a server's WebSocket.

    make("openenv:my_pkg.server:MyEnvironment")   # the Environment class, one instance per env
    make("openenv:ws://127.0.0.1:8000")           # a running server: one WebSocket session per env

OpenEnv actions are typed (a pydantic `Action`); the model writes text. The adapter takes the
text inside `action_tag` and puts it in the action's one string field (`text_field`, found from
the class or the server's `/schema` when there is just one), or, for actions with several
fields, parses it as a JSON object. Text that does not validate never reaches the env: the state
stays and the reply carries the validation error (an invalid action, reward 0).

Semantics pinned by the tests:
* OpenEnv has `done` and no truncation flag: the adapter truncates at `max_steps`.
* `reward` None (OpenEnv's "no reward this step") is 0.0; `success` is `metadata["success"]`
  when the env sets a bool there, else "done with a positive reward".
* Anchor: a digest of the env's `state` without `episode_id` and `step_count` (in-process: the
  `state` property; server: the `state` message), or of the observation text when that is empty.
* The HTTP `/reset` and `/step` build a fresh env per request, so the server adapter only uses
  the `/ws` session endpoint. A dropped connection or a timeout is machinery (`ConnectionError`);
  an error the server returns for an action is the action's fault (an invalid action).
"""

from __future__ import annotations

import asyncio
import json
import typing
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.adapters.common import digest, require, split_target, state_anchor, user_message
from rollhub.envs.base import Env, Observation, StepResult, extract_action, invalid_step_info, wrap_action

OBS_RESERVED = ("done", "reward", "metadata")


def observation_text(fields: dict[str, Any]) -> str:
    """An observation's own fields as text: the one string field as it is, several as JSON."""
    own = {k: v for k, v in fields.items() if k not in OBS_RESERVED}
    if len(own) == 1 and isinstance(next(iter(own.values())), str):
        return next(iter(own.values()))
    return json.dumps(own, sort_keys=True, default=str)


def string_field(properties: dict[str, Any], required: list[str]) -> str | None:
    """The action's one text field (a JSON schema's properties), or None when there is not exactly one."""
    names = [
        n
        for n, p in properties.items()
        if n != "metadata" and (p.get("type") == "string" or all(isinstance(v, str) for v in p.get("enum", [0])))
    ]
    others = [n for n in required if n not in names]
    return names[0] if len(names) == 1 and not others else None


class _OpenEnvBase(Env):
    """Shared text <-> typed-action mapping; subclasses talk to the env."""

    def __init__(self, *, text_field: str | None, action_tag: str, max_steps: int, system_prompt: str | None):
        self.text_field = text_field
        #: the text field's allowed values when the action schema enumerates them (random actions)
        self.choices: list[str] = []
        self.action_tag = action_tag
        self.max_steps = max_steps
        self.system_prompt = system_prompt
        self._steps = 0
        self._anchor: str | None = None
        self._first_text = ""

    def _payload(self, text: str) -> dict[str, Any]:
        if self.text_field:
            return {self.text_field: text}
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("the action must be a JSON object of the action's fields")
        return value

    async def _reset(self, seed: int | None) -> tuple[dict[str, Any], Any]:
        raise NotImplementedError

    async def _step(self, payload: dict[str, Any]) -> tuple[dict[str, Any], float | None, bool, Any] | str:
        """(observation fields, reward, done, state) or the reason the action was refused."""
        raise NotImplementedError

    async def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        self._steps = 0
        fields, state = await self._reset(seed)
        text = observation_text(fields)
        self._first_text = text
        self._anchor = state_anchor(state, text)
        messages: Observation = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append(user_message(text))
        return messages, {"anchor": self._anchor, "success": False, "source": "openenv"}

    async def step(self, action: str) -> StepResult:
        if self._anchor is None:
            raise RuntimeError("step() before reset()")
        self._steps += 1
        cut = self._steps >= self.max_steps
        text = extract_action(action, self.action_tag)
        if text is None:
            reply = f"No action found: answer with <{self.action_tag}>...</{self.action_tag}>."
            return [user_message(reply)], 0.0, False, cut, invalid_step_info(self._anchor, reply, format_ok=False)
        try:
            payload = self._payload(text)
        except ValueError as exc:
            reply = f"Invalid action: {exc}"
            return [user_message(reply)], 0.0, False, cut, invalid_step_info(self._anchor, reply, format_ok=True)
        result = await self._step(payload)
        if isinstance(result, str):
            reply = f"Invalid action: {result}"
            return [user_message(reply)], 0.0, False, cut, invalid_step_info(self._anchor, reply, format_ok=True)
        fields, reward, done, state = result
        obs_text = observation_text(fields)
        self._anchor = state_anchor(state, obs_text)
        reward = float(reward or 0.0)
        metadata = fields.get("metadata") or {}
        success = metadata.get("success") if isinstance(metadata.get("success"), bool) else (done and reward > 0)
        info = {"anchor": self._anchor, "success": bool(success), "action_valid": True, "format_ok": True}
        return [user_message(obs_text)], reward, bool(done), bool(cut and not done), info

    def task_key(self) -> str | None:
        return digest(self._first_text) if self._first_text else None

    def random_action(self, rng: Any) -> str:
        if not self.choices:
            raise NotImplementedError("the action schema enumerates no values to sample")
        return wrap_action(self.choices[int(rng.integers(len(self.choices)))], self.action_tag)


def enum_of(properties: dict[str, Any], field: str | None) -> list[str]:
    values = properties.get(field, {}).get("enum") if field else None
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


def _action_class(env_cls: type) -> type | None:
    """The Action type an `Environment[ActT, ObsT, StateT]` subclass declares."""
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                return args[0]
    return None


class OpenEnvInProcessEnv(_OpenEnvBase):
    """An OpenEnv `Environment` instance driven through its async twins (`reset_async`, `step_async`)."""

    def __init__(
        self,
        environment: Any,
        *,
        action_cls: type | None = None,
        text_field: str | None = None,
        action_tag: str = "action",
        max_steps: int = 20,
        system_prompt: str | None = None,
    ):
        self.environment = environment
        self.action_cls = action_cls or _action_class(type(environment))
        if self.action_cls is None:
            raise UserError(f"{type(environment).__name__}: pass action_cls= (its Action type is not declared)")
        schema = self.action_cls.model_json_schema()
        if text_field is None:
            text_field = string_field(schema.get("properties", {}), schema.get("required", []))
        super().__init__(text_field=text_field, action_tag=action_tag, max_steps=max_steps, system_prompt=system_prompt)
        self.choices = enum_of(schema.get("properties", {}), text_field)
        self._closed = False

    def _state(self) -> Any:
        state = self.environment.state
        return state.model_dump() if hasattr(state, "model_dump") else state

    async def _reset(self, seed: int | None) -> tuple[dict[str, Any], Any]:
        obs = await self.environment.reset_async(seed=seed)
        return obs.model_dump(), self._state()

    async def _step(self, payload: dict[str, Any]) -> tuple[dict[str, Any], float | None, bool, Any] | str:
        from pydantic import ValidationError

        try:
            action = self.action_cls.model_validate(payload)
        except ValidationError as exc:
            return str(exc.errors()[0].get("msg", exc))[:300]
        obs = await self.environment.step_async(action)
        return obs.model_dump(), obs.reward, bool(obs.done), self._state()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await asyncio.to_thread(self.environment.close)


class OpenEnvServerEnv(_OpenEnvBase):
    """One WebSocket session with a running OpenEnv server (`openenv.core.GenericEnvClient`)."""

    def __init__(
        self,
        base_url: str,
        *,
        text_field: str | None = None,
        action_tag: str = "action",
        max_steps: int = 20,
        system_prompt: str | None = None,
        timeout_s: float = 60.0,
    ):
        require("openenv", "openenv", f"env openenv:{base_url}")
        super().__init__(text_field=text_field, action_tag=action_tag, max_steps=max_steps, system_prompt=system_prompt)
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._client: Any = None
        self._schema_read = text_field is not None

    async def _session(self) -> Any:
        from openenv.core import GenericEnvClient

        if not self._schema_read:
            self.text_field = await self._text_field_from_schema()
            self._schema_read = True
        if self._client is None:
            self._client = GenericEnvClient(base_url=self.base_url, message_timeout_s=self.timeout_s)
            await self._client.connect()  # raises ConnectionError when the server is not there
        return self._client

    async def _text_field_from_schema(self) -> str | None:
        import httpx

        url = self.base_url.replace("ws://", "http://").replace("wss://", "https://").rstrip("/") + "/schema"
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as http:
                response = await http.get(url)
                response.raise_for_status()
        except httpx.HTTPError as exc:
            raise ConnectionError(f"OpenEnv server {self.base_url}: /schema failed: {exc}") from exc
        action = response.json().get("action", {})
        field = string_field(action.get("properties", {}), action.get("required", []))
        self.choices = enum_of(action.get("properties", {}), field)
        return field

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """A client call; transport failures become ConnectionError (machinery, rollout.types)."""
        client = await self._session()
        try:
            return await getattr(client, name)(*args, **kwargs)
        except RuntimeError:
            raise  # the server answered with an error message
        except Exception as exc:
            if isinstance(exc, OSError) or type(exc).__module__.startswith("websockets"):  # OSError: timeouts too
                self._client = None
                raise ConnectionError(f"OpenEnv server {self.base_url}: {type(exc).__name__}: {exc}") from exc
            raise

    async def _reset(self, seed: int | None) -> tuple[dict[str, Any], Any]:
        result = await self._call("reset", seed=seed)
        state = await self._call("state")
        return dict(result.observation), state

    async def _step(self, payload: dict[str, Any]) -> tuple[dict[str, Any], float | None, bool, Any] | str:
        try:
            result = await self._call("step", payload)
        except RuntimeError as exc:  # the server refused the action (validation or execution error)
            return str(exc)[:300]
        state = await self._call("state")
        return dict(result.observation), result.reward, bool(result.done), state

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except Exception:  # the session is gone either way; closing must not raise
                pass


def make_openenv_env(target: str, **kwargs: Any) -> Env:
    """Registry entry point for `openenv:<module:Class>` and `openenv:<ws|http>://host:port`."""
    if target.startswith(("ws://", "wss://", "http://", "https://")):
        return OpenEnvServerEnv(target, **kwargs)
    require("openenv", "openenv", f"env openenv:{target}")
    module_name, attr = split_target(target)
    if attr is None:
        raise UserError(f"openenv:{target}: name the Environment class, e.g. openenv:my_pkg.server:MyEnvironment")
    import importlib

    env_cls = getattr(importlib.import_module(module_name), attr)
    env_kwargs = kwargs.pop("env_kwargs", None) or {}
    return OpenEnvInProcessEnv(env_cls(**env_kwargs), **kwargs)
