"""The reward a naive grader gives a patch: `git apply`, the row's eval script, swebench's log
grading; no policy, no channel of its own. An attack that cannot forge even this tests no
defence, so the red team's tests check that its attacks do (`naive_reward`)."""

from __future__ import annotations

from rollhub.envs.swe.grading.verdict import grade_log
from rollhub.envs.swe.tasks import WORKDIR, SweTask
from rollhub.sandbox.base import Limits, SandboxBackend, SandboxError


async def naive_reward(backend: SandboxBackend, task: SweTask, patch: str, timeout_s: float = 120) -> tuple[float, str]:
    box = await backend.start(task.image, Limits(cpus=1.0, memory_mb=2048), labels={"rollhub.role": "swe-redteam"})
    try:
        if patch.strip():
            await box.write_file("/tmp/rollhub_naive.diff", patch)
            applied = await box.exec("git apply /tmp/rollhub_naive.diff", timeout_s=60, workdir=WORKDIR)
            if applied.exit_code:
                return 0.0, "apply failed: " + applied.output[-200:]
        await box.write_file("/tmp/rollhub_naive.sh", task.eval_script)
        run = await box.exec(
            "bash /tmp/rollhub_naive.sh > /tmp/rollhub_naive.log 2>&1", timeout_s=timeout_s, workdir=WORKDIR
        )
        log = (await box.read_file("/tmp/rollhub_naive.log")).decode(errors="replace")
        grade = grade_log(task, log)
        return grade.reward, f"{grade.status} timed_out={run.timed_out}"
    except (SandboxError, OSError) as exc:
        return 0.0, f"sandbox: {str(exc)[:200]}"
    finally:
        await box.close()
