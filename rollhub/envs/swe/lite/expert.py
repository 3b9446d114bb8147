"""A scripted expert that works the way a person does, for SFT warm starts on SWE-lite.

SWE-v0's expert pipes the gold patch into `git apply`: right, but nothing a model can imitate on
a task it has not seen. This one reads the module, runs the failing tests, edits the buggy
lines with `str_replace_editor` (old text and new text from the gold patch's hunk, context
included so the old text is unique in the file), runs the tests again and submits: five tool
calls whose every step a model can learn to take from what the previous ones showed it.
"""

from __future__ import annotations

from rollhub.envs.swe.agent.tools import ToolCall
from rollhub.envs.swe.tasks import SweTask


def hunk_texts(patch: str) -> tuple[str, str]:
    """(text before, text after) of the patch's hunks: context and removed lines, context and
    added lines. The gold patch of a SWE-lite task has one hunk in one file."""
    before, after, in_hunk = [], [], False
    for line in patch.splitlines():
        if line.startswith("@@"):
            in_hunk = True
            continue
        if not in_hunk or line.startswith("\\"):
            continue
        if line.startswith((" ", "-")):
            before.append(line[1:])
        if line.startswith((" ", "+")):
            after.append(line[1:])
    return "\n".join(before), "\n".join(after)


def exploring_plan(task: SweTask) -> list[str]:
    """view the module, run its tests, fix by str_replace, run the tests again, submit."""
    lite = task.row["rollhub"]["lite"]
    module = task.row["rollhub"]["mutation"]["file"]
    test_file = f"{lite['folder']}/test_{module.rsplit('/', 1)[-1]}"
    old, new = hunk_texts(task.patch)
    run_tests = ToolCall("bash", {"command": f"python -m pytest -q -p no:cacheprovider {test_file} 2>&1 | tail -15"})
    return [
        ToolCall("str_replace_editor", {"command": "view", "path": module}).to_text(),
        run_tests.to_text(),
        ToolCall(
            "str_replace_editor", {"command": "str_replace", "path": module, "old_str": old, "new_str": new}
        ).to_text(),
        run_tests.to_text(),
        ToolCall("submit", {}).to_text(),
    ]
