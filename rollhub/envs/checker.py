"""`check_env`: does an env honour the contract in `rollhub/envs/base.py`, and can a generic
exploit earn its reward?

Run by the tests on every registered env (and worth running on any new env). It works from
plain code and inside an event loop:

    warnings = check_env("rollhub/Sokoban-v0")          # sync: runs the checks, raises EnvCheckError
    warnings = await check_env("rollhub/Sokoban-v0")    # inside a running loop (or: await acheck_env(...))

It checks the optional members the env sets (types and shapes of `action_tag`, `tools`,
`max_steps`, `chat_template_tools`, `CHECK_BY_BUILDING`, `hackability_note`, what `task_set()`
and `could_draw()` return), message and info types, determinism under a seed (two fresh resets
and the same actions give the same observations, rewards and anchors), that an unparseable
action is rejected without raising and leaves the state unchanged, that episodes end by
`terminated` or `truncated` within the step limit, and that `close()` is idempotent
(and, when given an id, safe on an env that was never reset).

Then it plays the hack battery (rollhub.envs.hack_battery: echo the question, its numbers and
expressions, or the last observation; empty, whitespace, several and huge answers; the answer
inside a tool call; nested, unclosed, repeated and wrong-case tags; unicode digits; the prompt's
own example answer) on `hack_seeds` seeds (64; no new episode after `hack_budget_s`, 30 s).
Hackability = the best exploit's mean score on the env's success scale; above
`HACKABILITY_LIMIT` (0.05) and above what the env's own `random_action` play scores on the same
seeds (else the exploit only plays an easy game) the env fails unless its class declares `hackability_note` (why it is
fine; check_env then skips the battery, `rollhub bench env` still measures it).
`missing_requirements(spec)` tells whether an env can run here at all (Docker engine, extras).
"""

from __future__ import annotations

import asyncio
import collections.abc
import importlib.metadata
import logging
import os
import re
from collections.abc import Generator, Hashable
from typing import Any

import numpy as np

from rollhub.envs.base import Env
from rollhub.envs.hack_battery import (
    DEFAULT_MAX_TURNS,
    HACK_BUDGET_S,
    HACK_SEEDS,
    HACKABILITY_LIMIT,
    BatteryResult,
    run_battery,
)
from rollhub.envs.registry import EnvSpec, make

logger = logging.getLogger(__name__)

GARBAGE_ACTION = "I am not sure what to do here."
REQUIRED_STEP_INFO = ("anchor", "success", "action_valid", "format_ok")


class EnvCheckError(AssertionError):
    """The env broke the contract; the message lists every problem found."""


def missing_requirements(spec: EnvSpec) -> list[str]:
    """Why `spec` cannot run on this machine ([] = it can).

    Understands "docker" (a reachable Docker engine), "extra:NAME" and `spec.extra` (every
    package of that pip extra installed), "file:PATH" (a file a build command makes, e.g. a
    generated task set); other requirement strings are assumed met.
    """
    missing = []
    extras = {r.split(":", 1)[1] for r in spec.requires if r.startswith("extra:")}
    if spec.extra:
        extras.add(spec.extra)
    for extra in sorted(extras):
        absent = _missing_extra_packages(extra)
        if absent:
            missing.append(f"extra '{extra}' not installed (missing {', '.join(absent)}; pip install -e '.[{extra}]')")
    if "docker" in spec.requires and not docker_available():
        missing.append("no Docker engine reachable (start dockerd or set DOCKER_HOST)")
    for requirement in spec.requires:
        if requirement.startswith("file:") and not os.path.isfile(os.path.expanduser(requirement[5:])):
            missing.append(
                f"{requirement[5:]} does not exist (see the env's description for the command that makes it)"
            )
    return missing


def _missing_extra_packages(extra: str) -> list[str]:
    try:
        requirements = importlib.metadata.requires("rollhub") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    absent = []
    for requirement in requirements:
        if f'extra == "{extra}"' not in requirement.replace("'", '"'):
            continue
        name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            absent.append(name)
    return absent


_docker_status: bool | None = None


def docker_available() -> bool:
    """Whether a Docker engine answers a ping (cached for the process)."""
    global _docker_status
    if _docker_status is None:
        try:
            import docker

            client = docker.from_env(timeout=5)
            _docker_status = bool(client.ping())
            client.close()
        except Exception:  # no SDK, no socket, no permission: all mean "not here"
            _docker_status = False
    return _docker_status


def check_env(
    env_or_id: Env | str,
    *,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    hack_seeds: int = HACK_SEEDS,
    hack_max_turns: int = DEFAULT_MAX_TURNS,
    hack_budget_s: float = HACK_BUDGET_S,
) -> Any:
    """Validate the env contract and its hackability; returns warnings, raises EnvCheckError.

    From plain code (no running event loop) it runs the checks and returns the warnings
    (`CheckWarnings`, a list that `asyncio.run` also accepts, as older code calls it). Inside
    a running loop it cannot block that loop, so it returns the awaitable of `acheck_env`:
    write `await check_env(...)` there (an un-awaited call checks nothing, and Python warns
    "coroutine ... was never awaited"). Arguments as `acheck_env`.
    """
    checks = acheck_env(
        env_or_id,
        seed=seed,
        env_kwargs=env_kwargs,
        hack_seeds=hack_seeds,
        hack_max_turns=hack_max_turns,
        hack_budget_s=hack_budget_s,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return CheckWarnings(asyncio.run(checks))
    return checks


class CheckWarnings(list, collections.abc.Coroutine):
    """What `check_env` returns from plain code: the warnings, a list. The checks have run already;
    it is also a finished coroutine, so code written for the async-only `check_env`
    (`asyncio.run(check_env(...))`) keeps working and gets the same list."""

    def __await__(self) -> Generator[Any, None, CheckWarnings]:
        return self
        yield  # a generator that finishes at once with the list

    def send(self, value: Any) -> Any:
        raise StopIteration(self)

    def throw(self, *exc: Any) -> Any:
        raise exc[1] if len(exc) > 1 and exc[1] is not None else exc[0]


async def acheck_env(
    env_or_id: Env | str,
    *,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    hack_seeds: int = HACK_SEEDS,
    hack_max_turns: int = DEFAULT_MAX_TURNS,
    hack_budget_s: float = HACK_BUDGET_S,
) -> list[str]:
    """Validate the env contract and its hackability; returns warnings, raises EnvCheckError on errors.

    With an id, fresh instances are built (one is closed without a reset; two play the
    same seeded episode). With an instance, the same instance plays the episode twice.
    `hack_seeds` seeds per exploit of the hack battery (0 = skip the battery), each episode
    at most `hack_max_turns` turns; no new seed starts after `hack_budget_s` seconds of it (an
    env that starts a container per episode plays fewer seeds, never fewer than one).
    """
    problems: list[str] = []
    warnings: list[str] = []

    def build() -> Env:
        return make(env_or_id, **(env_kwargs or {})) if isinstance(env_or_id, str) else env_or_id

    fresh_instances = isinstance(env_or_id, str)
    env = build()
    if not isinstance(env, Env):
        raise EnvCheckError(f"{type(env).__name__} does not subclass rollhub.envs.Env")
    name = env_or_id if fresh_instances else type(env).__name__
    try:
        if fresh_instances:
            await env.close()  # closing an env that was never reset must be safe
            env = build()
        _check_members(env, problems)  # before any reset, as a run's checks ask a fresh env
        first = await _play(env, seed, problems, warnings)
        if fresh_instances:
            await env.close()
            env = build()
        second = await _play(env, seed, problems, warnings)
        if first != second:
            problems.append(f"not deterministic under seed {seed}: {_first_difference(first, second)}")
        await _check_invalid_action(env, seed, problems)
        note = env.unwrapped.hackability_note
        if note and isinstance(
            note, str
        ):  # the author answered the battery already: `rollhub bench env` still measures
            logger.info("%s: hack battery not played; declared: %s", name, note)
        elif hack_seeds > 0 and not problems:
            battery = await run_battery(
                env,
                seeds=range(seed, seed + hack_seeds),
                max_turns=hack_max_turns,
                name=str(name),
                budget_s=hack_budget_s,
            )
            _check_hackability(env, battery, problems)
    except EnvCheckError:
        raise
    except Exception as exc:
        problems.append(f"raised {type(exc).__name__}: {exc}")
    finally:
        try:
            await env.close()
            await env.close()
        except Exception as exc:
            problems.append(f"close() is not idempotent: {type(exc).__name__}: {exc}")
    if problems:
        unique = list(dict.fromkeys(problems))
        raise EnvCheckError(f"{name} fails the env contract:\n- " + "\n- ".join(unique))
    warnings = list(dict.fromkeys(warnings))
    for warning in warnings:
        logger.warning("%s: %s", name, warning)
    return warnings


def _check_hackability(env: Env, battery: BatteryResult, problems: list[str]) -> None:
    """Above the limit and above random play the env fails (an env whose class says why that is
    fine, `hackability_note`, is not played at all)."""
    if not battery.is_hack:
        return
    problems.append(
        f"{battery.describe()}: above {HACKABILITY_LIMIT} and above random play, an agent that does not "
        "do the task earns reward; fix the env (see rollhub.envs.hack_battery) or declare why it is fine "
        "in the class attribute hackability_note"
    )


async def _play(env: Env, seed: int, problems: list[str], warnings: list[str]) -> list[tuple]:
    """One episode with seeded random actions; returns a trace for the determinism check."""
    rng = np.random.default_rng(seed)
    result = await env.reset(seed=seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        problems.append(f"reset() must return (obs, info), got {type(result).__name__}")
        return []
    obs, info = result
    _check_messages(obs, "reset", problems)
    _check_info(info, ("anchor", "success"), "reset", problems)
    key = env.task_key()  # part of the trace: the same seed must give the same content key
    if key is not None and not isinstance(key, str):
        problems.append(f"task_key() must return None or a str, got {type(key).__name__}")
        key = None
    trace: list[tuple] = [("reset", _freeze(obs), _anchor_of(info), key)]
    limit = env.max_steps
    for step in range(1, limit + 1):
        try:
            action = env.random_action(rng)
        except NotImplementedError:
            action = GARBAGE_ACTION
            if step == 1:
                warnings.append("no random_action(); played an unparseable action instead")
        result = await env.step(action)
        if not (isinstance(result, tuple) and len(result) == 5):
            problems.append("step() must return (obs, reward, terminated, truncated, info)")
            return trace
        obs, reward, terminated, truncated, info = result
        _check_messages(obs, "step", problems)
        _check_info(info, REQUIRED_STEP_INFO, "step", problems)
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            problems.append(f"reward must be a float, got {type(reward).__name__}")
        if not isinstance(terminated, bool) or not isinstance(truncated, bool):
            problems.append("terminated and truncated must be bools")
        if truncated and terminated:
            warnings.append("an episode step was both terminated and truncated")
        trace.append((action, _freeze(obs), float(reward), terminated, truncated, _anchor_of(info)))
        if terminated or truncated:
            if not isinstance(info.get("success"), bool):
                problems.append("info['success'] must be a bool when the episode ends")
            return trace
    problems.append(f"episode neither terminated nor truncated within max_steps={limit}")
    return trace


async def _check_invalid_action(env: Env, seed: int, problems: list[str]) -> None:
    """An unparseable action must not raise, must say so, and must not change the state."""
    _, info = await env.reset(seed=seed)
    before = _anchor_of(info)
    try:
        obs, reward, terminated, truncated, info = await env.step(GARBAGE_ACTION)
    except Exception as exc:
        problems.append(f"an unparseable action raised {type(exc).__name__}: {exc}")
        return
    if info.get("action_valid") is not False:
        problems.append("an unparseable action was not reported with info['action_valid'] = False")
    if info.get("format_ok") is not False:
        problems.append("an unparseable action was not reported with info['format_ok'] = False")
    if terminated:
        problems.append("an unparseable action terminated the episode (it may only truncate at the step limit)")
    if _anchor_of(info) != before:
        problems.append("an unparseable action changed the state (anchor differs)")
    if not any(isinstance(m, dict) and m.get("content") for m in obs):
        problems.append("an unparseable action got no explanation in the observation")


def _check_members(env: Env, problems: list[str]) -> None:
    """The optional members of the contract (rollhub/envs/base.py), where the env sets them."""
    if not isinstance(env.action_tag, str):
        problems.append(f"action_tag must be a str ('' = bare answers), got {type(env.action_tag).__name__}")
    if isinstance(env.max_steps, bool) or not isinstance(env.max_steps, int) or env.max_steps < 1:
        problems.append(f"max_steps must be an int >= 1, got {env.max_steps!r}")
    tools = env.tools
    if tools is not None:
        if not isinstance(tools, list) or not tools:
            problems.append(f"tools must be None or a non-empty list of tool specs, got {str(tools)[:80]}")
        else:
            for tool in tools:
                function = tool.get("function", tool) if isinstance(tool, dict) else None
                name = function.get("name") if isinstance(function, dict) else None
                if not isinstance(name, str) or not name:
                    problems.append(f"tools: every spec needs a function name (OpenAI style), got {str(tool)[:80]}")
                    break
    if not isinstance(env.chat_template_tools, bool):
        problems.append(f"chat_template_tools must be a bool, got {env.chat_template_tools!r}")
    elif env.chat_template_tools and not tools:
        problems.append("chat_template_tools is True but the env declares no tools")
    if not isinstance(env.unwrapped.hackability_note, str):
        problems.append(f"hackability_note must be a str ('' = none), got {env.unwrapped.hackability_note!r}")
    if not isinstance(type(env).CHECK_BY_BUILDING, bool):
        problems.append(f"CHECK_BY_BUILDING must be a bool, got {type(env).CHECK_BY_BUILDING!r}")
    tasks = env.task_set()
    if tasks is not None and not (
        isinstance(tasks, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in tasks.items())
    ):
        problems.append(f"task_set() must return None or a dict of str keys to str names, got {str(tasks)[:80]}")
        tasks = None
    probe = set(list(tasks or {})[:50]) or {"probe-task"}
    drawable = env.could_draw(probe)
    if drawable is not None and not (isinstance(drawable, set) and drawable <= probe):
        problems.append(f"could_draw(keys) must return None or a subset of keys (a set), got {str(drawable)[:80]}")


def _check_messages(obs: Any, where: str, problems: list[str]) -> None:
    if not isinstance(obs, list) or not obs:
        problems.append(f"{where}: the observation must be a non-empty list of chat messages")
        return
    for message in obs:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            problems.append(f"{where}: every message needs str 'role' and 'content', got {message!r:.80}")
            return
        if message["role"] not in ("system", "user", "assistant", "tool"):
            problems.append(f"{where}: unknown message role {message['role']!r}")


def _check_info(info: Any, keys: tuple[str, ...], where: str, problems: list[str]) -> None:
    if not isinstance(info, dict):
        problems.append(f"{where}: info must be a dict")
        return
    missing = [k for k in keys if k not in info]
    if missing:
        problems.append(f"{where}: info lacks {', '.join(missing)}")
    if "anchor" in info and not isinstance(info["anchor"], Hashable):
        problems.append(f"{where}: info['anchor'] must be hashable, got {type(info['anchor']).__name__}")
    for key in ("success", "action_valid", "format_ok"):
        if key in info and not isinstance(info[key], bool):
            problems.append(f"{where}: info['{key}'] must be a bool")
    if "infra_failure" in info and info["infra_failure"]:
        problems.append(f"{where}: infra failure: {info['infra_failure']}")


def _anchor_of(info: Any) -> Any:
    return info.get("anchor") if isinstance(info, dict) else None


def _freeze(obs: Any) -> tuple:
    if not isinstance(obs, list):
        return (repr(obs),)
    return tuple((m.get("role"), m.get("content")) if isinstance(m, dict) else repr(m) for m in obs)


def _first_difference(first: list[tuple], second: list[tuple]) -> str:
    for index, (a, b) in enumerate(zip(first, second)):
        if a != b:
            return f"entry {index} differs: {str(a)[:120]} vs {str(b)[:120]}"
    return f"episode lengths differ ({len(first)} vs {len(second)})"
