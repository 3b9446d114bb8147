"""mini-swe-agent on rollhub's SWE tasks: its commands run in the task's sandbox, its diff is graded
by the SWE env's own grading.

mini-swe-agent (the `mini-swe-agent` package, used unmodified) drives an agent loop
(`DefaultAgent`) over two duck-typed parts: a model and an *environment* whose `execute(action)`
runs one shell command and returns `{"output", "returncode", "exception_info"}`.
`SandboxEnvironment` is that environment on a rollhub `Sandbox` (a container of the task's image
leased from a `SandboxPool`, with the limits `SWEEnv` gives its own agent: network off, CPU,
memory, pids, disk budget, the image's non-root user). mini-swe-agent's loop is synchronous and
the sandbox is async, so the loop runs in a worker thread and each command is sent to the event
loop that owns the sandbox.

`run_episode` plays one task: lease the container, run the agent, and, when the agent submitted
(mini-swe-agent's `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` protocol), take the diff from the
container with the SWE env's clean git set-up (`extract_diff`) and grade it in a fresh container
(`evaluate_patch`): the same verdict `SWEEnv.step("submit")` gives. The text the agent prints
after the marker is never graded: the repository is. An agent that did not submit scores 0
(as `SWEEnv` truncation does; `grade_on_truncation` grades the diff instead).

Who is to blame mirrors `SWEEnv`: a container that cannot be started, or a grading that fails
for the machinery, is an infra failure (no score); a container that stops answering after the
agent's command while the engine still runs a fresh one, or a repository with no diff, is the
model's failure (reward 0, trainable). examples/mini_swe_agent/ is the agent program that runs
this against a gateway session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import platform
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollhub.envs.swe.env import SWEEnv
from rollhub.envs.swe.grading.evaluate import ModelFault, engine_works, evaluate_patch, extract_diff
from rollhub.envs.swe.tasks import WORKDIR, SweTask
from rollhub.sandbox.base import Sandbox, SandboxError, truncate_middle
from rollhub.sandbox.pool import SandboxPool

logger = logging.getLogger(__name__)

#: mini-swe-agent's submission protocol: a command whose output starts with this line (exit 0) ends the run
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: mini-swe-agent's exit status of a run that submitted
SUBMITTED = "Submitted"
#: the SWE env's bound on one command's text (rollhub.envs.swe.agent.tools): longer ones are refused
MAX_COMMAND_BYTES = 100_000

OUTCOME_GRADED = "graded"
OUTCOME_NOT_SUBMITTED = "not_submitted"
OUTCOME_MODEL_FAILURE = "model_failure"
OUTCOME_INFRA_FAILURE = "infra_failure"


@dataclass
class SandboxEnvironmentConfig:
    """What `SandboxEnvironment` runs commands with; mini-swe-agent renders these into its prompts."""

    cwd: str = WORKDIR
    timeout_s: float = 60.0  # per command, unless the agent passes its own
    max_timeout_s: float = 300.0  # the SWE env's cap on a requested timeout
    output_limit_chars: int = 10_000  # head + tail kept, as the SWE env's bash tool does
    env: dict[str, str] = field(default_factory=dict)  # variables set for every command

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s}")
        if not (math.isfinite(self.max_timeout_s) and self.max_timeout_s >= self.timeout_s):
            raise ValueError(f"max_timeout_s must be >= timeout_s ({self.timeout_s}), got {self.max_timeout_s}")
        if self.output_limit_chars < 100:
            raise ValueError(f"output_limit_chars must be at least 100, got {self.output_limit_chars}")
        if not self.cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path in the container, got {self.cwd!r}")

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """mini-swe-agent reads configs pydantic-style (template variables, saved trajectories)."""
        return dataclasses.asdict(self)


class SandboxEnvironment:
    """mini-swe-agent's environment protocol on a rollhub sandbox (module docstring).

    `execute` is called from the agent's thread; `loop` is the event loop that owns `box`. A
    failure of the sandbox itself (`SandboxError`) is raised, never turned into an observation:
    the caller decides whether the model or the machinery broke it.
    """

    def __init__(
        self, box: Sandbox, loop: asyncio.AbstractEventLoop, config: SandboxEnvironmentConfig | None = None
    ) -> None:
        self.box = box
        self.loop = loop
        self.config = config or SandboxEnvironmentConfig()
        self.commands_run = 0

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        if _in_loop_thread(self.loop):  # waiting on the loop from inside it would deadlock
            coroutine.close()
            raise RuntimeError("SandboxEnvironment.execute must be called from a thread other than the sandbox's loop")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        """Run `action["command"]` in a fresh `bash -c` in the container; raises mini-swe-agent's
        `Submitted` when the output starts with the submission marker."""
        command = action.get("command", "")
        refused = _refusal(command)
        if refused:
            return {"output": "", "returncode": -1, "exception_info": refused}
        timeout_s = min(float(timeout), self.config.max_timeout_s) if timeout else self.config.timeout_s
        result = self._call(
            self.box.exec(command, timeout_s=timeout_s, workdir=cwd or self.config.cwd, env=self.config.env or None)
        )
        self.commands_run += 1
        output, _ = truncate_middle(result.output, self.config.output_limit_chars)
        if result.timed_out:
            observation = {
                "output": output,
                "returncode": -1,
                "exception_info": f"the command timed out after {timeout_s:g} s and was killed",
            }
        else:
            observation = {"output": output, "returncode": result.exit_code, "exception_info": ""}
        _raise_if_submitted(observation)
        return observation

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """Variables mini-swe-agent's prompts use: the config, and the kernel's uname (the
        container shares the host's kernel; `system` is what its prompts branch on)."""
        return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }


def _in_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _refusal(command: Any) -> str:
    """Why the SWE env's bash tool would refuse this command ("" when it would run it)."""
    if not isinstance(command, str) or not command.strip():
        return "the action has no command to run"
    if "\0" in command:
        return "the command contains a NUL character"
    try:
        size = len(command.encode("utf-8"))
    except UnicodeEncodeError:
        return "the command contains an unpaired surrogate"
    if size > MAX_COMMAND_BYTES:
        return f"the command is longer than {MAX_COMMAND_BYTES} bytes; write long texts to a file in several steps"
    return ""


def _raise_if_submitted(observation: dict[str, Any]) -> None:
    """mini-swe-agent's submission rule, as its own environments apply it: the output's first
    line is the marker and the command succeeded."""
    if observation["returncode"] != 0:
        return
    first, _, rest = observation["output"].lstrip().partition("\n")
    if first.strip() != SUBMIT_MARKER:
        return
    from minisweagent.exceptions import Submitted

    raise Submitted({"role": "exit", "content": rest, "extra": {"exit_status": SUBMITTED, "submission": rest}})


class MiniAgent(Protocol):
    """What `run_episode` needs of mini-swe-agent's `DefaultAgent`."""

    def run(self, task: str = "", **kwargs: Any) -> dict[str, Any]: ...


@dataclass
class EpisodeResult:
    """One task played by mini-swe-agent: the reward and why."""

    instance_id: str
    outcome: str  # OUTCOME_*
    reward: float = 0.0
    success: bool = False
    exit_status: str = ""  # mini-swe-agent's (Submitted, LimitsExceeded, RepeatedFormatError, ...)
    reason: str = ""  # the failure, for model and infra failures
    commands_run: int = 0
    duration_s: float = 0.0
    patch_chars: int = 0
    info: dict[str, Any] = field(default_factory=dict)  # the grading's info (tests, resolution, ...)

    @property
    def infra_failed(self) -> bool:
        return self.outcome == OUTCOME_INFRA_FAILURE

    def summary(self) -> dict[str, Any]:
        keep = ("resolution", "pass_fraction", "patch_applied", "patch_rejected", "trust", "hack_suspected")
        return {
            **{k: v for k, v in dataclasses.asdict(self).items() if k != "info"},
            **{k: self.info[k] for k in keep if k in self.info},
        }


async def run_episode(
    swe: SWEEnv,
    task: SweTask,
    make_agent: Callable[[SandboxEnvironment], MiniAgent],
    *,
    pool: SandboxPool,
    environment_env: dict[str, str] | None = None,
    model_ended: Callable[[Exception], str] = lambda exc: "",
) -> EpisodeResult:
    """Play `task` with the agent `make_agent` builds on the task's sandbox, graded as `SWEEnv` grades.

    `swe` supplies the limits, timeouts and grading options (its `task_limits`, `command_timeout_s`,
    `output_limit_chars`, `eval_timeout_s`, `grade_on_truncation`). `model_ended(exc)`
    names the exit status of a model-client exception that ends the episode as the model's
    doing (a context overflow), like a step limit; "" for any other, which propagates (the
    machinery's failure: the caller reports no score).
    """
    started = time.monotonic()
    result = EpisodeResult(task.instance_id, OUTCOME_INFRA_FAILURE)
    limits = swe.task_limits(task)
    try:
        box = await pool.acquire(task.image, limits)
    except SandboxError as exc:
        result.reason = f"the task's container did not start: {exc}"
        return _finished(result, started)
    environment = SandboxEnvironment(
        box,
        asyncio.get_running_loop(),
        SandboxEnvironmentConfig(
            timeout_s=swe.command_timeout_s, output_limit_chars=swe.output_limit_chars, env=dict(environment_env or {})
        ),
    )
    try:
        agent = make_agent(environment)
        try:
            exit_info = await asyncio.to_thread(agent.run, task.problem_statement.strip())
            result.exit_status = str(exit_info.get("exit_status", ""))
        except SandboxError as exc:
            return _finished(await _broken(result, pool, box, task, f"command: {exc}"), started, environment)
        except Exception as exc:
            status = model_ended(exc)
            if not status:
                raise
            result.exit_status = status
            logger.info("%s: the model's context or budget ended the episode: %s", task.instance_id, exc)
        submitted = result.exit_status == SUBMITTED
        if not submitted and not swe.grade_on_truncation:
            result.outcome = OUTCOME_NOT_SUBMITTED
            return _finished(result, started, environment)
        try:
            patch = await extract_diff(box, task)
        except ModelFault as exc:
            result.outcome, result.reason = OUTCOME_MODEL_FAILURE, str(exc)
            return _finished(result, started, environment)
        except SandboxError as exc:
            return _finished(await _broken(result, pool, box, task, f"diff: {exc}"), started, environment)
    finally:
        await box.close()
    outcome = await evaluate_patch(pool.backend, task, patch, limits=limits, timeout_s=swe.eval_timeout_s)
    result.patch_chars = len(patch)
    result.info = outcome.info()
    if outcome.infra_failure:
        result.reason = f"grading: {outcome.infra_failure}"
        return _finished(result, started, environment)
    result.outcome = OUTCOME_GRADED
    result.reward = outcome.reward
    result.success = bool(outcome.grade.resolved) and not outcome.model_failure
    result.reason = outcome.model_failure
    return _finished(result, started, environment)


async def _broken(result: EpisodeResult, pool: SandboxPool, box: Sandbox, task: SweTask, reason: str) -> EpisodeResult:
    """The agent's container failed after the model acted: the model's failure when the container
    is dead while the engine still runs a fresh one (killed from inside), else the machinery's."""
    try:
        alive = (await box.exec("true", timeout_s=20)).exit_code == 0
    except SandboxError:
        alive = False
    if not alive and await engine_works(pool.backend, task.image):
        result.outcome = OUTCOME_MODEL_FAILURE
        result.reason = f"the container stopped answering after the model's command ({reason})"
    else:
        result.outcome = OUTCOME_INFRA_FAILURE
        result.reason = reason
    return result


def _finished(result: EpisodeResult, started: float, environment: SandboxEnvironment | None = None) -> EpisodeResult:
    result.duration_s = round(time.monotonic() - started, 3)
    if environment is not None:
        result.commands_run = environment.commands_run
    return result
