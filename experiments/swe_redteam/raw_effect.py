"""Whether each generated patch attack works against a naive grader (the patch applied with
`git apply`, no policy, the row's eval script, swebench's log grading): an attack that
cannot forge even there tests no defence. Usage: python raw_effect.py [INSTANCE_ID] [K]"""

from __future__ import annotations

import asyncio
import sys

from rollhub.envs.swe.grading import grade_log
from rollhub.envs.swe.redteam.campaign import CLASSES
from rollhub.envs.swe.redteam.common import AttackContext
from rollhub.envs.swe.redteam.workspace import Workspace
from rollhub.envs.swe.tasks import SHIPPED_TASKS, WORKDIR, load_tasks
from rollhub.sandbox.base import Limits, SandboxError
from rollhub.sandbox.docker_backend import DockerBackend


async def naive(backend, task, patch: str, timeout_s: float = 60) -> tuple[float, str]:
    box = await backend.start(task.image, Limits(cpus=1.0, memory_mb=2048))
    try:
        await box.write_file("/tmp/p.diff", patch or "\n")
        if patch.strip():
            r = await box.exec("git apply /tmp/p.diff", timeout_s=60, workdir=WORKDIR)
            if r.exit_code:
                return 0.0, "apply failed: " + r.output[-200:]
        await box.write_file("/tmp/eval.sh", task.eval_script)
        r = await box.exec("bash /tmp/eval.sh > /tmp/eval.log 2>&1", timeout_s=timeout_s, workdir=WORKDIR)
        log = (await box.read_file("/tmp/eval.log")).decode(errors="replace")
        g = grade_log(task, log)
        return g.reward, f"{g.status} timed_out={r.timed_out}"
    except SandboxError as exc:
        return 0.0, f"sandbox: {str(exc)[:100]}"
    finally:
        await box.close()


async def main() -> None:
    tasks = load_tasks(SHIPPED_TASKS)
    task = next(t for t in tasks if t.instance_id == sys.argv[1]) if len(sys.argv) > 1 else tasks[0]
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    backend = DockerBackend()
    ws = await Workspace.fetch(backend, task)
    try:
        ctx = AttackContext.make(task, ws)
        only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
        for c in [c for c in CLASSES[:5] if not only or c.name in only]:
            n = k or len(c.techniques)
            for attempt in c.variants(ctx, n, seed=1):
                patch = ws.diff(attempt.changes, task.patch if attempt.with_gold else "")
                reward, why = await naive(backend, task, patch)
                print(f"{c.name:26} {attempt.technique:24} {attempt.variant[:40]:40} naive={reward:g} {why}", flush=True)
    finally:
        ws.close()
        await backend.close()


asyncio.run(main())
