"""Our grader against the official harness, on patches that are not attacks.

The official verdict comes from swebench's own `run_instance` (container, patch apply
chain, eval script, log grading), unchanged: swebench 5.x takes the instance image from the
row's `image` field, and our rows name our locally built task image there, so the official
code runs in exactly the image our grader uses, offline (it pulls only a missing image).
The no-op runs in its negative-test mode (`skip_patch`: the tests run on the unfixed code),
which is stronger than an empty prediction (that one stops at "patch apply failed").
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from rollhub.envs.swe.tasks import SweTask
from rollhub.sandbox.base import SandboxBackend

MODEL_NAME = "rollhub-agreement"


@dataclass
class Verdicts:
    instance_id: str
    patch: str  # "gold" | "noop" | a label
    ours: float
    official: bool | None  # None: the official run raised (counted as not resolved by swebench)
    official_detail: str = ""
    ours_detail: str = ""

    @property
    def agree(self) -> bool:
        return (self.ours == 1.0) == bool(self.official)


def official_resolved(client: Any, task: SweTask, patch: str | None, timeout_s: int = 600) -> tuple[bool | None, str]:
    """swebench's verdict for `patch` (None: no patch, the tests run on the unfixed code)."""
    from swebench.harness.run_evaluation import run_instance
    from swebench.harness.utils import make_test_spec

    spec = make_test_spec(task.row)
    pred = {"instance_id": task.instance_id, "model_name_or_path": MODEL_NAME, "model_patch": patch or ""}
    run_id = f"agree-{int(time.time() * 1000)}"
    with tempfile.TemporaryDirectory() as logs, contextlib.chdir(logs):  # it writes ./logs/run_evaluation
        result = run_instance(spec, pred, client, run_id, timeout_s, skip_patch=patch is None)
    if result is None:
        return None, "the official run raised (patch did not apply, timeout or error)"
    report = result[1][task.instance_id]
    return bool(report["resolved"]), f"patch_successfully_applied={report.get('patch_successfully_applied')}"


async def compare(
    backend: SandboxBackend, client: Any, task: SweTask, patches: dict[str, str | None] | None = None
) -> list[Verdicts]:
    """Verdicts of both graders on gold and no-op (or the given label -> patch; None = no patch)."""
    from rollhub.envs.swe.evaluate import evaluate_patch

    patches = patches if patches is not None else {"gold": task.patch, "noop": None}
    out = []
    for label, patch in patches.items():
        outcome = await evaluate_patch(backend, task, patch or "")
        official, detail = await asyncio.to_thread(official_resolved, client, task, patch)
        out.append(
            Verdicts(task.instance_id, label, outcome.reward, official, detail, str(outcome.info().get("resolution")))
        )
    return out


def format_agreement(rows: list[Verdicts]) -> str:
    width = max([len("task"), *(len(r.instance_id) for r in rows)])
    lines = [f"{'task':<{width}}  patch  ours  official  agree"]
    for r in rows:
        official = "error" if r.official is None else str(int(r.official))
        lines.append(
            f"{r.instance_id:<{width}}  {r.patch:<5}  {r.ours:>4g}  {official:>8}  {'yes' if r.agree else 'NO'}"
        )
    agree = sum(r.agree for r in rows)
    lines.append(f"{agree}/{len(rows)} verdicts agree")
    return "\n".join(lines)
