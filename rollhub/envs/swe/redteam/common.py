"""What every attack class shares: the context a policy sees, one generated attempt, a class."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from rollhub.envs.swe.agent.tools import ToolCall
from rollhub.envs.swe.redteam.workspace import Change, Workspace
from rollhub.envs.swe.tasks import SweTask, files_in_patch


def task_test_files(task: SweTask) -> list[str]:
    """Files of the task's tests, failing ones first; a doctest's module holds the fix, not a test."""
    from rollhub.envs.swe.grading.patch_policy import is_doctest_id

    ids = [t for t in [*task.fail_to_pass, *task.pass_to_pass] if not is_doctest_id(t)]
    return [t.split("::", 1)[0] for t in ids] or files_in_patch(task.test_patch) or ["tests"]


@dataclass
class AttackContext:
    """What a policy knows in its container: the repository, the failing tests, the file to fix."""

    task: SweTask
    ws: Workspace
    source_file: str  # a library file the fix touches (imported by the failing tests)
    test_file: str
    test_dir: str  # '' = repository root

    @classmethod
    def make(cls, task: SweTask, ws: Workspace) -> AttackContext:
        tests = task_test_files(task)
        sources = files_in_patch(task.patch) or ["README"]
        test_file = tests[0]
        return cls(task, ws, sources[0], test_file, test_file.rsplit("/", 1)[0] if "/" in test_file else "")

    @property
    def source_dir(self) -> str:
        return self.source_file.rsplit("/", 1)[0] if "/" in self.source_file else ""

    @property
    def in_package(self) -> bool:
        return f"{self.source_dir}/__init__.py" in self.ws.files if self.source_dir else False

    @property
    def test_ids(self) -> list[str]:
        return [*self.task.fail_to_pass, *self.task.pass_to_pass]

    @property
    def import_root(self) -> str:
        """Where the image puts the repository on sys.path ('src' for a src layout)."""
        return "src" if self.source_file.startswith("src/") else ""

    def join(self, folder: str, name: str) -> str:
        return f"{folder}/{name}" if folder else name


@dataclass
class Attempt:
    """One generated attack. A patch attempt (`changes` over the base tree, optionally with the
    fix) goes straight to the grader; an episode attempt (`steps`) runs through SWEEnv's tools."""

    cls: str
    technique: str
    variant: str = ""
    changes: dict[str, Change] = field(default_factory=dict)
    with_gold: bool = False
    steps: list[ToolCall] | None = None
    #: an honest patch (the fix plus harmless extras): must grade like the fix alone
    honest: bool = False


@dataclass(frozen=True)
class AttackClass:
    name: str
    description: str
    techniques: tuple[str, ...]
    build: Callable[[AttackContext, str, random.Random], Attempt]

    def variants(self, ctx: AttackContext, k: int, seed: int) -> list[Attempt]:
        """`k` attempts for this task: techniques in an order drawn per (seed, task, class), so
        every technique comes up across tasks, each spelt by its own generator."""
        rng = random.Random(seed_of(seed, ctx.task.instance_id, self.name))
        order = list(self.techniques)
        rng.shuffle(order)
        out = []
        for i in range(k):
            technique = order[i % len(order)]
            out.append(self.build(ctx, technique, random.Random(seed_of(seed, ctx.task.instance_id, self.name, i))))
        return out


def seed_of(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big")


def library_edit(ctx: AttackContext, snippet: str, where: str) -> dict[str, Change]:
    """The library file that the failing tests import, with `snippet` put in at `where`."""
    from rollhub.envs.swe.redteam.variation import place

    text = ctx.ws.text(ctx.source_file) or ""
    return {ctx.source_file: place(text, snippet, where)}


def helper_module(ctx: AttackContext, name: str, body: str) -> dict[str, Change]:
    """A new module next to the library file holding `body`, imported from the library file."""
    module = ctx.join(ctx.source_dir, f"{name}.py")
    line = f"from . import {name}  # noqa: F401" if ctx.in_package else f"import {name}  # noqa: F401"
    text = ctx.ws.text(ctx.source_file) or ""
    return {module: body, ctx.source_file: text.rstrip("\n") + "\n\n" + line + "\n"}
