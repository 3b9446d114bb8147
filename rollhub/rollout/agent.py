"""The agent layer: turns an env episode into a Trajectory with an inference engine.

`EpisodeRunner` is the per-trajectory state machine (prompt -> generate -> parse/step),
split into `next_request()` / `generate()` / `step_env()` so the env manager can drive
many of them independently (env-level async) or in lockstep (the sync baseline).
`run_episode()` is the plain loop over one runner.

What it guarantees:
* token in, token out: the ids of every turn's prompt are exactly the ids sent to the
  engine and the response ids exactly the ids it returned; the model's text is decoded for
  the env but never encoded again into anything the trainer trains on;
* `multi_turn` (how a multi-turn prompt is built; rollhub.rollout.prompting):
  - `prefix` (default): prompts grow by appending ids (`ChatSegments`): turn k+1's prompt
    is turn k's prompt + response ids + the template's closing and the env's reply as ids,
    so with full history an episode is one training sequence and the engine's prefix
    cache is reused. For templates that only append (ChatML, SmolLM2) this is also what
    the template renders. For a template that rewrites earlier turns (Qwen3-style: old
    `<think>` blocks dropped) the model keeps seeing its own earlier reasoning, which is
    what the engine saw and what the trainer trains on, but not what the template would
    show a served model;
  - `per_turn`: every turn's prompt is the template's rendering of the visible
    conversation (earlier responses as decoded text, rewritten as the template likes), so
    training matches how the model is served with that template; each turn whose prompt
    no longer extends the previous one becomes its own training sequence (more tokens to
    train, no prefix reuse). The response ids stay exactly the generated ones.
  `prefix` is the default because it is exact and cheapest for every template, and equal to
  the template's own rendering for the ones that only append;
* tools: an env that sets `chat_template_tools = True` and declares `tools` gets them
  rendered by the model's own chat template (`tools=`; a system block for templates that
  ignore it), and its actions are `ToolCallText`: the reply text with the parsed
  `<tool_call>` JSON attached (`action.tool_calls`, `action.tool_call_errors`);
* every response token keeps the engine's behaviour log-prob and policy version, also
  across weight updates: an aborted generation is resubmitted either with its partial
  output (versions per segment) or regenerated from the turn start (`resume_mode`);
* malformed output is not an error: the env says `format_ok`, the runner counts it and
  can add `format_penalty` to the turn reward;
* the context guard ends the episode as TRUNCATED (reason in `info["truncated_reason"]`)
  when the next prompt leaves fewer than `min_new_tokens` of room;
* failures follow the one rule of rollhub.rollout.types: the machinery's end the episode as
  INFRA_FAILED (never scored), the model's (an env exception caused by its action, context
  overflow, too many resubmits) as TRUNCATED with `info["model_failure"]`, scored and trained on.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams
from rollhub.rollout.prompting import ChatSegments
from rollhub.rollout.tool_calls import ToolCallText, parse_tool_calls, tool_names
from rollhub.rollout.types import MACHINERY_ERRORS, Trajectory, TrajectoryStatus, Turn

logger = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    """How the agent talks to the env and the engine."""

    # replaces (or adds) the system message of reset(); "" drops it (a tiny model that reads
    # no English learns the task from the observations alone)
    system_prompt: str | None = None
    history_window: int | None = None  # None = full history; k = last k turns after the opening
    # Markov agent: each prompt is the system message(s) + the latest observation only. For
    # envs whose observation is the whole state (Sokoban): prompts stay short and the policy
    # cannot latch onto stale turns
    observation_only: bool = False
    max_new_tokens: int = 64  # per turn
    min_new_tokens: int = 8  # context guard: end the episode if less room than this is left
    max_context_tokens: int = 2048  # prompt + response must fit
    max_turns: int | None = None  # extra cap on top of the env's own step limit
    temperature: float = 1.0  # sampling temperature of training episodes
    top_p: float = 1.0  # nucleus sampling: 1 = off
    top_k: int = -1  # sample among the k likeliest tokens: -1 = off
    format_penalty: float = 0.0  # added to the turn reward when the env reports format_ok=False
    resume_mode: Literal["partial", "regenerate"] = (
        "partial"  # partial = continue aborted output; regenerate = redo the turn
    )
    max_resubmits: int = 16  # per turn, after aborts (weight updates)
    # how multi-turn prompts are built (module docstring): "prefix" appends ids turn after turn
    # (one training sequence per episode, exactly what the engine saw); "per_turn" renders the
    # visible conversation with the chat template for every turn (for templates that rewrite
    # earlier turns, e.g. drop old <think> blocks, when training should match serving)
    multi_turn: Literal["prefix", "per_turn"] = "prefix"
    # train an agent program instead of this loop: a command run once per episode with OPENAI_BASE_URL
    # set to its own gateway session; it gives its reward through the session API (docs/gateway.md)
    program: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.history_window is not None and self.history_window < 0:
            raise ValueError("history_window must be >= 0 or null (full history)")
        if self.observation_only and self.history_window is not None:
            raise ValueError("observation_only keeps no history: leave history_window null")
        if self.max_new_tokens < 1 or self.min_new_tokens < 1:
            raise ValueError("max_new_tokens and min_new_tokens must be >= 1")
        if self.max_context_tokens <= self.min_new_tokens:
            raise ValueError("max_context_tokens must exceed min_new_tokens")
        if self.resume_mode not in ("partial", "regenerate"):  # the loader checks this; direct construction does not
            raise ValueError("resume_mode must be 'partial' or 'regenerate'")
        if self.multi_turn not in ("prefix", "per_turn"):
            raise ValueError(f"multi_turn must be 'prefix' or 'per_turn', got {self.multi_turn!r}")
        if self.max_resubmits < 0:
            raise ValueError("max_resubmits must be >= 0")
        if any(not isinstance(part, str) or not part for part in self.program):
            raise ValueError(f"program must be a command as a list of non-empty strings, got {self.program!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 or null (the env's own limit), got {self.max_turns}")
        # the float checks are written `not (in range)` so that nan fails them too
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not self.format_penalty <= 0:  # it is added to the reward of a badly formatted turn
            raise ValueError(f"format_penalty is a penalty: use a value <= 0, got {self.format_penalty}")
        SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
        )


@dataclass
class _TurnSegments:
    """Ids of one finished turn as they appear in later prompts, beside the response ids themselves."""

    response: list[int]  # exactly as generated
    close: list[int]  # the template's end of the assistant message (after the response ids)
    reply: list[int]


class EpisodeRunner:
    """One trajectory's state; see module docstring for the driving protocol."""

    def __init__(
        self,
        env: Any,
        tokenizer: Any,
        config: AgentConfig,
        *,
        env_id: str,
        seed: int | None,
        trajectory_id: str = "",
        group_id: str = "",
        segments: ChatSegments | None = None,
    ) -> None:
        self.env = env
        self.tokenizer = tokenizer
        config.validate()  # checked where used (load_config also checks it, as a UserError)
        self.config = config
        self.segments = segments or ChatSegments(tokenizer)
        self.trajectory = Trajectory(
            env_id=env_id, seed=seed, trajectory_id=trajectory_id or uuid.uuid4().hex[:12], group_id=group_id
        )
        self.done = False
        self._messages: list[dict[str, str]] = []  # full conversation as text (per_turn prompts and logs)
        self._opening: list[dict[str, str]] = []  # messages of reset() (after the system prompt rule)
        self._turn_messages: list[list[dict[str, str]]] = []  # per turn: the assistant message + the env's reply
        self._tools: list[dict[str, Any]] | None = None  # the env's tools when it opted into template tools
        self._tool_names: set[str] | None = None
        self._head: list[int] = []
        self._system_head: list[int] = []
        self._turn_segments: list[_TurnSegments] = []
        self._anchor: Any = None
        self._started = time.perf_counter()
        self.trajectory.info.update(format_errors=0, invalid_actions=0, aborts=0, resubmits=0, discarded_tokens=0)
        self.trajectory.timings_s.update(reset=0.0, generate=0.0, env=0.0)
        self._request_counter = 0
        self.current_request_id: str | None = None

    # --- protocol --------------------------------------------------------------------

    async def reset(self) -> None:
        started = time.perf_counter()
        try:
            observation, info = await self.env.reset(seed=self.trajectory.seed)
        except Exception as exc:  # env machinery failed before the model did anything
            self._end(TrajectoryStatus.INFRA_FAILED, error=f"reset: {exc!r}")
            return
        finally:
            self.trajectory.timings_s["reset"] += time.perf_counter() - started
        if info.get("infra_failure"):
            self._end(TrajectoryStatus.INFRA_FAILED, error=str(info["infra_failure"]))
            return
        self._messages = self._apply_system_prompt(list(observation))
        self._opening = list(self._messages)
        if self.env.chat_template_tools and self.env.tools:
            self._tools = list(self.env.tools)
            self._tool_names = tool_names(self._tools)
        self._head = self.segments.encode_head(self._messages, self._tools)
        if self.config.observation_only:
            system = self._system_messages()
            self._system_head = self.segments.encode_head(system, self._tools) if system or self._tools else []
        self._anchor = info.get("anchor")

    def prompt_ids(self) -> list[int]:
        """The next prompt: head + the windowed turns + generation prompt."""
        if self.config.multi_turn == "per_turn":
            return self.segments.encode_conversation(self._visible_messages(), self._tools)
        if self.config.observation_only and self._turn_segments:
            return self._system_head + self._turn_segments[-1].reply + self.segments.generation_prompt_ids
        window = self._turn_segments
        if self.config.history_window is not None:
            window = window[len(window) - self.config.history_window :] if self.config.history_window else []
        ids = list(self._head)
        for turn in window:
            ids += self.segments.generation_prompt_ids + turn.response + turn.close + turn.reply
        return ids + self.segments.generation_prompt_ids

    def _visible_messages(self) -> list[dict[str, str]]:
        """The conversation the next prompt shows (`per_turn`): the same window rules as `prompt_ids`."""
        if self.config.observation_only and self._turn_messages:
            return self._system_messages() + self._turn_messages[-1][1:]
        window = self._turn_messages
        if self.config.history_window is not None:
            window = window[len(window) - self.config.history_window :] if self.config.history_window else []
        return self._opening + [message for turn in window for message in turn]

    def _system_messages(self) -> list[dict[str, str]]:
        return list(itertools.takewhile(lambda m: m.get("role") == "system", self._opening))

    def next_request(self) -> tuple[list[int], SamplingParams] | None:
        """The next (prompt ids, sampling) or None when the episode is over (guard applied)."""
        if self.done:
            return None
        max_turns = self.config.max_turns
        if max_turns is not None and len(self.trajectory.turns) >= max_turns:
            self.trajectory.info["truncated_reason"] = "max_turns"
            self._end(TrajectoryStatus.TRUNCATED)
            return None
        prompt = self.prompt_ids()
        room = self.config.max_context_tokens - len(prompt)
        if room < self.config.min_new_tokens:
            self.trajectory.info["context_tokens"] = len(prompt)
            self._end_model_failure("context", f"the next prompt has {len(prompt)} tokens")
            return None
        sampling = SamplingParams(
            max_new_tokens=min(self.config.max_new_tokens, room),
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            top_k=self.config.top_k,
        )
        return prompt, sampling

    async def generate(self, engine: InferenceEngine, prompt: list[int], sampling: SamplingParams) -> Generation:
        """Generate one turn, resubmitting after aborts; the result has per-token versions."""
        started = time.perf_counter()
        token_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        resubmits = 0
        try:
            while True:
                self._request_counter += 1
                self.current_request_id = f"{self.trajectory.trajectory_id}-{self._request_counter}"
                remaining = sampling.max_new_tokens - len(token_ids)
                segment_sampling = SamplingParams(
                    max_new_tokens=remaining,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k,
                    stop_token_ids=sampling.stop_token_ids,
                )
                generation = await engine.generate(
                    prompt + token_ids, segment_sampling, request_id=self.current_request_id
                )
                if generation.finish_reason != "abort":
                    token_ids += generation.token_ids
                    logprobs += generation.logprobs
                    versions += generation.token_versions
                    return Generation(
                        token_ids,
                        logprobs,
                        versions,
                        generation.finish_reason,
                        request_id=generation.request_id,
                        prompt_tokens=len(prompt),
                    )
                self.trajectory.info["aborts"] += 1
                if self.config.resume_mode == "partial":
                    token_ids += generation.token_ids
                    logprobs += generation.logprobs
                    versions += generation.token_versions
                else:
                    self.trajectory.info["discarded_tokens"] += len(generation.token_ids) + len(token_ids)
                    token_ids, logprobs, versions = [], [], []
                if resubmits >= self.config.max_resubmits or len(token_ids) >= sampling.max_new_tokens:
                    return Generation(
                        token_ids,
                        logprobs,
                        versions,
                        "abort" if len(token_ids) < sampling.max_new_tokens else "length",
                        prompt_tokens=len(prompt),
                    )
                resubmits += 1
                self.trajectory.info["resubmits"] += 1
        finally:
            self.current_request_id = None
            self.trajectory.timings_s["generate"] += time.perf_counter() - started

    async def step_env(self, prompt: list[int], generation: Generation) -> None:
        """Parse/step the env with the generated text and record the turn."""
        text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        action: str = text
        if self._tools is not None:
            parsed = parse_tool_calls(text, allowed_names=self._tool_names)
            action = ToolCallText(text, parsed)
            self.trajectory.info["tool_calls"] = self.trajectory.info.get("tool_calls", 0) + len(parsed.calls)
            self.trajectory.info["tool_call_errors"] = self.trajectory.info.get("tool_call_errors", 0) + len(
                parsed.errors
            )
        turn = Turn(
            prompt_ids=prompt,
            response_ids=list(generation.token_ids),
            behaviour_logprobs=list(generation.logprobs),
            token_versions=list(generation.token_versions),
            response_text=text,
            anchor=self._anchor,
            finish_reason=generation.finish_reason,
        )
        turn.timings_s["generate"] = float(generation.meta.get("e2e_latency_s", 0.0))
        self.trajectory.turns.append(turn)
        if generation.finish_reason == "abort":  # resubmit cap reached: the turn ran across too many versions
            self._end_model_failure("max_resubmits", f"generation aborted more than {self.config.max_resubmits} times")
            return
        started = time.perf_counter()
        try:
            observation, reward, terminated, truncated, info = await self.env.step(action)
        except MACHINERY_ERRORS as exc:
            self._end(TrajectoryStatus.INFRA_FAILED, error=f"step: {exc!r}")
            return
        except Exception as exc:  # the env got the model's action and could not process it
            turn.action_valid = False
            self.trajectory.info["invalid_actions"] += 1
            self._end_model_failure("env_error", f"step: {exc!r}")
            return
        finally:
            elapsed = time.perf_counter() - started
            turn.timings_s["env_step"] = elapsed
            self.trajectory.timings_s["env"] += elapsed
        if info.get("infra_failure"):
            self._end(TrajectoryStatus.INFRA_FAILED, error=str(info["infra_failure"]))
            return
        if isinstance(info.get("metrics"), dict):  # the env's own running counts (rollhub.envs.base)
            self.trajectory.info["env_metrics"] = dict(info["metrics"])
        if isinstance(info.get("exploit_signals"), dict):  # shortcuts the env noticed (rollhub.envs.base)
            seen = self.trajectory.info.setdefault("exploit_signals", {})
            for name, value in info["exploit_signals"].items():
                seen[str(name)] = seen.get(str(name), 0.0) + float(value if isinstance(value, (int, float)) else 0)
        turn.format_ok = bool(info.get("format_ok", True))
        turn.action_valid = bool(info.get("action_valid", True))
        turn.reward = float(reward) + (self.config.format_penalty if not turn.format_ok else 0.0)
        turn.observation = list(observation)
        if not turn.format_ok:
            self.trajectory.info["format_errors"] += 1
        if not turn.action_valid:
            self.trajectory.info["invalid_actions"] += 1
        self._anchor = info.get("anchor")
        assistant = {"role": "assistant", "content": text}
        if self.config.multi_turn == "prefix":  # per_turn renders the messages instead
            self._turn_segments.append(
                _TurnSegments(
                    list(turn.response_ids),
                    self.segments.close_assistant(turn.response_ids),
                    self.segments.encode_reply(list(observation)),
                )
            )
        self._turn_messages.append([assistant, *observation])
        self._messages += [assistant, *observation]
        if terminated or truncated:
            self.trajectory.success = bool(info.get("success", False))
            if truncated and not terminated:
                self.trajectory.info["truncated_reason"] = "env_step_limit"
            self._end(TrajectoryStatus.COMPLETED if terminated else TrajectoryStatus.TRUNCATED)

    def cancel(self) -> None:
        """Mark the trajectory cancelled (redundant straggler or shutdown)."""
        if not self.done:
            self._end(TrajectoryStatus.CANCELLED)

    def fail_infra(self, error: str) -> None:
        """End the episode as the machinery's failure; for callers that drive the engine
        themselves (lockstep batches) and catch its errors there."""
        if not self.done:
            self._end(TrajectoryStatus.INFRA_FAILED, error=error)

    @property
    def messages(self) -> list[dict[str, str]]:
        return list(self._messages)

    # --- helpers ---------------------------------------------------------------------

    def _apply_system_prompt(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        if self.config.system_prompt is None:
            return messages
        if not self.config.system_prompt:
            return [m for m in messages if m.get("role") != "system"]
        system = {"role": "system", "content": self.config.system_prompt}
        if messages and messages[0]["role"] == "system":
            return [system, *messages[1:]]
        return [system, *messages]

    def _end_model_failure(self, reason: str, detail: str) -> None:
        """End the episode as the model's failure: trainable, scored with what it earned so far."""
        self.trajectory.info["model_failure"] = reason
        self.trajectory.info["truncated_reason"] = reason
        self.trajectory.info["model_failure_detail"] = detail
        # an exception from env.step may also be a bug of the env: keep it visible
        level = logging.WARNING if reason == "env_error" else logging.INFO
        logger.log(level, "trajectory %s: model failure (%s): %s", self.trajectory.trajectory_id, reason, detail)
        self._end(TrajectoryStatus.TRUNCATED)

    def _end(self, status: TrajectoryStatus, error: str | None = None) -> None:
        self.done = True
        self.trajectory.status = status
        if error is not None:
            self.trajectory.infra_error = error
            logger.warning("trajectory %s: %s", self.trajectory.trajectory_id, error)
        self.trajectory.timings_s["total"] = time.perf_counter() - self._started


async def run_episode(
    env: Any,
    engine: InferenceEngine,
    tokenizer: Any,
    config: AgentConfig,
    seed: int | None,
    *,
    env_id: str | None = None,
    trajectory_id: str = "",
    group_id: str = "",
    segments: ChatSegments | None = None,
) -> Trajectory:
    """Play one episode of `env` with `engine`; the env is not closed here (the caller owns it)."""
    env_id = env_id or (env.spec.id if env.spec is not None else type(env).__name__)
    runner = EpisodeRunner(
        env,
        tokenizer,
        config,
        env_id=env_id,
        seed=seed,
        trajectory_id=trajectory_id,
        group_id=group_id,
        segments=segments,
    )
    await runner.reset()
    while (request := runner.next_request()) is not None:
        prompt, sampling = request
        generation = await runner.generate(engine, prompt, sampling)
        await runner.step_env(prompt, generation)
    return runner.trajectory
