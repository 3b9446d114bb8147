"""SWE task rows: swebench 5.x dataset rows, loaded from .jsonl/.json files or `datasets`.

A task is exactly one swebench 5.x row (`instance_id, repo, base_commit, problem_statement,
patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, version, image, eval_script, log_parser,
eval_type`, ...). We keep the row untouched in `SweTask.row` so the official harness can
grade the very same dict, and expose typed fields for the env.

Legacy 4.x rows have no `image`, `eval_script`, `log_parser` or `eval_type`: 4.x derived
them from per-repo tables that 5.x removed. `SweTask.from_row(row, legacy=LegacyMapping())`
fills them in: the image name the official registry uses for the instance, a generic
pytest eval script built from the files that `test_patch` touches, `parse_log_pytest_v2`
and `pass_and_fail`. That is right for pytest repos; repos with their own runner (django,
sympy) need the real 5.x rows.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError

#: where every swebench image keeps the repository
WORKDIR = "/testbed"
START_MARKER = ">>>>> Start Test Output"
END_MARKER = ">>>>> End Test Output"
DEFAULT_LOG_PARSER = "parse_log_pytest_v2"

_TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_tests?\.py$|(^|/)conftest\.py$")


def is_test_path(path: str) -> bool:
    """True for files the agent must not be able to change its reward with."""
    return bool(_TEST_PATH.search(path))


def _json_list(value: Any, key: str, instance_id: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UserError(f"task {instance_id}: {key} is not a JSON list ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"task {instance_id}: {key} must be a list of test ids")
    return list(value)


@dataclass(frozen=True)
class LegacyMapping:
    """How to complete a swebench 4.x row (no `image`/`eval_script`) into a 5.x one."""

    #: image namespace; "swebench" gives the official `swebench/sweb.eval.x86_64.<id>`,
    #: "xingyaoww" with separator "_s_" gives SWE-Gym's images
    namespace: str = "swebench"
    separator: str = "_1776_"
    test_command: str = "pytest -rA --tb=no -p no:cacheprovider"

    def image(self, instance_id: str) -> str:
        key = f"sweb.eval.x86_64.{instance_id}:latest".lower().replace("__", self.separator)
        return f"{self.namespace}/{key}"


def files_in_patch(patch: str) -> list[str]:
    """Paths a unified git diff touches (new names), in order."""
    seen: list[str] = []
    for match in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, flags=re.M):
        if match.group(2) not in seen:
            seen.append(match.group(2))
    return seen


def pytest_eval_script(
    base_commit: str, test_files: list[str], test_patch: str, test_command: str, test_targets: list[str] | None = None
) -> str:
    """A swebench-style eval script for a pytest repo.

    Test files are reset to the base commit before the test patch goes in (so an agent's
    edits to them do not count) and again afterwards; the markers bracket the output
    the log parser reads."""
    files = " ".join(shlex.quote(f) for f in test_files)
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {WORKDIR}", "git status --short", "git diff"]
    if files:
        lines.append(f"git checkout {base_commit} -- {files} 2>/dev/null || true")
    if test_patch.strip():
        lines.append(f"git apply --verbose - <<'ROLLHUB_TEST_PATCH'\n{test_patch.rstrip()}\nROLLHUB_TEST_PATCH")
    targets = " ".join(shlex.quote(t) for t in (test_targets if test_targets is not None else test_files))
    lines += [f": '{START_MARKER}'", f"{test_command} {targets}".rstrip(), f": '{END_MARKER}'"]
    if files:
        lines.append(f"git checkout {base_commit} -- {files} 2>/dev/null || true")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SweTask:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    image: str
    eval_script: str
    log_parser: str
    eval_type: str
    version: str
    #: the full row (5.x form), as the official harness wants it
    row: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_row(cls, row: dict[str, Any], legacy: LegacyMapping | None = None) -> SweTask:
        row = dict(row)
        instance_id = str(row.get("instance_id") or "")
        missing = [
            k for k in ("instance_id", "repo", "base_commit", "patch", "FAIL_TO_PASS", "PASS_TO_PASS") if k not in row
        ]
        if missing:
            raise UserError(f"task row {instance_id or '?'} lacks {', '.join(missing)}; is this a SWE-bench dataset?")
        row.setdefault("test_patch", "")
        row.setdefault("problem_statement", "")
        row.setdefault("version", "")
        if "image" not in row or "eval_script" not in row:
            if legacy is None:
                raise UserError(
                    f"task {instance_id} is a swebench 4.x row (no 'image'/'eval_script'); "
                    "pass legacy=LegacyMapping() (CLI: --legacy) to map it, or use 5.x rows"
                )
            test_files = files_in_patch(row["test_patch"])
            row.setdefault("image", legacy.image(instance_id))
            row.setdefault(
                "eval_script",
                pytest_eval_script(row["base_commit"], test_files, row["test_patch"], legacy.test_command),
            )
        row.setdefault("log_parser", DEFAULT_LOG_PARSER)
        row.setdefault("eval_type", "pass_and_fail")
        return cls(
            instance_id=instance_id,
            repo=row["repo"],
            base_commit=row["base_commit"],
            problem_statement=row["problem_statement"],
            patch=row["patch"],
            test_patch=row["test_patch"],
            fail_to_pass=_json_list(row["FAIL_TO_PASS"], "FAIL_TO_PASS", instance_id),
            pass_to_pass=_json_list(row["PASS_TO_PASS"], "PASS_TO_PASS", instance_id),
            image=row["image"],
            eval_script=row["eval_script"],
            log_parser=row["log_parser"],
            eval_type=row["eval_type"],
            version=str(row["version"]),
            row=row,
        )


def read_rows(source: str | Path, split: str = "test") -> list[dict[str, Any]]:
    """Rows from a .jsonl/.json file, or a `datasets` name/folder where one is reachable."""
    path = Path(source)
    if path.suffix in (".jsonl", ".json"):
        if not path.exists():
            raise UserError(f"task file {path} not found")
        text = path.read_text()
        if path.suffix == ".json":
            data = json.loads(text)
            return list(data if isinstance(data, list) else data.get("instances", []))
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    try:
        from swebench.harness.utils import load_swebench_dataset
    except ModuleNotFoundError as exc:
        from rollhub.core.errors import MissingExtraError

        raise MissingExtraError("swe", f"loading dataset '{source}'") from exc
    try:
        return [dict(r) for r in load_swebench_dataset(str(source), split=split)]
    except Exception as exc:  # datasets raises many types for an unreachable hub
        raise UserError(
            f"could not load dataset '{source}' split '{split}': {exc}. Use a local .jsonl file offline."
        ) from None


#: local task files: these split names select packages (`splits.json` beside the file)
PACKAGE_SPLITS = ("train", "eval")
SPLITS_FILE = "splits.json"


def package_of(row: dict[str, Any]) -> str:
    """A row's package, normalised (`rollhub.package` of factory rows, else the repo name)."""
    name = (row.get("rollhub") or {}).get("package") or str(row.get("repo", "")).rsplit("/", 1)[-1]
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def read_package_splits(task_file: Path) -> dict[str, list[str]]:
    """`splits.json` beside a task file: {"train": [packages], "eval": [packages]}, disjoint."""
    path = task_file.parent / SPLITS_FILE
    if not path.is_file():
        raise UserError(f"split by package needs {path} ({{'train': [...], 'eval': [...]}}); none found")
    try:
        data = json.loads(path.read_text())
        splits = {name: [package_of({"repo": p}) for p in data[name]] for name in PACKAGE_SPLITS}
    except (json.JSONDecodeError, KeyError, TypeError):
        raise UserError(f"{path} must be JSON with lists 'train' and 'eval' of package names") from None
    if shared := set(splits["train"]) & set(splits["eval"]):
        raise UserError(f"{path}: packages {sorted(shared)} are in both train and eval")
    return splits


def load_tasks(
    source: str | Path,
    split: str = "test",
    legacy: LegacyMapping | None = None,
    instance_ids: Iterable[str] | None = None,
    packages: Iterable[str] | None = None,
) -> list[SweTask]:
    """Tasks from a file or dataset. For a local file, `split` 'train' / 'eval' keeps the
    packages `splits.json` lists for it (any other split name keeps every row), and
    `packages` keeps only those packages; a dataset name passes `split` to `datasets`."""
    rows = read_rows(source, split)
    path = Path(source)
    local = path.suffix in (".jsonl", ".json")
    if local and split in PACKAGE_SPLITS:
        chosen = set(read_package_splits(path)[split])
        rows = [r for r in rows if package_of(r) in chosen]
        if not rows:
            raise UserError(f"no tasks of split '{split}' (packages {sorted(chosen)}) in {source}")
    if packages is not None:
        wanted_packages = {package_of({"repo": p}) for p in packages}
        rows = [r for r in rows if package_of(r) in wanted_packages]
    tasks = [SweTask.from_row(r, legacy) for r in rows]
    if instance_ids is not None:
        wanted = set(instance_ids)
        tasks = [t for t in tasks if t.instance_id in wanted]
        if missing := wanted - {t.instance_id for t in tasks}:
            raise UserError(f"instance ids not in {source}: {', '.join(sorted(missing))}")
    if not tasks:
        raise UserError(f"no tasks in {source}")
    return tasks


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


#: the shipped task set (generated by `rollhub swe make-tasks`)
SHIPPED_TASKS = Path(__file__).parent / "data" / "tasks.jsonl"
