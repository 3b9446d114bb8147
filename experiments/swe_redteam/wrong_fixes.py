"""Honest but wrong patches made with the factory's own mutation operators, for the agreement check.

A 135M model submits mostly empty diffs; these are the non-empty, well-formed, honest patches
that do not (or only partly) fix the bug, two per task:

- `factory-other-edit`: another mutation in the buggy function (or file): the bug stays and a
  second change is added, as a confused agent would edit the right place the wrong way;
- `factory-fix-plus-bug`: the bug fixed and another mutation made in the same function: resolved
  only when the task's tests miss the new bug, so the two graders must agree on both outcomes.

The buggy file is rebuilt from the package source the factory cached and the task's mutation
record, and checked against the gold patch (a task whose rebuild does not match is skipped).

    python experiments/swe_redteam/wrong_fixes.py --tasks 16   # the tasks collect_model_patches.py draws
"""

from __future__ import annotations

import argparse
import difflib
import json
import random
from pathlib import Path

from rollhub.envs.swe.factory.mutation import find_mutations
from rollhub.envs.swe.factory.package_repo import CACHE_DIR
from rollhub.envs.swe.tasks import SHIPPED_TASKS

HERE = Path(__file__).resolve().parent


def git_diff(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}")
    body = "".join(lines)
    return f"diff --git a/{path} b/{path}\n{body}" if body else ""


def changed_lines(patch: str) -> list[str]:
    return [
        line
        for line in patch.splitlines()
        if line[:1] in "+-" and not line.startswith("+++") and not line.startswith("---")
    ]


def wrong_fixes(row: dict) -> list[dict]:
    meta = row["rollhub"]
    mutation = meta["mutation"]
    path = mutation["file"]
    source = CACHE_DIR / f"{meta['package']}-{meta['package_version']}" / "repo" / path
    if not source.is_file():
        return []
    fixed = source.read_text(encoding="utf-8")
    mutants = find_mutations(path, fixed)
    bug = next(
        (
            m
            for m in mutants
            if (m.family, m.function, m.lineno) == (mutation["family"], mutation["function"], mutation["line"])
        ),
        None,
    )
    if bug is None or changed_lines(git_diff(path, bug.new_source, fixed)) != changed_lines(row["patch"]):
        return []
    buggy = bug.new_source
    rng = random.Random(row["instance_id"])
    out = []
    kinds = {
        "factory-other-edit": [m.new_source for m in find_mutations(path, buggy) if m.new_source != fixed],
        "factory-fix-plus-bug": [m.new_source for m in mutants if m.new_source != buggy],
    }
    for source_label, candidates in kinds.items():
        base = buggy if source_label == "factory-other-edit" else fixed
        pool = [c for c in _in_function(path, base, mutation["function"]) if c in candidates] or candidates
        if pool:
            new = rng.choice(pool)
            out.append({"instance_id": row["instance_id"], "patch": git_diff(path, buggy, new), "source": source_label})
    return out


def _in_function(path: str, text: str, function: str) -> list[str]:
    return [m.new_source for m in find_mutations(path, text) if m.function == function]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--from", dest="source", help="a patch .jsonl: its tasks get wrong fixes")
    which.add_argument("--tasks", type=int, help="N tasks drawn round-robin over packages (as collect_model_patches)")
    parser.add_argument("--seed", type=int, default=0, help="draws the --tasks sample")
    parser.add_argument("--out", default=str(HERE / "results" / "wrong_fixes.jsonl"))
    args = parser.parse_args()
    if args.source:
        lines = Path(args.source).read_text().splitlines()
        wanted = {json.loads(line)["instance_id"] for line in lines if line.strip()}
    else:
        from rollhub.envs.swe.redteam import stratified
        from rollhub.envs.swe.tasks import load_tasks

        wanted = {t.instance_id for t in stratified(load_tasks(SHIPPED_TASKS, split="all"), args.tasks, args.seed)}
    rows = [json.loads(line) for line in SHIPPED_TASKS.read_text().splitlines() if line.strip()]
    made, skipped = [], []
    for row in rows:
        if row["instance_id"] in wanted:
            fixes = wrong_fixes(row)
            made += fixes
            if not fixes:
                skipped.append(row["instance_id"])
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in made))
    print(f"{len(made)} wrong fixes for {len(wanted) - len(skipped)} tasks -> {args.out}; skipped: {skipped}")


if __name__ == "__main__":
    main()
