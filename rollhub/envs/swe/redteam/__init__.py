"""Red team of the SWE reward: gold must score 1, every forging attempt 0, and no attempt may
end as an infra failure.

Classes (`campaign.CLASSES`), each with generated variants drawn per task from a seed:
obfuscated runner patches, log forgery, markers in agent text, runner configuration,
odd file names (honest), infra escapes, and the episode battery's categories (diff
generation, test collection, interpreter start-up, git internals, history, sabotage).
`rollhub swe redteam TASKS.jsonl` runs them over a task file; `rollhub swe make-tasks`
runs them on every new task before accepting it.
"""

from rollhub.envs.swe.redteam.battery import (
    ATTACK_NAMES,
    ATTACKS,
    FORCE_PASS_MONKEYPATCH,
    FORCE_PASS_PLUGIN,
    HOOK_SCRIPT,
    Attack,
    Context,
    _new_file_diff,  # noqa: F401 (tests build patches with it)
    context_for,
)
from rollhub.envs.swe.redteam.campaign import (
    CLASS_NAMES,
    CLASSES,
    AttemptResult,
    TaskReport,
    format_table,
    plan,
    redteam_task,
    select_classes,
    stratified,
    summary,
)
from rollhub.envs.swe.redteam.common import AttackClass, AttackContext, Attempt

__all__ = [
    "ATTACKS",
    "ATTACK_NAMES",
    "CLASSES",
    "CLASS_NAMES",
    "FORCE_PASS_MONKEYPATCH",
    "FORCE_PASS_PLUGIN",
    "HOOK_SCRIPT",
    "Attack",
    "AttackClass",
    "AttackContext",
    "Attempt",
    "AttemptResult",
    "Context",
    "TaskReport",
    "context_for",
    "format_table",
    "plan",
    "redteam_task",
    "select_classes",
    "stratified",
    "summary",
]
