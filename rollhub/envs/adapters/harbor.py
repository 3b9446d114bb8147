"""Harbor task directories as rollhub envs: `make("harbor:/path/to/task")`.

A Harbor task is a folder: `instruction.md` (the task), `task.toml` (`[verifier] timeout_sec`,
`[agent] timeout_sec`), `environment/Dockerfile` (the workspace), `tests/test.sh` (writes the
reward to /logs/verifier/reward.txt) and `solution/solve.sh` (a reference solution). rollhub
reads the folder itself (the `harbor` package needs Python >= 3.12) and runs it on its sandbox:

* The Dockerfile is built with the network off and without pulling: its `FROM` must be an image
  this machine has (the sandbox's base image, `rollhub sandbox build-base`). The image is tagged
  by a hash of the environment folder, so an unchanged task reuses it.
* The agent works in the image's working directory with SWE-v0's `bash` and `submit` tools
  (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`).
* Grading, in a fresh container of the same image: only the agent's changes to regular files
  under the working directory are carried over (new and changed files copied, deleted ones
  removed; symbolic links are not carried), `tests/` is copied in from the task folder
  afterwards and /logs/verifier starts empty, so nothing the agent wrote elsewhere, nor a
  reward file it forged, reaches the verifier. The reward is the number in reward.txt; a
  missing or unreadable file, a failing or timed-out test.sh, or too large a change (over
  `max_changed_files` or `max_file_bytes`) scores 0.
* A container that cannot start or dies is machinery (`SandboxError`, never scored).
* Anchor: a digest of the working directory's file hashes after each command (the state the
  agent acts on); `expert_action` runs solution/solve.sh, then submits.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.adapters.common import digest, user_message
from rollhub.envs.base import Env, Observation, StepResult, extract_action, invalid_step_info
from rollhub.sandbox.base import Limits, Sandbox, SandboxBackend, SandboxError

REWARD_FILE = "/logs/verifier/reward.txt"
TESTS_DIR = "/tests"


def _swe_tools() -> list[dict[str, Any]]:
    from rollhub.envs.swe.agent.tools import TOOLS

    return [t for t in TOOLS if t["function"]["name"] in ("bash", "submit")]


class HarborTask:
    """A Harbor task folder, read and checked."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().resolve()
        missing = [
            name
            for name in ("instruction.md", "environment/Dockerfile", "tests/test.sh")
            if not (self.path / name).is_file()
        ]
        if missing:
            raise UserError(f"{self.path} is not a Harbor task folder: missing {', '.join(missing)}")
        self.instruction = (self.path / "instruction.md").read_text()
        config_path = self.path / "task.toml"
        self.config = tomllib.loads(config_path.read_text()) if config_path.is_file() else {}
        self.verifier_timeout_s = float(self.config.get("verifier", {}).get("timeout_sec", 600))
        self.agent_timeout_s = float(self.config.get("agent", {}).get("timeout_sec", 600))
        solution = self.path / "solution" / "solve.sh"
        self.solution = solution.read_text() if solution.is_file() else None

    def environment_hash(self) -> str:
        sha = hashlib.sha256()
        for file in sorted((self.path / "environment").rglob("*")):
            if file.is_file():
                sha.update(str(file.relative_to(self.path)).encode() + b"\0" + file.read_bytes() + b"\0")
        return sha.hexdigest()[:16]

    def build_image(self, client: Any) -> str:
        """The task's image, built offline (no network, no pull) or reused by content tag."""
        import docker.errors

        tag = f"rollhub-harbor/{_slug(self.path.name)}:{self.environment_hash()}"
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.build(
                path=str(self.path / "environment"), tag=tag, network_mode="none", pull=False, rm=True, forcerm=True
            )
        except docker.errors.BuildError as exc:
            log = "".join(str(e.get("stream", e.get("error", ""))) for e in exc.build_log)[-2000:]
            raise UserError(
                f"building {self.path}/environment/Dockerfile offline failed (its FROM must be an image this "
                f"machine has, e.g. the sandbox base: rollhub sandbox build-base): {exc.msg}\n{log}"
            ) from None
        return tag


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name.lower()).strip("-.") or "task"


class HarborEnv(Env):
    """One Harbor task folder on the sandbox (module docstring: what reaches grading)."""

    action_tag = "tool_call"
    max_steps = 30

    def __init__(
        self,
        task: str | Path,
        *,
        max_steps: int = 30,
        command_timeout_s: float = 60.0,
        max_changed_files: int = 200,
        max_file_bytes: int = 1 << 20,
        limits: Limits | None = None,
        backend: SandboxBackend | None = None,
    ):
        self.task = HarborTask(task)
        self.tools = _swe_tools()
        self.max_steps = max_steps
        self.command_timeout_s = command_timeout_s
        self.max_changed_files = max_changed_files
        self.max_file_bytes = max_file_bytes
        # commands run as the image's sandbox user (label) or its default user: the workdir's owner
        self.limits = limits or Limits()
        self._backend = backend
        self._own_backend = backend is None
        self._image: str | None = None
        self._workdir = "/"
        self._box: Sandbox | None = None
        self._baseline: dict[str, str] = {}
        self._anchor: str | None = None
        self._steps = 0
        self._expert_done = False

    def _backend_or_new(self) -> SandboxBackend:
        if self._backend is None:
            from rollhub.sandbox.docker_backend import DockerBackend

            self._backend = DockerBackend()
        return self._backend

    async def _prepare_image(self) -> str:
        if self._image is None:
            import asyncio

            import docker

            def build() -> tuple[str, str]:
                client = docker.from_env(timeout=600)
                try:
                    tag = self.task.build_image(client)
                    workdir = client.images.get(tag).attrs["Config"].get("WorkingDir") or "/"
                    return tag, workdir
                finally:
                    client.close()

            self._image, self._workdir = await asyncio.to_thread(build)
        return self._image

    async def _hashes(self, box: Sandbox) -> dict[str, str]:
        """sha256 of every regular file under the working directory (path -> hash)."""
        cmd = f"find {shlex.quote(self._workdir)} -xdev -type f -print0 | xargs -0 -r sha256sum --zero"
        result = await box.exec(cmd, timeout_s=120, workdir="/")
        hashes = {}
        for entry in result.output.split("\0"):
            hash_, sep, path = entry.partition("  ")
            if sep and len(hash_) == 64:
                hashes[path] = hash_
        return hashes

    def _anchor_of(self, hashes: dict[str, str]) -> str:
        return "s:" + digest(json.dumps(sorted(hashes.items())))

    async def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        await self._close_box()
        image = await self._prepare_image()
        self._box = await self._backend_or_new().start(image, self.limits)
        self._baseline = await self._hashes(self._box)
        self._anchor = self._anchor_of(self._baseline)
        self._steps = 0
        self._expert_done = False
        text = (
            f"{self.task.instruction.strip()}\n\nYou work in {self._workdir}. Call one tool per reply as "
            f'<tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>; submit when done.'
        )
        return [user_message(text)], {"anchor": self._anchor, "success": False, "source": "harbor"}

    async def step(self, action: str) -> StepResult:
        from rollhub.envs.swe.agent.tools import ToolError, parse_tool_call

        if self._box is None or self._anchor is None:
            raise RuntimeError("step() before reset()")
        self._steps += 1
        cut = self._steps >= self.max_steps
        payload = extract_action(action, self.action_tag)
        if payload is None:
            reply = "No tool call found: answer with <tool_call>{...}</tool_call>."
            return [user_message(reply)], 0.0, False, cut, invalid_step_info(self._anchor, reply, format_ok=False)
        try:
            call = parse_tool_call(payload)
            if call.name not in ("bash", "submit"):
                raise ToolError(f"unknown tool '{call.name}'; use bash or submit")
            if call.name == "bash" and not isinstance(call.arguments.get("command"), str):
                raise ToolError("bash needs a 'command' string")
        except ToolError as exc:
            return [user_message(str(exc))], 0.0, False, cut, invalid_step_info(self._anchor, str(exc), format_ok=True)
        if call.name == "submit":
            reward, report = await self._grade()
            info = {"anchor": self._anchor, "success": reward >= 1.0, "action_valid": True, "format_ok": True}
            return [user_message(report)], reward, True, False, info
        timeout = min(float(call.arguments.get("timeout_s") or self.command_timeout_s), 300.0)
        result = await self._box.exec(call.arguments["command"], timeout_s=timeout, workdir=self._workdir)
        self._anchor = self._anchor_of(await self._hashes(self._box))
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        info = {"anchor": self._anchor, "success": False, "action_valid": True, "format_ok": True}
        if cut:  # the step limit ends the episode ungraded: the agent did not submit
            await self._close_box()
        return [user_message(f"[{status}]\n{result.output}")], 0.0, False, cut, info

    async def _grade(self) -> tuple[float, str]:
        assert self._box is not None
        agent = self._box
        after = await self._hashes(agent)
        changed = [p for p, h in after.items() if self._baseline.get(p) != h]
        deleted = [p for p in self._baseline if p not in after]
        if len(changed) + len(deleted) > self.max_changed_files:
            await self._close_box()
            return 0.0, f"Not graded: {len(changed) + len(deleted)} files changed (limit {self.max_changed_files})."
        contents = {}
        for path in changed:
            try:
                contents[path] = await agent.read_file(path, max_bytes=self.max_file_bytes)
            except OSError as exc:  # too large, or gone between the listing and the read: the agent's doing
                await self._close_box()
                return 0.0, f"Not graded: {path}: {exc}"
        await self._close_box()
        image = await self._prepare_image()
        async with await self._backend_or_new().start(image, self.limits) as grader:
            for path, data in contents.items():
                await grader.write_file(path, data)
            if deleted:
                await grader.exec("rm -f -- " + " ".join(shlex.quote(p) for p in deleted), timeout_s=60, workdir="/")
            # a fresh container: /logs/verifier holds only what the image put there
            await grader.exec("mkdir -p /logs/verifier 2>/dev/null; rm -f /logs/verifier/reward.txt", timeout_s=60)
            await grader.copy_in(str(self.task.path / "tests"), TESTS_DIR)
            result = await grader.exec(
                f"bash {TESTS_DIR}/test.sh", timeout_s=self.task.verifier_timeout_s, workdir=self._workdir
            )
            try:
                text = (await grader.read_file(REWARD_FILE, max_bytes=4096)).decode().strip()
                reward = float(text)
            except (OSError, ValueError, UnicodeDecodeError):
                return 0.0, f"Graded: no readable reward (test.sh exit {result.exit_code}); reward 0."
        if result.timed_out or reward != reward or reward in (float("inf"), float("-inf")):
            return 0.0, "Graded: the verifier timed out or gave no finite reward; reward 0."
        return reward, f"Graded: reward {reward:g}."

    def expert_action(self) -> str:
        from rollhub.envs.swe.agent.tools import ToolCall

        if self.task.solution is None:
            raise NotImplementedError(f"{self.task.path} has no solution/solve.sh")
        if self._expert_done:
            return ToolCall("submit", {}).to_text()  # with its <tool_call> tags
        self._expert_done = True
        return ToolCall("bash", {"command": self.task.solution}).to_text()

    async def _close_box(self) -> None:
        box, self._box = self._box, None
        if box is not None:
            await box.close()

    async def close(self) -> None:
        await self._close_box()
        if self._own_backend and self._backend is not None:
            backend, self._backend = self._backend, None
            await backend.close()


_SWE_TEST_SH = """#!/bin/bash
# Grades a task of rollhub's SWE factory: the task's own eval script (it restores the test files
# from the base commit), then every FAIL_TO_PASS and PASS_TO_PASS test must be PASSED in its -rA log.
mkdir -p /logs/verifier && echo 0 > /logs/verifier/reward.txt
git config --global --add safe.directory /testbed
bash /tests/eval.sh > /logs/verifier/test_output.txt 2>&1
python3 - <<'PY'
import json
def key(test_id):  # pytest's -rA line and the task's id may space a parametrized id apart differently
    return "".join(test_id.split())
ids = [key(i) for i in json.load(open("/tests/tests.json"))]
passed = {key(line[len("PASSED "):]) for line in open("/logs/verifier/test_output.txt", errors="replace")
          if line.startswith("PASSED ")}
open("/logs/verifier/reward.txt", "w").write("1" if ids and all(i in passed for i in ids) else "0")
PY
"""


def export_swe_task(task: Any, dest: str | Path) -> Path:
    """Write a task of the SWE factory (`rollhub.envs.swe.tasks.SweTask`) as a Harbor task folder.

    The environment is the task's local image; tests/test.sh runs the task's eval script and
    checks its pytest -rA log; solution/solve.sh applies the gold patch."""
    folder = Path(dest) / _slug(task.instance_id)
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "instruction.md").write_text(task.problem_statement.strip() + "\n")
    (folder / "task.toml").write_text(
        f'version = "1.0"\n[metadata]\nsource = "rollhub swe factory"\ninstance_id = {json.dumps(task.instance_id)}\n'
        "[verifier]\ntimeout_sec = 600\n[agent]\ntimeout_sec = 1800\n"
    )
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM {task.image}\nUSER root\nRUN mkdir -p /logs/verifier && chmod 0777 /logs/verifier\nWORKDIR /testbed\n"
    )
    (folder / "tests" / "eval.sh").write_text(task.eval_script)
    (folder / "tests" / "tests.json").write_text(json.dumps(list(task.fail_to_pass) + list(task.pass_to_pass)))
    (folder / "tests" / "test.sh").write_text(_SWE_TEST_SH)
    (folder / "solution" / "solve.sh").write_text(
        "#!/bin/bash\ncd /testbed\ngit apply - <<'ROLLHUB_GOLD_PATCH'\n" + task.patch + "ROLLHUB_GOLD_PATCH\n"
    )
    return folder


def make_harbor_env(target: str, **kwargs: Any) -> HarborEnv:
    """Registry entry point for `harbor:<task folder>`."""
    return HarborEnv(target, **kwargs)


__all__ = ["HarborEnv", "HarborTask", "SandboxError", "export_swe_task", "make_harbor_env"]
