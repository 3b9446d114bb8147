"""The environment contract every rollhub env follows.

An env is gymnasium-shaped but async, so thousands of them can step concurrently in one
event loop (env-level asynchrony) and an env may await a container or a worker process:

    obs, info = await env.reset(seed=3)
    obs, reward, terminated, truncated, info = await env.step(action_text)
    await env.close()

* Observations are lists of chat messages (`{"role": ..., "content": ...}`) that the env
  appends to the conversation: `reset` returns the opening messages (usually a system
  message with the rules and a user message with the first state), `step` returns the
  env's reply (usually one user or tool message). The agent layer owns the history.
* Actions are the model's raw text. The env extracts its action from `action_tag`
  (`<action>up</action>`) with `extract_action`, so every env documents and validates its
  own format. A malformed or invalid action never raises: the state stays unchanged,
  the reply says why, `info["action_valid"]` is False, `info["format_ok"]` tells whether
  the tag was found at all, and the env's invalid-action penalty is the reward.
* `terminated` = the task ended (won or lost); `truncated` = the step limit cut it.
* `info` keys every env sets: `anchor` (hashable, history-free key of the state the
  observation shows: GiGPO groups steps by it), `success` (bool; meaningful when done),
  `action_valid` and `format_ok` after a step. `infra_failure` (str) marks a failure of
  the machinery (container died, worker crashed) that must never be scored as a model
  failure. An exception raised by `step` counts against the action (a model failure,
  scored and trained on) unless it is a `SandboxError` or `ConnectionError`: report
  machinery faults through `info["infra_failure"]` (rule in rollhub.rollout.types).
  Optional: `metrics` (dict of floats) for logging, and `exploit_signals` (dict of signal
  name -> bool or count: `echo_answer`, `hack_suspected`, `patch_rejected`, ...) where the env
  noticed the model trying a shortcut instead of the task; an env that checks a signal reports
  it on every graded step (False when not seen), and training logs each signal's share of
  episodes as `train/exploit/<name>` and warns when it rises over the run.
* `tools`: envs that take tool calls declare them as JSON-schema function specs (OpenAI
  style); the action is then a `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
* `expert_action()`: the next action of a scripted expert (solver, walkthrough, gold
  patch), used by `rollhub envs try --agent expert`, tests and SFT data. Envs without one
  raise NotImplementedError.

Every member an env may set or override is declared on `Env` below with its default, so a
caller reads `env.tools` or `EnvClass.CHECK_BY_BUILDING` directly and never probes with
`getattr`; `check_env` checks their types. Levers that only make training easier (a
difficulty floor, a curriculum) are not members: they are wrappers (rollhub.envs.wrappers)
that `make` applies from their kwargs, so an evaluation env is one that is not wrapped.

Determinism: an env draws all randomness from a generator seeded in `reset(seed=...)`;
never the global `random`/`numpy` state (threads and workers would break it).
"""

from __future__ import annotations

import abc
from collections.abc import Hashable
from typing import Any, ClassVar, TypedDict


class Message(TypedDict):
    role: str
    content: str


Observation = list[Message]
StepResult = tuple[Observation, float, bool, bool, dict[str, Any]]


class Env(abc.ABC):
    """Async multi-turn text environment. Subclasses set the class attributes below."""

    #: tag that wraps the action in the model's text, e.g. "action" for <action>up</action>
    action_tag: str = "action"
    #: JSON-schema tool specs, or None for envs that take plain text actions
    tools: list[dict[str, Any]] | None = None
    #: step limit; reaching it without termination gives truncated=True
    max_steps: int = 50
    #: set by `make()`: the spec this env was built from (id, kwargs)
    spec: Any = None
    #: True: the agent renders `tools` with the model's own chat template (`tools=`) instead of
    #: the env describing them in its messages
    chat_template_tools: bool = False
    #: True: construction is cheap and checks every argument, so a run builds one env up front
    #: and a bad value is a one-line error before any model loads
    CHECK_BY_BUILDING: ClassVar[bool] = False
    #: why this env may be scored by a generic exploit (rollhub.envs.hack_battery) and is still
    #: fine; "" = it must not be: `check_env` fails it when the battery's best exploit scores
    #: above `HACKABILITY_LIMIT` and above the env's own random play
    hackability_note: ClassVar[str] = ""

    @abc.abstractmethod
    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode. Same seed -> same task and the same first observation."""

    @abc.abstractmethod
    async def step(self, action: str) -> StepResult:
        """Apply the model's text; returns (obs, reward, terminated, truncated, info)."""

    async def close(self) -> None:
        """Release resources. Must be idempotent and safe after a failed reset."""

    def expert_action(self) -> str:
        """Text of the scripted expert's next action (with the action tag)."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted expert")

    def random_action(self, rng: Any) -> str:
        """A random (syntactically valid) action, for `--agent random` and smoke tests.

        `rng` is a `numpy.random.Generator`. The default has nothing to pick from."""
        raise NotImplementedError(f"{type(self).__name__} has no random action")

    def render_text(self) -> str:
        """Human-readable current state (for transcripts and `--agent human`)."""
        return ""

    def task_set(self) -> dict[str, str] | None:
        """The fixed list of tasks this env plays (identity key -> readable name), or None for an
        env that makes its tasks from seeds. A run refuses evaluation tasks that training plays.

        Override it only when the list exists: the run check builds an env just to ask a class
        that overrides this method, so it must be cheap (a file listing, no worker)."""
        return None

    def could_draw(self, keys: set[str]) -> set[str] | None:
        """The keys among `keys` (another env's `task_set`) that this env might ever play, or None
        when it cannot tell. How a procedural env with a held-out partition (Math-v0's train
        split) proves its training never meets a fixed evaluation list."""
        return None

    def task_key(self) -> str | None:
        """A key of the content of the task the last `reset` drew (a hash of the problem text),
        or None when the env has none. In a finite procedural space different seeds draw the same
        task, so disjoint seed ranges do not keep evaluation off training data: the run check
        resets the env on evaluation and training seeds and compares these keys (and the keys
        of a `task_set`). Override it only when `reset` is cheap (no worker, no container)."""
        return None

    @property
    def unwrapped(self) -> Env:
        """The env itself, without the wrappers around it (rollhub.envs.wrappers)."""
        return self

    async def __aenter__(self) -> Env:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def extract_action(text: str, tag: str) -> str | None:
    """Content of the last `<tag>...</tag>` in `text`, stripped; None if absent.

    The last occurrence wins because models often restate the format before answering.
    An empty tag means bare answers: the whole stripped text is the action (a tiny model
    then spends one token per move instead of seven on the tags).
    """
    if not tag:
        return text.strip() or None
    # what re.findall(<tag>(.*?)</tag>) finds, scanned with str.find: the regex retries every opening
    # against the rest of the text, quadratic in a reply of many unclosed tags (seconds on the loop)
    opening, closing = f"<{tag}>", f"</{tag}>"
    last, position = None, 0
    while (start := text.find(opening, position)) != -1:
        end = text.find(closing, start + len(opening))
        if end == -1:
            break
        last, position = text[start + len(opening) : end], end + len(closing)
    return None if last is None else last.strip()


def wrap_action(action: str, tag: str) -> str:
    """The inverse of `extract_action`: what a well-formed model answer looks like."""
    if not tag:
        return action
    return f"<{tag}>{action}</{tag}>"


def invalid_step_info(anchor: Hashable, reason: str, *, format_ok: bool) -> dict[str, Any]:
    """Standard info for an action the env rejected (state unchanged)."""
    return {"anchor": anchor, "success": False, "action_valid": False, "format_ok": format_ok, "invalid_reason": reason}
