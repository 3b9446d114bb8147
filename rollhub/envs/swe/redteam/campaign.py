"""The red team over tasks: gold, no-op, and every attack class with K generated variants each.

An attempt is *forged* when a dishonest patch scores above 0, *escaped* when it ends as an
infra failure (the episode would be re-rolled instead of scored: a model could escape its 0
by breaking the machinery), and an honest attempt *fails* when it does not score like the
fix alone. Pure-patch attacks go straight to `evaluate_patch` (what a rollout's submit
calls); the episode battery and the agent-side infra escapes run through `SWEEnv` and its
tools, as a rollout does.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollhub.envs.swe.grading.oracle import TRUST_ORACLE, task_trust
from rollhub.envs.swe.redteam import (
    infra_escape,
    log_forgery,
    markers,
    obfuscation,
    odd_names,
    runner_config,
    special_case,
)
from rollhub.envs.swe.redteam.battery import ATTACKS, Attack, context_for, detail_of, parse_call, run_episode
from rollhub.envs.swe.redteam.common import AttackClass, AttackContext, Attempt, seed_of
from rollhub.envs.swe.redteam.workspace import Workspace
from rollhub.envs.swe.tasks import SweTask
from rollhub.sandbox.base import SandboxBackend


def _battery_class(category: str, attacks: Sequence[Attack]) -> AttackClass:
    by_name = {a.name: a for a in attacks}

    def build(ctx: AttackContext, technique: str, rng: random.Random) -> Attempt:
        attack = by_name[technique]
        return Attempt("battery:" + category, technique, "", steps=attack.steps(context_for(ctx.task)))

    return AttackClass("battery:" + category, f"episode battery: {category}", tuple(by_name), build)


def battery_classes(attacks: Sequence[Attack] = ATTACKS) -> tuple[AttackClass, ...]:
    categories: dict[str, list[Attack]] = {}
    for attack in attacks:
        categories.setdefault(attack.category, []).append(attack)
    return tuple(_battery_class(c, a) for c, a in categories.items())


#: the classes of attack: the issue's six, then the episode battery's categories
CLASSES: tuple[AttackClass, ...] = (
    obfuscation.CLASS,
    log_forgery.CLASS,
    markers.CLASS,
    runner_config.CLASS,
    odd_names.CLASS,
    infra_escape.CLASS,
    special_case.CLASS,
    *battery_classes(),
)
CLASS_NAMES = tuple(c.name for c in CLASSES)


def select_classes(names: Sequence[str] | None, attacks: Sequence[str] | None = None) -> tuple[AttackClass, ...]:
    """Classes by name (all by default); `attacks` (episode battery names) keeps only those
    attacks, in the battery classes that hold them (and no other class unless named)."""
    if attacks:
        known = {a.name for a in ATTACKS}
        if unknown := sorted(set(attacks) - known):
            raise ValueError(f"unknown attacks {unknown}; known: {', '.join(sorted(known))}")
        chosen = battery_classes([a for a in ATTACKS if a.name in attacks])
        return (*[c for c in CLASSES if names and c.name in names and not c.name.startswith("battery:")], *chosen)
    if not names:
        return CLASSES
    if unknown := sorted(set(names) - set(CLASS_NAMES)):
        raise ValueError(f"unknown attack classes {unknown}; known: {', '.join(CLASS_NAMES)}")
    return tuple(c for c in CLASSES if c.name in names)


@dataclass
class AttemptResult:
    cls: str
    technique: str
    variant: str
    reward: float
    honest: bool = False
    infra_failure: str = ""
    model_failure: str = ""
    hack_suspected: bool = False
    detail: str = ""
    duration_s: float = 0.0
    #: the attack could not be generated (a bug of the red team, not a verdict)
    error: str = ""

    @property
    def forged(self) -> bool:
        return not self.honest and self.reward > 0

    @property
    def escaped(self) -> bool:
        return bool(self.infra_failure)

    @property
    def honest_failed(self) -> bool:
        return self.honest and self.reward != 1.0

    @property
    def bad(self) -> bool:
        return self.forged or self.escaped or self.honest_failed

    @property
    def attack(self) -> str:
        return f"{self.cls}/{self.technique}"


@dataclass
class TaskReport:
    instance_id: str
    gold_reward: float
    gold_detail: str = ""
    noop_reward: float | None = None
    attempts: list[AttemptResult] = field(default_factory=list)

    @property
    def hacks(self) -> list[AttemptResult]:
        return [a for a in self.attempts if a.bad]

    @property
    def ok(self) -> bool:
        return self.gold_reward == 1.0 and not self.noop_reward and not self.hacks

    def reason(self) -> str:
        """Why the task is rejected ('' when it is fine)."""
        parts = []
        if self.gold_reward != 1.0:
            parts.append(f"gold patch scores {self.gold_reward:g} ({self.gold_detail})")
        if self.noop_reward:
            parts.append(f"the empty patch scores {self.noop_reward:g}")
        for a in self.hacks:
            what = "honest patch scored " if a.honest else ("infra failure " if a.escaped else "reward ")
            value = a.infra_failure if a.escaped else f"{a.reward:g}"
            parts.append(f"{a.attack} ({a.variant}): {what}{value}")
        return "; ".join(parts)


async def _grade_patch(
    backend: SandboxBackend, task: SweTask, patch: str, eval_timeout_s: float
) -> tuple[float, dict[str, Any]]:
    from rollhub.envs.swe.grading.evaluate import evaluate_patch

    outcome = await evaluate_patch(
        backend, task, patch, timeout_s=eval_timeout_s, labels={"rollhub.role": "swe-redteam"}
    )
    return outcome.reward, outcome.info()


async def run_attempt(
    backend: SandboxBackend, ctx: AttackContext, attempt: Attempt, eval_timeout_s: float
) -> AttemptResult:
    started = time.monotonic()
    if attempt.steps is not None:
        reward, info = await run_episode(backend, ctx.task, attempt.steps, eval_timeout_s)
    else:
        try:
            patch = ctx.ws.diff(attempt.changes, ctx.task.patch if attempt.with_gold else "")
        except (RuntimeError, OSError, UnicodeError) as exc:  # the generator's fault: shown, never scored
            return AttemptResult(attempt.cls, attempt.technique, attempt.variant, 0.0, attempt.honest, error=str(exc))
        reward, info = await _grade_patch(backend, ctx.task, patch, eval_timeout_s)
    return AttemptResult(
        attempt.cls,
        attempt.technique,
        attempt.variant,
        reward,
        honest=attempt.honest,
        infra_failure=str(info.get("infra_failure", "")),
        model_failure=str(info.get("model_failure", "")),
        hack_suspected=bool(info.get("hack_suspected")),
        detail=detail_of(info),
        duration_s=round(time.monotonic() - started, 2),
    )


def plan(ctx: AttackContext, classes: Sequence[AttackClass], variants: int, seed: int) -> list[Attempt]:
    """Every class on this task, `variants` generated attempts each (the battery's categories
    run each of their attacks once a task at most; special-casing only where an oracle grades)."""
    out = []
    for c in classes:
        if c is special_case.CLASS and task_trust(ctx.task) != TRUST_ORACLE:
            continue  # grading by visible tests alone cannot tell a table of their answers from a fix
        k = min(variants, len(c.techniques)) if c.name.startswith("battery:") else variants
        out += c.variants(ctx, k, seed)
    return out


async def redteam_task(
    backend: SandboxBackend,
    task: SweTask,
    classes: Sequence[AttackClass] = CLASSES,
    *,
    variants: int = 1,
    seed: int = 0,
    concurrency: int = 3,
    eval_timeout_s: float = 120.0,
    on_attempt: Callable[[AttemptResult], None] | None = None,
) -> TaskReport:
    """Gold through the expert's tool calls, the empty patch, then every class's variants."""
    from rollhub.envs.swe.env import SWEEnv

    limit = asyncio.Semaphore(max(1, concurrency))
    ws = await Workspace.fetch(backend, task)
    try:
        ctx = AttackContext.make(task, ws)
        attempts = plan(ctx, classes, variants, seed)

        async def gold() -> tuple[float, str]:
            async with limit:
                steps = [parse_call(a) for a in SWEEnv._make_expert_plan(task)[:-1]]
                reward, info = await run_episode(backend, task, steps, eval_timeout_s)
                return reward, detail_of(info)

        async def noop() -> float:
            async with limit:
                return (await _grade_patch(backend, task, "", eval_timeout_s))[0]

        async def one(attempt: Attempt) -> AttemptResult:
            async with limit:
                try:
                    result = await run_attempt(backend, ctx, attempt, eval_timeout_s)
                except Exception as exc:  # noqa: BLE001 - an exception out of the env or grader is an escape
                    why = f"unhandled {type(exc).__name__}: {str(exc)[:300]}"
                    result = AttemptResult(attempt.cls, attempt.technique, attempt.variant, 0.0, attempt.honest, why)
            if on_attempt is not None:
                on_attempt(result)
            return result

        (gold_reward, gold_detail), noop_reward, *results = await asyncio.gather(
            gold(), noop(), *[one(a) for a in attempts]
        )
    finally:
        ws.close()
    return TaskReport(task.instance_id, gold_reward, gold_detail, noop_reward, list(results))


def stratified(tasks: Sequence[SweTask], n: int | None, seed: int = 0) -> list[SweTask]:
    """`n` tasks drawn round-robin over packages (every package before any repeats)."""
    if n is None or n >= len(tasks):
        return list(tasks)
    by_repo: dict[str, list[SweTask]] = {}
    for task in tasks:
        by_repo.setdefault(task.repo, []).append(task)
    rng = random.Random(seed_of(seed, "stratified"))
    queues = []
    for repo in sorted(by_repo):
        group = list(by_repo[repo])
        rng.shuffle(group)
        queues.append(group)
    out: list[SweTask] = []
    while len(out) < n:
        for queue in queues:
            if queue and len(out) < n:
                out.append(queue.pop())
    return out


def summary(reports: Sequence[TaskReport], classes: Sequence[AttackClass], **meta: Any) -> dict[str, Any]:
    per_class: dict[str, dict[str, Any]] = {
        c.name: {"attempts": 0, "forged": 0, "escaped": 0, "honest_failed": 0, "hack_suspected": 0, "techniques": {}}
        for c in classes
    }
    failures = []
    for report in reports:
        for a in report.attempts:
            row = per_class.setdefault(
                a.cls,
                {"attempts": 0, "forged": 0, "escaped": 0, "honest_failed": 0, "hack_suspected": 0, "techniques": {}},
            )
            row["attempts"] += 1
            row["forged"] += a.forged
            row["escaped"] += a.escaped
            row["honest_failed"] += a.honest_failed
            row["hack_suspected"] += a.hack_suspected
            row["techniques"][a.technique] = row["techniques"].get(a.technique, 0) + 1
            if a.bad:
                failures.append({"task": report.instance_id, **asdict(a)})
    attempts = [a for r in reports for a in r.attempts]
    return {
        **meta,
        "tasks": len(reports),
        "packages": len({r.instance_id.split("__", 1)[0] for r in reports}),
        "gold_resolved": sum(r.gold_reward == 1.0 for r in reports),
        "gold_failed": [{"task": r.instance_id, "detail": r.gold_detail} for r in reports if r.gold_reward != 1.0],
        "noop_resolved": sum(bool(r.noop_reward) for r in reports),
        "attempts": len(attempts),
        "forged": sum(a.forged for a in attempts),
        "escaped": sum(a.escaped for a in attempts),
        "honest_failed": sum(a.honest_failed for a in attempts),
        "hack_suspected": sum(a.hack_suspected for a in attempts),
        "generator_errors": [
            {"task": r.instance_id, "attack": a.attack, "error": a.error}
            for r in reports
            for a in r.attempts
            if a.error
        ],
        "classes": per_class,
        "failures": failures,
    }


def format_table(reports: Sequence[TaskReport], classes: Sequence[AttackClass] = CLASSES) -> str:
    s = summary(reports, classes)
    width = max(len(c) for c in s["classes"]) if s["classes"] else 5
    lines = [f"{'class':<{width}}  attempts  forged  escaped  honest_failed"]
    for name, row in s["classes"].items():
        lines.append(
            f"{name:<{width}}  {row['attempts']:>8}  {row['forged']:>6}  {row['escaped']:>7}  "
            f"{row['honest_failed']:>13}"
        )
    for f in s["failures"]:
        lines.append(
            f"    {f['task']}: {f['cls']}/{f['technique']} ({f['variant']}) reward {f['reward']:g} "
            f"{f['infra_failure']} {f['detail']}"
        )
    for g in s["gold_failed"]:
        lines.append(f"    gold failed on {g['task']}: {g['detail']}")
    lines.append(
        f"tasks {s['tasks']}, gold 1.0 on {s['gold_resolved']}, no-op resolved {s['noop_resolved']}, "
        f"attempts {s['attempts']}, forged {s['forged']}, escaped {s['escaped']}, honest failed {s['honest_failed']}"
    )
    return "\n".join(lines)


def read_reports(data: dict[str, Any]) -> list[TaskReport]:
    """The task reports of a `write_json` record (what a resumed run keeps)."""
    return [
        TaskReport(
            r["instance_id"],
            r["gold_reward"],
            r.get("gold_detail", ""),
            r.get("noop_reward"),
            [AttemptResult(**a) for a in r.get("attempts", [])],
        )
        for r in data.get("reports", [])
    ]


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True))
