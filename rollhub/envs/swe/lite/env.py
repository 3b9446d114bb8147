"""`rollhub/SWE-lite-v0`: SWE-v0 on SWE-lite tasks (`rollhub swe lite build`), split by content.

    env = rollhub.envs.make("rollhub/SWE-lite-v0", split="train")   # or split="eval"

Everything is SWE-v0 (reset, tools, grading, the differential oracle); what differs is the
default task file (the build's output) and what a task set says it holds: besides ids and
packs, the function families, bug templates and function bodies of its tasks, so the
trainer's overlap check refuses an evaluation set that shares any of them with training, not
only one that shares task ids. Its expert explores and edits (`expert.py`) rather than
applying the gold patch whole, so its episodes serve as SFT demonstrations.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.swe.env import SWEEnv
from rollhub.envs.swe.lite.build import DEFAULT_TASKS
from rollhub.envs.swe.lite.expert import exploring_plan
from rollhub.envs.swe.tasks import SweTask

#: "test" is accepted for the held-out split, which the task files call "eval"
_SPLIT_ALIASES = {"test": "eval"}


class SWELiteEnv(SWEEnv):
    def __init__(self, tasks: str | list[SweTask] | None = None, *, split: str = "train", **kwargs: Any):
        if tasks is None:
            if not Path(DEFAULT_TASKS).is_file():
                raise UserError(f"no SWE-lite tasks at {DEFAULT_TASKS}: run `rollhub swe lite build` first")
            tasks = str(DEFAULT_TASKS)
        super().__init__(tasks, split=_SPLIT_ALIASES.get(split, split), **kwargs)
        if not all((t.row.get("rollhub") or {}).get("lite") for t in self.tasks):
            raise UserError("SWE-lite-v0 plays tasks made by `rollhub swe lite build`; use SWE-v0 for other task files")

    @staticmethod
    def _make_expert_plan(task: SweTask) -> list[str]:
        """The exploring expert (view, test, edit, test, submit): demonstrations a model can imitate."""
        return exploring_plan(task)

    def task_set(self) -> dict[str, str]:
        keys = super().task_set()
        for task in self.tasks:
            lite = task.row["rollhub"]["lite"]
            keys[f"swe-lite-family:{lite['function_family']}"] = f"function family {lite['function_family']}"
            keys[f"swe-lite-template:{lite['bug_template']}"] = f"bug template {lite['bug_template']}"
            body = hashlib.sha256(task.patch.split("\n@@", 1)[-1].encode()).hexdigest()[:16]
            keys[f"swe-lite-fix:{body}"] = f"the fix of {task.instance_id}"
        return keys
