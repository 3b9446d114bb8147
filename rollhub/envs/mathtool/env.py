"""`rollhub/MathTool-v0`: arithmetic a small model cannot do in its head, with a code tool.

An episode is one problem (`problems.py`) and at most `max_turns` replies. Each reply either
calls a tool, `<tool_call>{"name": "python", "arguments": {"code": "print(4821 * 377)"}}</tool_call>`,
whose output comes back as a `tool` message, or answers, `<answer>1817517</answer>`, which ends
the episode: reward 1 when the answer is the problem's as an integer literal, the form the system
prompt states (`rollhub.envs.math.answer_forms`; an expression such as `4821 * 377` is never evaluated,
else copying the question would pay without a tool call), else 0.
A reply that does both runs the call and ignores the answer (it was written before the model saw
the output). A reply with neither, or with a call that cannot be read (bad JSON, unknown tool,
missing argument), is an invalid action: the state stays, the reply says what was wrong and how
a call is written, `format_ok` is False for an unreadable call or no call and no answer tag, and
the turn counts. The last turn ends by truncation (reward 0) unless it answered.

Tools (`tools=`): `python` (a program; what it prints and its error come back, truncated to
`max_output_chars`), `calculator` (one expression), `both`, or `none` (no tool is declared and
calls are plain text: the same problems scored without a tool, the baseline that makes a gain
attributable to tool use). The tools are declared as JSON schemas (`tools`) and rendered by the
agent with the model's chat template, or as a system block for templates that ignore `tools=`
(SmolLM2; `rollhub.rollout.prompting`).

Backends (`backend=`): `embedded` (a bounded arithmetic interpreter in worker processes off the
event loop, `tool_worker.py`, no Docker) or `sandbox` (real
`python3` in a pooled container; `backends.py`). Either way hostile code (loops, fork bombs, huge
output, host files, network, huge powers) gets an error or a timeout as its output and the
episode goes on; a failure of the machinery ends it as `infra_failure`, never scored.

Train/test split (`split=`) by content, as Math-v0: `test` plays the fixed list of `test_size`
held-out problems (seed s plays entry s % test_size), `train` never draws one of the test
partition, `all` is everything. `task_set`, `task_key` and `could_draw` let the trainer refuse
a run whose evaluation problems training could draw.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import numpy as np

from rollhub.envs.base import Env, Observation, StepResult, invalid_step_info, wrap_action
from rollhub.envs.hack_battery import echoes_question
from rollhub.envs.math.answer_forms import answer_is_correct
from rollhub.envs.math.answers import MAX_ANSWER_CHARS, extract_answer
from rollhub.envs.math.env import ContentSplit
from rollhub.envs.math.problems import Problem
from rollhub.envs.mathtool.backends import DEFAULT_IMAGE, EmbeddedBackend, SandboxBackend
from rollhub.envs.mathtool.problems import (
    KINDS,
    check_kinds,
    generate_problem,
    held_out_problems,
    in_test_partition,
    key_in_test_partition,
    problem_key,
)
from rollhub.sandbox.base import SandboxError

SPLITS = ("all", "train", "test")
TOOL_CHOICES = {"python": ("python",), "calculator": ("calculator",), "both": ("python", "calculator"), "none": ()}
BACKENDS = ("embedded", "sandbox")
TRAIN_REDRAWS = 200
MAX_CALL_CHARS = 4000  # a call block longer than this is refused before any JSON is read
MAX_REPLY_SCAN_CHARS = 100_000  # the fallback reader looks at no more of a reply than this

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a short Python program and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print the result"}},
            "required": ["code"],
        },
    },
}
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate one arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example 4821 * 377"}},
            "required": ["expression"],
        },
    },
}
TOOL_SPECS = {"python": PYTHON_TOOL, "calculator": CALCULATOR_TOOL}
ARGUMENT = {"python": "code", "calculator": "expression"}

# Worded for a 135M model, which copies the last assistant message it saw (the example's answer)
# unless told plainly what comes first: with this system prompt and the question's `nudge`
# SmolLM2-135M-Instruct writes a call in about a third of samples at T = 0.7; with a neutral
# "use the tool to compute" and no nudge in none of 48 (experiments/mathtool/README.md).
# It states the answer's form (every kind's answer is an integer, `answer_forms`), here and not
# after the question: "Give the answer as an integer." there took SmolLM2-135M's greedy tool-call
# rate on 32 test problems from 53% to 0% (placed before or after the nudge), stated here 50%.
SYSTEM_PROMPT = (
    "You are bad at arithmetic. To solve a problem, first call the {tool} tool with code that prints the "
    "result; when its output comes back, copy it into <answer></answer> as an integer, for example "
    "<answer>42</answer>."
)
NUDGE = " Use the {tool} tool."
SYSTEM_PROMPT_NO_TOOL = (
    "Solve the problem. Put only the final answer inside <answer></answer> as an integer, for example "
    "<answer>42</answer>."
)
# The example's problem (a 2-digit factor) lies outside every kind's space.
EXAMPLE_QUESTION = "Compute 12 * 345."
EXAMPLE_CODE = {"python": "print(12 * 345)", "calculator": "12 * 345"}
EXAMPLE_RESULT = "4140"
HINT_CODE = {"python": "print(...)", "calculator": "..."}


def _call_text(tool: str, argument: str) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': {ARGUMENT[tool]: argument}})}</tool_call>"


def _read_calls(text: str, allowed: tuple[str, ...]) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(calls, errors) of a plain-text reply, for callers that hand the env a `str` (`envs try`,
    tests). The agent hands a `ToolCallText` whose calls its own parser read already; envs may
    not import that layer, so this reader covers the plain `<tool_call>{json}</tool_call>` form
    with the same bounds (block size, count, JSON only) and refuses everything else."""
    calls: list[tuple[str, dict[str, Any]]] = []
    errors: list[str] = []
    text = text[:MAX_REPLY_SCAN_CHARS]
    for match in re.finditer(r"<tool_call>(.*?)(</tool_call>|$)", text, flags=re.DOTALL):
        body, closed = match.group(1), bool(match.group(2))
        if not closed:
            errors.append("unterminated <tool_call> (no closing tag)")
            break
        if len(body) > MAX_CALL_CHARS:
            errors.append(f"tool call of {len(body)} characters exceeds the limit of {MAX_CALL_CHARS}")
            continue
        try:
            data = json.loads(body.strip(), parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
        except (ValueError, RecursionError):
            errors.append("tool call is not valid JSON")
            continue
        name = data.get("name") if isinstance(data, dict) else None
        if not isinstance(name, str) or name not in allowed:
            errors.append(f"unknown tool {str(name)[:40]!r}" if isinstance(name, str) else "tool call needs a 'name'")
            continue
        arguments = data.get("arguments", {})
        if not isinstance(arguments, dict):
            errors.append(f"arguments of '{name}' must be a JSON object")
            continue
        calls.append((name, arguments))
        if len(calls) + len(errors) >= 16:
            break
    return calls, errors


class MathToolEnv(ContentSplit, Env):
    problem_key = staticmethod(problem_key)  # MathTool's own keys (ContentSplit reads these)
    key_in_test_partition = staticmethod(key_in_test_partition)

    """Arithmetic with a code tool; see the module docstring.

    Args:
        kinds: problem kinds (`problems.KINDS`).
        split, test_size: content-hash split (`all`, `train`, `test`) and the test list's size.
        tools: `python`, `calculator`, `both` or `none`.
        backend: `embedded` or `sandbox` (where `python` runs; the calculator is always embedded).
        max_turns: replies per episode (tool calls and the answer together).
        max_output_chars: tool output the model reads (head and tail kept).
        tool_timeout_s: per call (embedded: CPU time; sandbox: wall time, then the program is killed).
        example: one worked exchange before the problem, showing a call, its output and the answer.
        nudge: end the question with "Use the <tool> tool." (not with `tools: none`).
        result_role: the role of the tool's message (`tool`, or `user` for templates without one).
        require_format: grade only answers inside `<answer></answer>`.
        sandbox_image, sandbox_warm, sandbox_max_concurrent: the container backend's image, warm
            containers kept ready, and live containers at most (per event loop).
    """

    action_tag = "answer"
    CHECK_BY_BUILDING = True

    def __init__(
        self,
        kinds: str | tuple[str, ...] | list[str] = KINDS,
        split: Literal["all", "train", "test"] = "all",
        test_size: int = 200,
        tools: str = "python",
        backend: str = "embedded",
        max_turns: int = 3,
        max_output_chars: int = 500,
        tool_timeout_s: float | None = None,
        example: bool = True,
        nudge: bool = True,
        result_role: Literal["tool", "user"] = "tool",
        require_format: bool = True,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        invalid_reward: float = 0.0,
        sandbox_image: str = DEFAULT_IMAGE,
        sandbox_warm: int = 0,
        sandbox_max_concurrent: int = 16,
        sandbox_pool: Any = None,
    ):
        self.kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        check_kinds(self.kinds)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if not 1 <= test_size <= 100_000:
            raise ValueError(f"test_size must be in 1..100000, got {test_size}")
        if tools not in TOOL_CHOICES:
            raise ValueError(f"tools must be one of {', '.join(TOOL_CHOICES)}, got {tools!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if not 1 <= max_turns <= 20:
            raise ValueError(f"max_turns must be in 1..20, got {max_turns}")
        if not 20 <= max_output_chars <= 100_000:
            raise ValueError(f"max_output_chars must be in 20..100000, got {max_output_chars}")
        if result_role not in ("tool", "user"):
            raise ValueError(f"result_role must be 'tool' or 'user', got {result_role!r}")
        if tool_timeout_s is not None and not 0 < tool_timeout_s <= 60:
            raise ValueError(f"tool_timeout_s must be in (0, 60] seconds, got {tool_timeout_s}")
        self.split, self.test_size = split, test_size
        self.tool_choice = tools
        self.tool_names = TOOL_CHOICES[tools]
        self.tools = [TOOL_SPECS[name] for name in self.tool_names] or None
        self.chat_template_tools = bool(self.tool_names)
        self.max_steps = max_turns
        self.max_output_chars = max_output_chars
        self.example = example
        self.nudge = nudge
        self.result_role = result_role
        self.require_format = require_format
        self.correct_reward, self.wrong_reward, self.invalid_reward = correct_reward, wrong_reward, invalid_reward
        self.backend_name = backend
        if backend == "sandbox":
            self.backend: EmbeddedBackend | SandboxBackend = SandboxBackend(
                sandbox_pool,
                image=sandbox_image,
                timeout_s=tool_timeout_s or 5.0,
                max_output_chars=max_output_chars,
                warm=sandbox_warm,
                max_concurrent=sandbox_max_concurrent,
            )
        else:
            self.backend = EmbeddedBackend(timeout_s=tool_timeout_s or 0.2, max_output_chars=max_output_chars)
        self.calculator_timeout_s = min(tool_timeout_s or 0.2, 1.0)
        self.calculator = EmbeddedBackend(timeout_s=self.calculator_timeout_s, max_output_chars=max_output_chars)
        self.problems = list(held_out_problems(self.kinds, test_size)) if split == "test" else None
        self._rng = np.random.default_rng()
        self._problem: Problem | None = None
        self._turns = 0
        self._done = False
        self._last_reply = ""
        self.stats: dict[str, int] = {}

    # --- episode ------------------------------------------------------------------------

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        await self.backend.release()
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        index = (options or {}).get("index")
        if self.problems is not None:
            if index is None:
                index = seed % len(self.problems) if seed is not None else int(self._rng.integers(len(self.problems)))
            if not 0 <= index < len(self.problems):
                raise ValueError(f"problem index {index} out of range 0..{len(self.problems) - 1}")
            self._problem = self.problems[index]
        else:
            self._problem = self._draw(self._rng)
        self._turns = 0
        self._done = False
        self._last_reply = ""
        self.stats = {"tool_calls": 0, "valid_calls": 0, "call_errors": 0, "tool_errors": 0}
        return self._opening(self._problem), {"anchor": self._anchor(), "success": False, "kind": self._problem.kind}

    def _opening(self, problem: Problem) -> Observation:
        question = problem.question  # the form is stated by the system prompt (see SYSTEM_PROMPT)
        if not self.tool_names:
            example: list[dict[str, str]] = [
                {"role": "user", "content": EXAMPLE_QUESTION},
                {"role": "assistant", "content": f"12 * 345 = {EXAMPLE_RESULT}. <answer>{EXAMPLE_RESULT}</answer>"},
            ]
            system = SYSTEM_PROMPT_NO_TOOL
        else:
            tool = self.tool_names[0]
            example = [
                {"role": "user", "content": EXAMPLE_QUESTION},
                {"role": "assistant", "content": _call_text(tool, EXAMPLE_CODE[tool])},
                {"role": self.result_role, "content": EXAMPLE_RESULT},
                {"role": "assistant", "content": f"<answer>{EXAMPLE_RESULT}</answer>"},
            ]
            system = SYSTEM_PROMPT.format(tool=" or ".join(self.tool_names))
            if self.nudge:
                question += NUDGE.format(tool=" or ".join(self.tool_names))
        return [
            {"role": "system", "content": system},
            *(example if self.example else []),
            {"role": "user", "content": question},
        ]

    async def step(self, action: str) -> StepResult:
        problem = self._require_problem()
        if self._done:
            raise RuntimeError("episode is over; call reset() first")
        self._turns += 1
        last = self._turns >= self.max_steps
        if self.tool_names:
            calls, errors = self._calls_of(action)
            if calls or errors:
                return await self._tool_step(problem, calls, errors, last)
        answer, format_ok = extract_answer(action, self.action_tag)
        if answer is None or not answer.strip():
            return self._invalid(problem, "no answer found", format_ok=False, last=last)
        graded = format_ok or not self.require_format
        correct = graded and answer_is_correct(answer, problem.answer, problem.answer_form, problem.unknown)
        metrics = self._metrics()  # before the episode's container goes
        await self._finish()
        info = {
            "anchor": self._anchor(),
            "success": correct,
            "action_valid": True,
            "format_ok": format_ok,
            "answer": answer[:MAX_ANSWER_CHARS],
            "metrics": metrics,
            "exploit_signals": {"echo_answer": echoes_question(answer[:MAX_ANSWER_CHARS], problem.question)},
        }
        reward = self.correct_reward if correct else self.wrong_reward
        reply = "Correct." if correct else "Incorrect."
        return [{"role": "user", "content": reply}], float(reward), True, False, info

    def _calls_of(self, action: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
        """The calls of a reply: those the agent parsed (`ToolCallText`), else read here."""
        parsed = getattr(action, "tool_calls", None)
        if parsed is not None:
            return [(c.name, c.arguments) for c in parsed], list(getattr(action, "tool_call_errors", []))
        return _read_calls(str(action), self.tool_names)

    async def _tool_step(
        self, problem: Problem, calls: list[tuple[str, dict[str, Any]]], errors: list[str], last: bool
    ) -> StepResult:
        self.stats["tool_calls"] += len(calls)
        if not calls:  # only unreadable blocks: a format error the model is told about
            self.stats["call_errors"] += 1
            reason = f"tool call error: {errors[0]}"
            return self._invalid(problem, reason, format_ok=False, last=last)
        name, arguments = calls[0]
        key = ARGUMENT.get(name)
        argument = arguments.get(key) if key else None
        if name not in self.tool_names or not isinstance(argument, str) or not argument.strip():
            self.stats["call_errors"] += 1
            reason = (
                f"unknown tool '{name}'"
                if name not in self.tool_names
                else f"the {name} tool needs a string argument '{key}'"
            )
            return self._invalid(problem, f"tool call error: {reason}", format_ok=True, last=last)
        try:
            if name == "python":
                output = await self.backend.run_python(argument)
            else:
                output = await self.calculator.run_calculator(argument, self.calculator_timeout_s)
        except SandboxError as exc:
            await self._finish()
            info = invalid_step_info(self._anchor(), "the tool's sandbox failed", format_ok=True)
            info["infra_failure"] = f"mathtool sandbox: {exc}"
            return [], 0.0, False, True, info
        self.stats["valid_calls"] += 1
        if not output.ok:
            self.stats["tool_errors"] += 1
        text = output.text if output.text.strip() else "(no output: print the value, e.g. print(12 * 345))"
        if len(calls) > 1:
            text += f"\n(only the first of {len(calls)} tool calls was run)"
        self._last_reply = text
        metrics = self._metrics()
        if last:
            await self._finish()
        info = {
            "anchor": self._anchor(),
            "success": False,
            "action_valid": True,
            "format_ok": True,
            "tool": name,
            "tool_ok": output.ok,
            "tool_timed_out": output.timed_out,
            "metrics": metrics,
        }
        return [{"role": self.result_role, "content": text}], 0.0, False, last, info

    def _invalid(self, problem: Problem, reason: str, *, format_ok: bool, last: bool) -> StepResult:
        if self.tool_names:
            tool = self.tool_names[0]
            # a placeholder, not a computation: a small model copies a concrete call verbatim
            how = f"Call a tool as {_call_text(tool, HINT_CODE[tool])} or give the final answer as <answer>42</answer>."
        else:
            how = "Put the final answer inside <answer></answer>."
        text = f"{reason[0].upper()}{reason[1:]}. {how}"
        if last:
            self._done = True
        info = invalid_step_info(self._anchor(), reason, format_ok=format_ok)
        info["metrics"] = self._metrics()
        return [{"role": "user", "content": text}], float(self.invalid_reward), False, last, info

    async def _finish(self) -> None:
        self._done = True
        await self.backend.release()

    def _metrics(self) -> dict[str, float]:
        return {**{k: float(v) for k, v in self.stats.items()}, **self.backend.episode_metrics()}

    def _anchor(self) -> tuple[str, str]:
        """The state a prompt shows without its history: the problem and the last tool output (an
        invalid action leaves it as it was, as the env contract asks)."""
        return (self._problem.question if self._problem else "", self._last_reply)

    # --- split --------------------------------------------------------------------------

    def _draw(self, rng: np.random.Generator) -> Problem:
        for _ in range(TRAIN_REDRAWS):
            problem = generate_problem(rng, self.kinds)
            if self.split != "train" or not in_test_partition(problem.question):
                return problem
        raise ValueError(f"no train-split problem in {TRAIN_REDRAWS} draws for kinds {list(self.kinds)}")

    # --- helpers ------------------------------------------------------------------------

    def expert_action(self) -> str:
        """Call the tool on the question's own expression first, then copy its output."""
        problem = self._require_problem()
        if not self.tool_names or self._last_reply:
            return wrap_action(problem.answer, self.action_tag)
        tool = self.tool_names[0]
        code = f"print({problem.answer})" if tool == "python" else problem.answer
        return _call_text(tool, code)

    def random_action(self, rng: np.random.Generator) -> str:
        return wrap_action(str(int(rng.integers(0, 10**6))), self.action_tag)

    def render_text(self) -> str:
        return self._problem.question if self._problem else ""

    async def close(self) -> None:
        self._done = True
        await self.backend.release()

    @property
    def problem(self) -> Problem:
        return self._require_problem()

    def _require_problem(self) -> Problem:
        if self._problem is None:
            raise RuntimeError("call reset() before using the env")
        return self._problem
