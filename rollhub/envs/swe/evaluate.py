"""Reward of a SWE episode, computed in a FRESH container from the task's image.

The agent's working container is never trusted: we take its diff (test files excluded,
so editing tests cannot buy reward), start a new container, apply the diff the way the
official harness does (`git apply`, then `--3way`, `--reject`, `patch --fuzz`), run the
row's eval script (which applies the test patch) and grade the log with swebench.
A failure of the machinery raises nothing: it is returned as `infra_failure`.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from rollhub.envs.swe.grading import GradeResult, grade_log
from rollhub.envs.swe.tasks import WORKDIR, SweTask, files_in_patch, is_test_path
from rollhub.sandbox.base import Limits, Sandbox, SandboxBackend, SandboxError

logger = logging.getLogger(__name__)

PATCH_PATH = "/tmp/rollhub_patch.diff"
EVAL_SCRIPT_PATH = "/tmp/rollhub_eval.sh"
#: the official harness's fallbacks, in its order
APPLY_COMMANDS = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)
#: a private index, so reading the diff does not touch the agent's own `git add` state
_DIFF_COMMAND = (
    "cp .git/index /tmp/rollhub_index 2>/dev/null; export GIT_INDEX_FILE=/tmp/rollhub_index; "
    "git add -A . >/dev/null 2>&1 && git -c core.fileMode=false diff --cached --binary --no-color {base} > {out}"
)
#: outputs go to files and are read back whole: exec output is truncated for the agent's sake
DIFF_PATH = "/tmp/rollhub_agent.diff"
EVAL_LOG_PATH = "/tmp/rollhub_eval.log"


@dataclass
class EvalOutcome:
    grade: GradeResult
    patch_applied: bool
    model_patch: str
    log: str = field(repr=False, default="")
    infra_failure: str = ""
    duration_s: float = 0.0

    @property
    def reward(self) -> float:
        return 0.0 if self.infra_failure else self.grade.reward

    def info(self) -> dict[str, Any]:
        info = {**self.grade.info(), "patch_applied": self.patch_applied, "eval_duration_s": round(self.duration_s, 3)}
        if self.infra_failure:
            info["infra_failure"] = self.infra_failure
        return info


def drop_test_files(patch: str, extra_test_files: set[str] = frozenset()) -> str:
    """The diff without the sections that touch test files."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    kept = []
    for section in sections:
        names = files_in_patch(section)
        if names and any(is_test_path(n) or n in extra_test_files for n in names):
            continue
        kept.append(section)
    return "".join(kept)


async def extract_diff(box: Sandbox, task: SweTask) -> str:
    """The agent's changes since the base commit (new files included), test files dropped."""
    result = await box.exec(_DIFF_COMMAND.format(base=task.base_commit, out=DIFF_PATH), timeout_s=60, workdir=WORKDIR)
    if result.exit_code != 0:
        raise SandboxError(f"git diff failed in the working container: {result.output[-500:]}")
    diff = (await box.read_file(DIFF_PATH)).decode("utf-8", errors="replace")
    return drop_test_files(diff, set(files_in_patch(task.test_patch)))


async def apply_patch(box: Sandbox, patch: str) -> tuple[bool, str]:
    if not patch.strip():
        return True, "empty patch"
    await box.write_file(PATCH_PATH, patch if patch.endswith("\n") else patch + "\n")
    output = ""
    for attempt, command in enumerate(APPLY_COMMANDS):
        if attempt:
            await box.exec("git checkout -- . ; git clean -fdq", timeout_s=60, workdir=WORKDIR)
        result = await box.exec(f"{command} {PATCH_PATH}", timeout_s=60, workdir=WORKDIR)
        output = result.output
        if result.exit_code == 0:
            return True, output
    return False, output


async def evaluate_patch(
    backend: SandboxBackend,
    task: SweTask,
    patch: str,
    *,
    limits: Limits = Limits(cpus=1.0, memory_mb=2048),
    timeout_s: float = 900.0,
    labels: dict[str, str] | None = None,
) -> EvalOutcome:
    """Apply `patch` in a fresh container of the task's image, run the eval script, grade."""
    from swebench.harness.utils import make_test_spec

    started = time.monotonic()
    eval_script = make_test_spec(task.row).eval_script
    box = None
    try:
        box = await backend.start(task.image, limits, labels={**(labels or {}), "rollhub.role": "swe-eval"})
        applied, apply_log = await apply_patch(box, patch)
        if not applied:
            logger.info("patch did not apply for %s: %s", task.instance_id, apply_log[-300:])
            return EvalOutcome(
                GradeResult(resolved=False), False, patch, apply_log, duration_s=time.monotonic() - started
            )
        await box.write_file(EVAL_SCRIPT_PATH, eval_script)
        result = await box.exec(f"bash {EVAL_SCRIPT_PATH} > {EVAL_LOG_PATH} 2>&1", timeout_s=timeout_s, workdir=WORKDIR)
        log = (await box.read_file(EVAL_LOG_PATH)).decode("utf-8", errors="replace")
        if result.timed_out:
            log += "\n>>>>> Tests Timed Out\n"
        grade = grade_log(task, log)
        return EvalOutcome(
            grade, True, patch, log, infra_failure=grade.infra_failure, duration_s=time.monotonic() - started
        )
    except SandboxError as exc:
        logger.warning("infra failure grading %s: %s", task.instance_id, exc)
        return EvalOutcome(
            GradeResult(resolved=False),
            False,
            patch,
            infra_failure=f"sandbox: {exc}",
            duration_s=time.monotonic() - started,
        )
    finally:
        if box is not None:
            await box.close()
