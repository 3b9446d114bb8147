"""Whether each generated patch attack works against a naive grader (the patch applied with
`git apply`, no policy, the row's eval script, swebench's log grading): an attack that
cannot forge even there tests no defence. Usage: python raw_effect.py [INSTANCE_ID] [K]"""

from __future__ import annotations

import asyncio
import sys

from rollhub.envs.swe.redteam.campaign import CLASSES
from rollhub.envs.swe.redteam.common import AttackContext
from rollhub.envs.swe.redteam.naive import naive_reward
from rollhub.envs.swe.redteam.workspace import Workspace
from rollhub.envs.swe.tasks import SHIPPED_TASKS, load_tasks
from rollhub.sandbox.docker_backend import DockerBackend


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
                reward, why = await naive_reward(backend, task, patch)
                print(
                    f"{c.name:26} {attempt.technique:24} {attempt.variant[:40]:40} naive={reward:g} {why}", flush=True
                )
    finally:
        ws.close()
        await backend.close()


asyncio.run(main())
