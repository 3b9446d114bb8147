"""Train on your own task as plain Python: a JSONL of prompts and a reward function in one .py file.

No package, no entry point, no Env subclass. In a recipe:

    env:
      id: "python:my_task.py:reward"          # PATH.py:FUNCTION
      kwargs: {dataset: prompts.jsonl}        # one JSON object per line, each with a "prompt"
    eval:
      env: {kwargs: {dataset: held_out.jsonl}}

The function decides the kind of task by its first parameter:

* single-turn, `def reward(completion, row) -> float`: the model answers the row's prompt once;
  `completion` is its reply (text), `row` the JSONL record (any extra fields, e.g. "answer").
* multi-turn, `def step(history, row) -> (feedback, reward, done)`: called after every reply
  with the conversation so far (chat messages, the model's reply last); `feedback` is the next
  user message, `done` ends the episode. `max_steps` (kwarg, default 8) truncates it.

A reward of None means the reply could not be read (no answer in it): an invalid action, the
episode's state unchanged, `invalid_reward` (kwarg, default 0) scored, "feedback" (or a default
note) shown. `row` may be left out of either signature. A row may give "messages" (chat messages) instead of
"prompt", and "system" is an optional system message (or the `system_prompt` kwarg for every row).
A seed plays row `seed % len(dataset)`. The dataset may also come from the file itself: a
module-level `DATASET` (a list of rows, or a path). Relative paths are looked up from the current
folder, then from the .py file's folder. Success is a reward > 0 (`success_threshold` kwarg). A
row's optional "solution" is the scripted expert's reply, so `sft.enabled` can warm-start on it.

`task_set` lists the rows by a hash of their prompt, so a run refuses to evaluate on rows it
trains on: give evaluation its own file. `rollhub.envs.from_function(reward=..., dataset=...)`
registers the same env from functions in your own script (that process only).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from rollhub.core.errors import UserError
from rollhub.envs.base import Env, Observation, StepResult, invalid_step_info

ID_FORM = "python:PATH/TO/task.py:FUNCTION"
_modules: dict[Path, Any] = {}


def _find(path: str | Path, near: Path | None, what: str) -> Path:
    """`path` as given (absolute or from the current folder), else next to `near`; a one-line error if neither."""
    given = Path(path).expanduser()
    for candidate in (given, *((near / given,) if near is not None and not given.is_absolute() else ())):
        if candidate.is_file():
            return candidate.resolve()
    where = f" (nor next to {near})" if near is not None and not given.is_absolute() else ""
    raise UserError(f"{what}: no file {str(path)!r}{where}")


def load_function(target: str) -> tuple[Callable[..., Any], Path]:
    """The function named by `PATH.py:FUNCTION` (the part after `python:`), and its file."""
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text.endswith(".py") or not name.isidentifier():
        raise UserError(f"python env id must look like {ID_FORM}, got 'python:{target}'")
    path = _find(path_text, None, "python env")
    module = _modules.get(path)
    if module is None:
        module_name = "rollhub_python_task_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)  # type: ignore[arg-type]
        sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
        try:
            loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:
            sys.modules.pop(module_name, None)
            first_line = (str(exc).strip().splitlines() or [""])[0]  # the error stays one line
            raise UserError(f"python env: importing {path} failed: {type(exc).__name__}: {first_line}") from None
        _modules[path] = module
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise UserError(
            f"python env: {path.name} has no function {name!r} (its functions: {', '.join(found) or 'none'})"
        )
    return function, path


def task_kind(function: Callable[..., Any], label: str) -> tuple[str, bool]:
    """('reward' | 'step', whether it takes the row), from the signature; a one-line error otherwise."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        raise UserError(f"{label}: cannot read its signature; define it with def") from None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required_other = [
        p for p in parameters if p not in positional and p.default is p.empty and p.kind == p.KEYWORD_ONLY
    ]
    names = [p.name for p in positional]
    if not 1 <= len(positional) <= 2 or required_other or any(p.default is not p.empty for p in positional[:1]):
        raise UserError(
            f"{label} takes ({', '.join(p.name for p in parameters)}); a reward function takes (completion, row) "
            "and a multi-turn step function (history, row), row optional"
        )
    return ("step" if names[0] == "history" else "reward"), len(positional) == 2


def load_dataset(source: str | Path | list[dict[str, Any]], near: Path | None, label: str) -> list[dict[str, Any]]:
    """Rows of a JSONL file (or a list of rows), each checked to have a prompt."""
    if isinstance(source, list):
        rows, where = source, "DATASET"
    else:
        path = _find(source, near, f"{label} dataset")
        rows, where = [], path.name
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{label} dataset {where} line {number} is not JSON: {exc.msg}") from None
    if not rows:
        raise UserError(f"{label} dataset {where} has no rows")
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not (
            isinstance(row.get("prompt"), str) or isinstance(row.get("messages"), list)
        ):
            raise UserError(f"{label} dataset {where} row {number} needs a 'prompt' string or a 'messages' list")
    return rows


def _prompt_key(row: dict[str, Any]) -> str:
    text = row["prompt"] if "prompt" in row else json.dumps(row["messages"], sort_keys=True)
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:16]


class FunctionEnv(Env):
    """A task given as a dataset and a reward (single-turn) or step (multi-turn) function."""

    action_tag = ""  # the function reads the whole reply
    CHECK_BY_BUILDING: ClassVar[bool] = True  # building loads the file, so mistakes show before any model

    def __init__(
        self,
        function: Callable[..., Any],
        dataset: str | Path | list[dict[str, Any]] | None = None,
        *,
        label: str = "python env",
        near: Path | None = None,
        system_prompt: str | None = None,
        max_steps: int | None = None,
        success_threshold: float = 0.0,
        invalid_reward: float = 0.0,
    ):
        self.kind, self._takes_row = task_kind(function, label)
        self.function, self.label = function, label
        if dataset is None:
            module_dataset = getattr(inspect.getmodule(function), "DATASET", None)
            if module_dataset is None:
                raise UserError(
                    f"{label}: no dataset: set env.kwargs.dataset to a .jsonl file (or DATASET in the file)"
                )
            dataset = module_dataset
        self.rows = load_dataset(dataset, near, label)
        self.system_prompt = system_prompt
        self.max_steps = int(max_steps if max_steps is not None else (1 if self.kind == "reward" else 8))
        if self.max_steps < 1:
            raise UserError(f"{label}: max_steps must be >= 1, got {self.max_steps}")
        self.success_threshold = float(success_threshold)
        self.invalid_reward = float(invalid_reward)
        self.row: dict[str, Any] = {}
        self.history: list[dict[str, str]] = []
        self.turn = self.valid_turns = 0

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        self.row = self.rows[(seed or 0) % len(self.rows)]
        system = self.row.get("system", self.system_prompt)
        opening = (
            list(self.row["messages"]) if "messages" in self.row else [{"role": "user", "content": self.row["prompt"]}]
        )
        if system and not any(m.get("role") == "system" for m in opening):
            opening.insert(0, {"role": "system", "content": str(system)})
        self.history = [dict(m) for m in opening]
        self.turn = self.valid_turns = 0
        return [dict(m) for m in opening], {"anchor": (_prompt_key(self.row), 0), "success": False}

    async def step(self, action: str) -> StepResult:
        self.turn += 1
        self.history.append({"role": "assistant", "content": action})
        if self.kind == "reward":
            reward, feedback, done = self._call(action), "", True
        else:
            result = self._call([dict(m) for m in self.history])
            if not (isinstance(result, tuple) and len(result) == 3):
                raise TypeError(f"{self.label} must return (feedback, reward, done), got {result!r}")
            feedback, reward, done = str(result[0]), result[1], bool(result[2])
            reward = None if reward is None else self._number(reward)
        truncated = self.turn >= self.max_steps
        if reward is None:  # the function could not read the reply: an invalid action, state unchanged
            reply = feedback or "Your reply could not be read; answer the question."
            info = invalid_step_info((_prompt_key(self.row), self.valid_turns), reply, format_ok=False)
            self.history.append({"role": "user", "content": reply})
            return [{"role": "user", "content": reply}], self.invalid_reward, False, truncated, info
        self.valid_turns += 1
        reply = feedback or f"Reward: {reward:g}."
        self.history.append({"role": "user", "content": reply})
        info = {
            "anchor": (_prompt_key(self.row), self.valid_turns),
            "success": bool(done and reward > self.success_threshold),
            "action_valid": True,
            "format_ok": True,
        }
        return [{"role": "user", "content": reply}], reward, done, truncated and not done, info

    def _call(self, first: Any) -> Any:
        result = self.function(first, self.row) if self._takes_row else self.function(first)
        return self._number(result) if self.kind == "reward" and result is not None else result

    def _number(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise TypeError(f"{self.label} must give a finite number as the reward, got {value!r}")
        return float(value)

    def expert_action(self) -> str:
        """The row's "solution", when it gives one (SFT warm-starts on it)."""
        if "solution" not in self.row:
            raise NotImplementedError(f"{self.label}: this row has no 'solution' field to imitate")
        return str(self.row["solution"])

    def task_set(self) -> dict[str, str] | None:
        return {_prompt_key(row): str(row.get("prompt", row.get("messages")))[:60] for row in self.rows}

    def task_key(self) -> str | None:
        return _prompt_key(self.row) if self.row else None


class PythonFileEnv(FunctionEnv):
    """The env of an id `python:PATH.py:FUNCTION` (rollhub.envs.registry.SOURCES). A class, not a
    factory, so the run's checks build it before any model loads and read its `task_set`."""

    def __init__(self, target: str, dataset: str | list[dict[str, Any]] | None = None, **kwargs: Any):
        function, path = load_function(target)
        super().__init__(function, dataset, label=f"python:{target}", near=path.parent, **kwargs)
        # a task file says why a generic exploit's score is no hack (e.g. a guessing game's first guess)
        # in a module-level HACKABILITY_NOTE, as an env class does in its hackability_note
        note = getattr(_modules.get(path), "HACKABILITY_NOTE", "")
        if note:
            self.hackability_note = str(note)  # type: ignore[misc]


def from_function(
    *,
    dataset: str | Path | list[dict[str, Any]],
    reward: Callable[..., Any] | None = None,
    step: Callable[..., Any] | None = None,
    name: str = "Task",
    **kwargs: Any,
) -> str:
    """Register a task made of your own functions and return its env id (`python/NAME-v0`), for this
    process: `run_training` and `EnvManager` then build it like any env. Give `reward` (single-turn)
    or `step` (multi-turn, first parameter `history`), and the dataset as a JSONL path or rows."""
    from rollhub.envs.registry import register

    if (reward is None) == (step is None):
        raise UserError("from_function needs exactly one of reward= (single-turn) or step= (multi-turn)")
    function = reward if reward is not None else step
    label = f"from_function {getattr(function, '__name__', 'function')}"
    kind, _ = task_kind(function, label)  # type: ignore[arg-type]
    if (kind == "step") != (step is not None):
        raise UserError(f"{label}: a step function's first parameter is named history, a reward function's is not")
    rows = load_dataset(dataset, None, label)  # checked now, not at the first episode
    env_id = f"python/{name}-v0"

    def __init__(self: FunctionEnv, **env_kwargs: Any) -> None:
        FunctionEnv.__init__(self, function, rows, label=label, **{**kwargs, **env_kwargs})  # type: ignore[arg-type]

    env_class = type(f"{name}Env", (FunctionEnv,), {"__init__": __init__, "__module__": __name__})
    register(env_id, env_class, description=f"{label} on {len(rows)} rows", gymnasium_compat=False)
    return env_id
