"""Our grader against the official harness, on patches that are not attacks.

The official verdict comes from swebench's own `run_instance` (container, patch apply
chain, eval script, log grading), unchanged: swebench 5.x takes the instance image from the
row's `image` field, and our rows name our locally built task image there, so the official
code runs in exactly the image our grader uses, offline (it pulls only a missing image).
The no-op runs in its negative-test mode (`skip_patch`: the tests run on the unfixed code),
which is stronger than an empty prediction (that one stops at "patch apply failed").

Gold and no-op only show that the two graders agree at the two ends; the patches a policy
really submits (empty, broken, half-right, with stray files) are where a grader's own rules
(test files dropped, names git quotes, configuration refused) could part from swebench's, so
`--patches` grades any such set and reports the agreement per source.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.swe.tasks import SweTask
from rollhub.sandbox.base import SandboxBackend

MODEL_NAME = "rollhub-agreement"
APPLY_FAILED = "patch apply failed"


@dataclass
class Verdicts:
    instance_id: str
    patch: str  # "gold" | "noop" | a label
    ours: float
    official: bool | None  # None: the official run raised (counted as not resolved by swebench)
    official_detail: str = ""
    ours_detail: str = ""
    patch_id: str = ""  # sha256 prefix of a given patch (rows of --patches)
    patch_chars: int = 0
    count: int = 1  # identical rows of the patch file graded once stand for this many

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
        if result is None:  # why, from its own log: a patch it cannot apply is a verdict, a crash is not
            return None, _official_failure(Path("logs/run_evaluation") / run_id / MODEL_NAME / task.instance_id)
    report = result[1][task.instance_id]
    return bool(report["resolved"]), f"patch_successfully_applied={report.get('patch_successfully_applied')}"


def _official_failure(log_dir: Path) -> str:
    from swebench.harness.constants import APPLY_PATCH_FAIL, LOG_INSTANCE

    try:
        log = (log_dir / LOG_INSTANCE).read_text(errors="replace")
    except OSError:
        log = ""
    if APPLY_PATCH_FAIL in log:
        return f"the official run raised: {APPLY_FAILED}"
    if "Test timed out" in log:
        return "the official run raised: the tests timed out"
    tail = " | ".join(line.strip() for line in log.strip().splitlines()[-3:])
    return f"the official run raised: {tail[-400:] or 'no log'}"


def _ours_detail(info: dict[str, Any]) -> str:
    parts = [str(info.get("resolution"))]
    for key in ("patch_rejected", "model_failure", "infra_failure", "hack_reason"):
        if info.get(key):
            parts.append(f"{key}={str(info[key])[:300]}")
    if info.get("dropped_files"):
        parts.append(f"dropped={sorted(info['dropped_files'])}")
    if not info.get("patch_applied", True):
        parts.append("patch_applied=False")
    return "; ".join(parts)


async def compare(
    backend: SandboxBackend, client: Any, task: SweTask, patches: dict[str, str | None] | None = None
) -> list[Verdicts]:
    """Verdicts of both graders on gold and no-op (or the given label -> patch; None = no patch)."""
    from rollhub.envs.swe.grading.evaluate import evaluate_patch

    patches = patches if patches is not None else {"gold": task.patch, "noop": None}
    out = []
    for label, patch in patches.items():
        outcome = await evaluate_patch(backend, task, patch or "")
        official, detail = await asyncio.to_thread(official_resolved, client, task, patch)
        out.append(Verdicts(task.instance_id, label, outcome.reward, official, detail, _ours_detail(outcome.info())))
    return out


@dataclass
class PatchRow:
    instance_id: str
    patch: str
    source: str  # who wrote it: the agreement is reported per source
    count: int = 1

    @property
    def patch_id(self) -> str:
        return hashlib.sha256(self.patch.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def load_patch_rows(path: str | Path) -> list[PatchRow]:
    """Rows {instance_id, patch, source} of a .jsonl file; identical rows (same task, source and
    patch: a small model submits the same empty diff again and again) are graded once, counted."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--patches {path}: no such file (a .jsonl of rows {{instance_id, patch, source}})")
    rows: dict[tuple[str, str, str], PatchRow] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: not JSON ({exc.msg}); write one object per line") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}:{number}: a row must be an object {{instance_id, patch, source}}")
        fields = {key: data.get(key) for key in ("instance_id", "patch", "source")}
        bad = [key for key, value in fields.items() if not isinstance(value, str) or (key != "patch" and not value)]
        if bad:
            raise UserError(
                f"{path}:{number}: {', '.join(bad)} missing or not a string "
                "(instance_id and source non-empty; patch may be empty)"
            )
        key = (fields["instance_id"], fields["source"], fields["patch"])
        if key in rows:
            rows[key].count += 1
        else:
            rows[key] = PatchRow(fields["instance_id"], fields["patch"], fields["source"])
    if not rows:
        raise UserError(f"{path} holds no rows")
    return list(rows.values())


async def compare_rows(
    backend: SandboxBackend,
    client: Any,
    tasks: dict[str, SweTask],
    rows: list[PatchRow],
    on_done: Callable[[Verdicts], None] | None = None,
) -> list[Verdicts]:
    """Both graders' verdicts on each row's patch, as submitted: an empty patch goes through
    swebench's apply chain like any other (its last step, `patch`, accepts an empty file, so the
    tests run on the unfixed code), not through the no-op's `skip_patch`."""
    out = []
    for row in rows:
        (verdict,) = await compare(backend, client, tasks[row.instance_id], {row.source: row.patch})
        verdict.patch_id, verdict.patch_chars, verdict.count = row.patch_id, len(row.patch), row.count
        out.append(verdict)
        if on_done is not None:
            on_done(verdict)
    return out


_SOURCE_COUNTS = (
    "patches",
    "rows",
    "agree",
    "agree_rows",
    "nonempty",
    "ours_resolved",
    "official_resolved",
    "official_apply_failed",
    "official_error",
)


def agreement_by_source(rows: list[Verdicts]) -> dict[str, dict[str, int]]:
    """Per source: distinct patches and the rows they stand for, how many of each agree, and
    what each grader resolved. swebench's refusals to apply a patch (a verdict: not resolved)
    are counted apart from its other errors (a crash or a timeout decides nothing)."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        s = out.setdefault(r.patch, dict.fromkeys(_SOURCE_COUNTS, 0))
        s["patches"] += 1
        s["rows"] += r.count
        s["agree"] += r.agree
        s["agree_rows"] += r.count * r.agree
        s["nonempty"] += r.patch_chars > 0
        s["ours_resolved"] += r.ours == 1.0
        s["official_resolved"] += r.official is True
        apply_failed = r.official is None and r.official_detail.endswith(APPLY_FAILED)
        s["official_apply_failed"] += apply_failed
        s["official_error"] += r.official is None and not apply_failed
    return out


def format_agreement(rows: list[Verdicts]) -> str:
    width = max([len("task"), *(len(r.instance_id) for r in rows)])
    label = max([len("patch"), *(len(r.patch) for r in rows)])
    lines = [f"{'task':<{width}}  {'patch':<{label}}  ours  official  agree"]
    for r in rows:
        official = "error" if r.official is None else str(int(r.official))
        lines.append(
            f"{r.instance_id:<{width}}  {r.patch:<{label}}  {r.ours:>4g}  {official:>8}  {'yes' if r.agree else 'NO'}"
        )
    agree = sum(r.agree for r in rows)
    lines.append(f"{agree}/{len(rows)} verdicts agree")
    sources = agreement_by_source(rows)
    if any(r.patch_id for r in rows):
        for source, s in sources.items():
            lines.append(
                f"{source}: {s['agree']}/{s['patches']} distinct patches agree ({s['rows']} rows, "
                f"{s['nonempty']} non-empty; resolved: ours {s['ours_resolved']}, official {s['official_resolved']}; "
                f"official apply failures {s['official_apply_failed']}, errors {s['official_error']})"
            )
    return "\n".join(lines)
