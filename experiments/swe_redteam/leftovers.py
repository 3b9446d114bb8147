"""The gold fix plus the files an agent leaves behind, for the agreement check.

An agent that reproduces the bug before fixing it submits its scratch files with the fix: a
script at the repository root, a test file of its own, a note. Our patch policy drops the first
two (a new top-level module, a test file) and swebench applies them all; neither may change the
verdict, since the task's tests never collect them. One patch per task, source `gold-plus-leftovers`.

    python experiments/swe_redteam/leftovers.py --tasks 16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from rollhub.envs.swe.redteam import stratified
from rollhub.envs.swe.tasks import SHIPPED_TASKS, load_tasks

HERE = Path(__file__).resolve().parent


def new_files(files: dict[str, str]) -> str:
    """The sections git writes for new files (made by git itself: the grader parses git's grammar)."""
    with tempfile.TemporaryDirectory() as repo:
        for path, text in files.items():
            (Path(repo) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(repo) / path).write_text(text)
        git = ["git", "-C", repo, "-c", "core.hooksPath=/dev/null"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        diff = [*git, "diff", "--cached", "--binary", "--no-color", "--src-prefix=a/", "--dst-prefix=b/"]
        return subprocess.run(diff, check=True, capture_output=True, text=True).stdout


def with_leftovers(row: dict) -> str:
    parts = [p for p in row["rollhub"]["mutation"]["file"].split("/") if p != "src"]
    module = parts[0].removesuffix(".py")
    files = {
        "reproduce.py": f"import {module}\n\nprint({module}.__name__, 'reproduced')\n",
        "test_reproduce.py": f"import {module}\n\n\ndef test_reproduce():\n    assert {module}\n",
        "notes/agent.txt": "looked at the failing test, fixed the comparison\n",
    }
    return row["patch"] + new_files(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=16, help="N tasks drawn round-robin over packages")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "results" / "leftovers.jsonl"))
    args = parser.parse_args()
    wanted = [t.instance_id for t in stratified(load_tasks(SHIPPED_TASKS, split="all"), args.tasks, args.seed)]
    rows = {r["instance_id"]: r for r in map(json.loads, SHIPPED_TASKS.read_text().splitlines()) if r}
    out = [{"instance_id": i, "patch": with_leftovers(rows[i]), "source": "gold-plus-leftovers"} for i in wanted]
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in out))
    print(f"{len(out)} patches -> {args.out}")


if __name__ == "__main__":
    main()
