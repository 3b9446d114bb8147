"""`rollhub/SWE-v0`: fix a real repository in a container, graded by SWE-bench's own rules.

    env = rollhub.envs.make("rollhub/SWE-v0", tasks="rollhub/envs/swe/data/tasks.jsonl")
    obs, info = await env.reset(seed=0)            # or options={"instance_id": ...}
    obs, reward, terminated, truncated, info = await env.step(
        '<tool_call>{"name": "bash", "arguments": {"command": "git status"}}</tool_call>')

Splits: with the shipped (or any local) task file, `split="train"` / `split="eval"` keep the
packages `data/splits.json` assigns to each (disjoint package sets); `packages=[...]` picks
packages directly; the default keeps every task.

reset starts a container from the task's image (repository at /testbed, at base_commit).
Actions are tool calls (`bash`, `str_replace_editor`, `submit`; schemas in `env.tools`).
`submit` ends the episode: the diff (test files excluded) is graded in a fresh container
(`rollhub.envs.swe.grading.evaluate`), reward 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test
passes. The step limit gives truncated=True (reward 0, nothing graded unless
`grade_on_truncation`); the episode time limit does the same.

The agent's commands run as the image's non-root user (`agent`, owner of /testbed; no
capabilities, no-new-privileges): it edits the repository and runs its tests, and cannot
write the interpreter, site-packages or the system. What it writes has a budget (`disk_mb`,
default 1 GiB; on this engine a read-only root and size-limited tmpfs folders, see
rollhub/sandbox/README.md): a write past it fails inside the container and never reaches
the host's disk. Images built before the user existed are refused at reset with the fix.

Who is to blame when something breaks: before the model acts (reset) a broken container
is `info["infra_failure"]` (no score, re-rolled). After it acted, a container that no longer
answers while the engine still starts and runs a fresh one (`engine_works`) was broken from
inside (a fork bomb, its memory or disk filled, its controller killed), and a repository
with no diff to take (`rm -rf .git`) is the model's doing too; both end the episode as
`info["model_failure"]`: terminated, reward 0, trainable. Bad tool arguments (NaN timeouts,
symlinks out of the repository) are tool errors and the episode goes on.

GiGPO's anchor (`info["anchor"]`) is the sha256 of the agent's diff, taken by the clean
git set-up in a fresh private directory and hashed here, on the host: no tool of the
container (a replaced `sha1sum`, a doctored index) decides it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from typing import Any

from rollhub.envs.base import Env, Observation, extract_action, invalid_step_info
from rollhub.envs.swe.agent.tools import TOOLS, ToolCall, ToolError, ToolRunner, parse_tool_call
from rollhub.envs.swe.factory.images import SWE_USER
from rollhub.envs.swe.grading.evaluate import (
    EvalOutcome,
    ModelFault,
    diff_script,
    engine_works,
    evaluate_patch,
    extract_diff,
)
from rollhub.envs.swe.tasks import SHIPPED_TASKS, WORKDIR, LegacyMapping, SweTask, load_tasks, package_of
from rollhub.sandbox.base import Limits, Sandbox, SandboxBackend, SandboxError

logger = logging.getLogger(__name__)

#: where the anchor's diff is written, then read back through the engine's archive API
ANCHOR_DIFF_PATH = "/tmp/rollhub_anchor.diff"
#: what the agent's commands may write in total (MiB); None turns the budget off
DEFAULT_DISK_MB = 1024

SYSTEM_PROMPT = """You are a software engineer fixing a bug in the Python repository at /testbed.
Work with the tools below, one call per reply, written as
<tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>
Tools:
{tools}
Explore the code, reproduce the problem, edit the source (not the tests), check your fix, then call submit.
Hidden tests grade the submitted repository. You have {max_steps} tool calls."""


def _tool_summary() -> str:
    lines = []
    for tool in TOOLS:
        fn = tool["function"]
        args = ", ".join(fn["parameters"].get("properties", {}))
        lines.append(f"- {fn['name']}({args}): {fn['description']}")
    return "\n".join(lines)


class SWEEnv(Env):
    action_tag = "tool_call"
    tools = TOOLS

    def __init__(
        self,
        tasks: str | list[SweTask] | None = None,
        *,
        split: str = "test",
        instance_ids: list[str] | None = None,
        packages: list[str] | None = None,
        legacy: bool = False,
        legacy_image_namespace: str = "swebench",
        legacy_image_separator: str = "_1776_",
        max_steps: int = 30,
        episode_timeout_s: float = 1800.0,
        command_timeout_s: float = 60.0,
        output_limit_chars: int = 10_000,
        eval_timeout_s: float = 900.0,
        cpus: float = 1.0,
        memory_mb: int = 2048,
        disk_mb: int | None = DEFAULT_DISK_MB,
        user: str | None = None,
        invalid_action_penalty: float = 0.0,
        grade_on_truncation: bool = False,
        backend: SandboxBackend | None = None,
    ):
        if max_steps < 1 or episode_timeout_s <= 0 or command_timeout_s <= 0 or eval_timeout_s <= 0:
            raise ValueError("max_steps, episode_timeout_s, command_timeout_s and eval_timeout_s must be positive")
        if disk_mb is not None and disk_mb < 1:
            raise ValueError(f"disk_mb must be a positive number of MiB or None (no budget), got {disk_mb}")
        if isinstance(tasks, list):
            self.tasks = tasks
        else:
            mapping = (
                LegacyMapping(namespace=legacy_image_namespace, separator=legacy_image_separator) if legacy else None
            )
            self.tasks = load_tasks(tasks or SHIPPED_TASKS, split, mapping, instance_ids, packages)
        self.max_steps = max_steps
        self.episode_timeout_s = episode_timeout_s
        self.command_timeout_s = command_timeout_s
        self.output_limit_chars = output_limit_chars
        self.eval_timeout_s = eval_timeout_s
        self.limits = Limits(cpus=cpus, memory_mb=memory_mb, disk_mb=disk_mb)
        #: None: the factory's `agent` for its tasks, the image's own user for registry images
        self.user = user
        self.invalid_action_penalty = invalid_action_penalty
        self.grade_on_truncation = grade_on_truncation
        self._backend = backend
        self._owns_backend = backend is None
        self.task: SweTask | None = None
        self._box: Sandbox | None = None
        self._runner: ToolRunner | None = None
        self._steps = 0
        self._started = 0.0
        self._done = False
        self._anchor: tuple[str, str] = ("", "")
        self._last_text = ""
        self._expert_plan: list[str] = []
        self._expert_index = 0
        self.last_eval: EvalOutcome | None = None

    def task_set(self) -> dict[str, str]:
        """Task ids and their packages (key -> name), for the trainer's train/eval overlap check.

        A package counts as a task of its own: two sets that share a package overlap even
        when their instance ids differ (the held-out set must be unseen code, not unseen bugs).
        """
        keys: dict[str, str] = {}
        for task in self.tasks:
            keys[f"swe-task:{task.instance_id}"] = task.instance_id
            package = package_of(task.row)
            keys[f"swe-package:{package}"] = f"package {package}"
        return keys

    # ------------------------------------------------------------------ lifecycle
    @property
    def backend(self) -> SandboxBackend:
        if self._backend is None:
            from rollhub.sandbox.docker_backend import DockerBackend

            self._backend = DockerBackend()
        return self._backend

    def task_limits(self, task: SweTask) -> Limits:
        """The limits of `task`'s containers (the agent's and the grading one): a task made by
        the factory runs as its image's non-root user, named explicitly so that an image built
        before that user existed is refused rather than run as root."""
        user = self.user or (SWE_USER if task.row.get("rollhub") else "auto")
        if user != SWE_USER:
            return dataclasses.replace(self.limits, user=user)
        # root's home is not the agent's to write: one tmpfs fewer to set up per start
        writable = tuple(d for d in self.limits.writable_dirs if d != "/root")
        return dataclasses.replace(self.limits, user=user, writable_dirs=writable)

    def pick_task(self, seed: int | None, options: dict[str, Any] | None = None) -> SweTask:
        """The task a reset with `seed` / `options` plays: `options["instance_id"]`, else
        `seed % len(tasks)` (public so that agent programs outside the env pick the same one)."""
        wanted = (options or {}).get("instance_id")
        if wanted is not None:
            for task in self.tasks:
                if task.instance_id == wanted:
                    return task
            raise ValueError(f"instance_id {wanted!r} is not in this env's task set")
        return self.tasks[(seed or 0) % len(self.tasks)]

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        await self._close_box()
        self.task = self.pick_task(seed, options)
        self._steps = 0
        self._done = False
        self.last_eval = None
        self._expert_plan = self._make_expert_plan(self.task)
        self._expert_index = 0
        self._started = time.monotonic()
        info: dict[str, Any] = {"instance_id": self.task.instance_id, "success": False}
        limits = self.task_limits(self.task)
        try:
            self._box = await self.backend.start(
                self.task.image,
                limits,
                labels={"rollhub.role": "swe-agent", "rollhub.swe.instance": self.task.instance_id[:60]},
            )
            self._runner = ToolRunner(self._box, self.command_timeout_s, output_limit_chars=self.output_limit_chars)
            self._anchor = (self.task.instance_id, await self._state_hash())
        except SandboxError as exc:
            self._done = True
            hint = ""
            if limits.user == SWE_USER and f"user {SWE_USER!r} is not in the image" in str(exc):
                hint = " (the image predates non-root task images: run `rollhub swe build-images TASK_FILE`)"
            info["infra_failure"] = f"reset: {exc}{hint}"
            self._anchor = (self.task.instance_id, "")
        info["anchor"] = self._anchor
        system = SYSTEM_PROMPT.format(tools=_tool_summary(), max_steps=self.max_steps)
        user = (
            f"<problem_statement>\n{self.task.problem_statement.strip()}\n</problem_statement>\n"
            f"The repository is checked out at {WORKDIR}."
        )
        self._last_text = user
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], info

    async def _state_hash(self) -> str:
        """History-free key of the repository state (GiGPO's anchor): the agent's diff against
        the base commit, taken with the clean git set-up, read back whole and hashed on the
        host. The private git directory is new each time (a kept one would be the agent's to
        edit between steps); the repositories are small, so hashing every file costs little.
        "" when the agent broke what the diff needs (its failure shows at submit)."""
        assert self._box is not None and self.task is not None
        script = diff_script(self.task.base_commit, ANCHOR_DIFF_PATH)
        result = await self._box.exec(f"( {script} ) >/dev/null 2>&1", timeout_s=60, workdir="/")
        if result.exit_code != 0:
            return ""
        try:
            diff = await self._box.read_file(ANCHOR_DIFF_PATH)
        except OSError:  # gone, a directory, too large: what the agent left there
            return ""
        return hashlib.sha256(diff).hexdigest()[:16]

    async def _close_box(self) -> None:
        box, self._box, self._runner = self._box, None, None
        if box is not None:
            try:
                await box.close()
            except SandboxError:
                logger.warning("could not remove a SWE container", exc_info=True)

    async def close(self) -> None:
        await self._close_box()
        if self._owns_backend and self._backend is not None:
            backend, self._backend = self._backend, None
            await backend.close()

    # ------------------------------------------------------------------ stepping
    def _reply(self, text: str) -> Observation:
        self._last_text = text
        return [{"role": "user", "content": text}]

    async def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode has ended; call reset()")
        self._steps += 1
        if self._expert_index < len(self._expert_plan) and action == self._expert_plan[self._expert_index]:
            self._expert_index += 1
        payload = extract_action(action, self.action_tag)
        if payload is None:
            info = invalid_step_info(self._anchor, "no <tool_call>...</tool_call> found", format_ok=False)
            return await self._after_invalid(
                info,
                'Reply with one tool call: <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
            )
        try:
            call = parse_tool_call(payload)
            if call.name == "submit":
                return await self._finish(submitted=True)
            assert self._runner is not None
            text = await self._runner.run(call)
        except ToolError as exc:
            return await self._after_invalid(invalid_step_info(self._anchor, str(exc), format_ok=True), f"Error: {exc}")
        except SandboxError as exc:
            return await self._broken_end(f"step: {exc}")
        try:
            self._anchor = (self.task.instance_id, await self._state_hash())
        except SandboxError as exc:
            return await self._broken_end(f"step: {exc}")
        info = {"anchor": self._anchor, "success": False, "action_valid": True, "format_ok": True, "tool": call.name}
        return await self._maybe_truncate(self._reply(text), 0.0, info)

    async def _after_invalid(
        self, info: dict[str, Any], text: str
    ) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        return await self._maybe_truncate(self._reply(text), self.invalid_action_penalty, info)

    async def _maybe_truncate(
        self, obs: Observation, reward: float, info: dict[str, Any]
    ) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        out_of_steps = self._steps >= self.max_steps
        out_of_time = time.monotonic() - self._started >= self.episode_timeout_s
        if not (out_of_steps or out_of_time):
            return obs, reward, False, False, info
        info["truncated_by"] = "step_limit" if out_of_steps else "episode_time_limit"
        if self.grade_on_truncation:
            _, graded_reward, _, _, graded_info = await self._finish(submitted=False)
            info = {**graded_info, **{k: v for k, v in info.items() if k not in graded_info}}
            reward += graded_reward
        else:
            self._done = True
            await self._close_box()
        return obs, reward, False, True, info

    async def _broken_end(self, reason: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """The agent's container failed after the model acted: the model's failure if the
        container is dead while the engine still works, else infra."""
        assert self.task is not None
        alive = False
        if self._box is not None:
            try:
                alive = (await self._box.exec("true", timeout_s=20)).exit_code == 0
            except SandboxError:
                alive = False
        if not alive and await engine_works(self.backend, self.task.image):
            return await self._model_end(f"the container stopped answering after the model's command ({reason})")
        return self._infra_end(reason)

    async def _model_end(self, reason: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """The model broke its own environment: terminated, reward 0, a trainable failure."""
        logger.info("SWE episode %s: model failure: %s", self.task.instance_id if self.task else "?", reason)
        self._done = True
        await self._close_box()
        info = {
            "anchor": self._anchor,
            "success": False,
            "action_valid": True,
            "format_ok": True,
            "model_failure": reason,
        }
        return self._reply(f"The episode ends: {reason}. Nothing can be graded; reward 0."), 0.0, True, False, info

    def _infra_end(self, reason: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        logger.warning("SWE episode %s: infra failure: %s", self.task.instance_id if self.task else "?", reason)
        self._done = True
        info = {
            "anchor": self._anchor,
            "success": False,
            "action_valid": True,
            "format_ok": True,
            "infra_failure": reason,
        }
        return (
            self._reply(f"The environment failed ({reason}); the episode ends without a score."),
            0.0,
            True,
            False,
            info,
        )

    async def _finish(self, *, submitted: bool) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        assert self.task is not None and self._box is not None
        try:
            patch = await extract_diff(self._box, self.task)
        except ModelFault as exc:
            return await self._model_end(str(exc))
        except SandboxError as exc:
            return await self._broken_end(f"diff: {exc}")
        self._done = True
        await self._close_box()
        outcome = await evaluate_patch(
            self.backend, self.task, patch, limits=self.task_limits(self.task), timeout_s=self.eval_timeout_s
        )
        self.last_eval = outcome
        if outcome.infra_failure:
            return self._infra_end(f"eval: {outcome.infra_failure}")
        info = {
            "anchor": self._anchor,
            "success": outcome.grade.resolved,
            "action_valid": True,
            "format_ok": True,
            "submitted": submitted,
            **outcome.info(),
        }
        info["metrics"] = {
            "pass_fraction": outcome.grade.pass_fraction,
            "eval_duration_s": outcome.duration_s,
            "patch_chars": float(len(patch)),
            "hack_suspected": float(bool(outcome.grade.hack_suspected)),
            # 1.0: the differential oracle grades this task too; 0.0: its visible tests alone
            "trust_oracle": float(outcome.trust == "oracle"),
            # 1.0: the row says oracle, but the re-check on the inputs used found no hidden input exposing the bug
            "trust_downgraded": float(bool(outcome.trust_why)),
            "oracle_disagreement": float(outcome.oracle is not None and not outcome.oracle.agreed),
        }
        info["exploit_signals"] = {  # rollhub.envs.base: the grader's own suspicions, as rates in training
            "hack_suspected": bool(outcome.grade.hack_suspected),
            "patch_rejected": bool(outcome.sanitized is not None and outcome.sanitized.rejected),
        }
        if outcome.model_failure:
            verdict = f"not resolved: {outcome.model_failure}"
        elif outcome.sanitized is not None and outcome.sanitized.rejected:
            verdict = "not resolved: the diff was rejected"
        elif outcome.grade.resolved:
            verdict = "resolved: every test passes"
        elif outcome.oracle is not None and not outcome.oracle.agreed:
            verdict = "not resolved: the tests pass, but the function still answers other inputs wrongly"
        elif outcome.patch_applied:
            verdict = f"not resolved ({outcome.grade.pass_fraction:.0%} of the graded tests pass)"
        else:
            verdict = "not resolved: the patch did not apply"
        return self._reply(f"Submitted. {verdict}."), outcome.reward, True, False, info

    # ------------------------------------------------------------------ agents
    @staticmethod
    def _make_expert_plan(task: SweTask) -> list[str]:
        """Apply the gold patch with one bash call (heredoc into `git apply`), then submit."""
        marker = "ROLLHUB_GOLD_PATCH"
        patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"
        command = f"git apply --verbose <<'{marker}'\n{patch}{marker}"
        return [ToolCall("bash", {"command": command}).to_text(), ToolCall("submit", {}).to_text()]

    def expert_action(self) -> str:
        if self.task is None:
            raise RuntimeError("call reset() first")
        return self._expert_plan[min(self._expert_index, len(self._expert_plan) - 1)]

    def random_action(self, rng: Any) -> str:
        choices = [
            ToolCall("bash", {"command": "git status --short && ls"}),
            ToolCall("bash", {"command": "grep -rn 'def ' --include=*.py . | head -20"}),
            ToolCall("str_replace_editor", {"command": "view", "path": WORKDIR}),
            ToolCall("submit", {}),
        ]
        return choices[int(rng.integers(len(choices)))].to_text()

    def render_text(self) -> str:
        if self.task is None:
            return "(no episode)"
        return f"[{self.task.instance_id}] step {self._steps}/{self.max_steps}\n{self._last_text}"
