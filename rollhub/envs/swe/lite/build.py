"""`rollhub swe lite build`: SWE-lite tasks as swebench rows, a few images for thousands of tasks.

Images. Tasks are grouped in packs (default 500). A pack is one git repository at /testbed
holding one folder per task (`pkg_NNNN/`, a package) and a root `pytest.ini` (so test ids
carry the folder). Per pack, two images, made by the package factory's own builders:

- the clean image (`rollhub/swe-pkg-lite-...`, `images.build_package_image`): every folder
  correct. It is the oracle's gold image: `oracle.clean_image` finds it in the ancestry of
  the task image by its `rollhub/swe-pkg-` tag, as for a package task.
- the task image (`images.build_instance_image`): every task's bug applied, history squashed
  to one commit, which is every task's `base_commit`. No folder holds another task's function
  unmutated (`generate.make_spec` keeps function bodies unique per pack), so the container
  holds no copy of any task's correct code.

A row names its folder: its eval script resets and runs only that folder's test file, its
gold patch touches only that folder's module, and the problem statement says where to look.
Everything else (reset, tools, diff, patch policy, grading, the differential oracle, swebench's
`run_instance`) is the package factory's path unchanged.

Verification by running: the whole pack's suite runs once in the clean image (every test must
pass) and once in the task image (each task's FAIL_TO_PASS are the tests of its folder that
fail, PASS_TO_PASS those that pass); a task whose failing tests differ from what the host
predicted, or with none, is dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rollhub.envs.swe.factory.build import SUITE_LIMITS, TEST_COMMAND, failure_messages
from rollhub.envs.swe.factory.images import build_instance_image, build_package_image, instance_image_current
from rollhub.envs.swe.factory.package_repo import git
from rollhub.envs.swe.grading.oracle import TRUST_ORACLE
from rollhub.envs.swe.grading.verdict import parse_pytest_log
from rollhub.envs.swe.lite.bugs import kind_of
from rollhub.envs.swe.lite.generate import SPLITS, TaskSpec, content_digest, make_specs
from rollhub.envs.swe.tasks import DEFAULT_LOG_PARSER, WORKDIR, pytest_eval_script, write_rows
from rollhub.sandbox.base import SandboxBackend, SandboxError

logger = logging.getLogger(__name__)

#: the test stack of the shipped factory tasks (its wheels are cached for offline builds)
TEST_REQUIREMENTS = ["iniconfig==2.3.1", "packaging==26.4", "pluggy==1.7.0", "pygments==2.21.0", "pytest==9.2.0"]
#: fixed (the env registry names the default file as a requirement)
LITE_CACHE = Path("~/.cache/rollhub/swe-lite").expanduser()
DEFAULT_TASKS = LITE_CACHE / "seed0" / "tasks.jsonl"
REPO_PREFIX = "rollhub/swe-lite"
SUITE_LOG = "/tmp/rollhub_lite_suite.log"


@dataclass
class BuildOptions:
    """What `rollhub swe lite build` makes; every count is a task count."""

    seed: int = 0
    train: int = 4000
    eval: int = 500
    pack_size: int = 500
    out: Path = DEFAULT_TASKS
    suite_timeout_s: float = 900.0

    def validate(self) -> None:
        if self.train < 0 or self.eval < 0 or self.train + self.eval == 0:
            raise ValueError("--train and --eval must be >= 0 and not both 0")
        if not 1 <= self.pack_size <= 2000:
            raise ValueError("--pack-size must be in 1..2000 (every agent step hashes the whole pack)")


def pack_name(split: str, pack: int) -> str:
    return f"{split}-p{pack:02d}"


def write_pack_repo(root: Path, specs: list[TaskSpec]) -> None:
    """The clean pack as a one-commit git repository (fixed identity and date)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    for spec in specs:
        folder = root / spec.folder
        folder.mkdir()
        (folder / "__init__.py").write_text("")
        (root / spec.module_path).write_text(spec.module_source(buggy=False))
        (root / spec.test_path).write_text(spec.test_source())
    git(root, "init", "-q")
    git(root, "add", "-A", ".")
    git(root, "commit", "-q", "-m", "Initial commit")


def bug_and_gold_patches(root: Path, specs: list[TaskSpec]) -> tuple[str, dict[str, str]]:
    """(the pack's bug patch: every task's bug; module path -> its gold patch)."""
    for spec in specs:
        (root / spec.module_path).write_text(spec.module_source(buggy=True))
    try:
        bug = git(root, "diff", "--no-color")
        gold = git(root, "diff", "-R", "--no-color", "--src-prefix=b/", "--dst-prefix=a/")
    finally:
        git(root, "checkout", "-q", "--", ".")
    sections: dict[str, str] = {}
    for part in gold.split("diff --git ")[1:]:
        path = part.split("\n", 1)[0].split(" ")[0][2:]
        sections[path] = "diff --git " + part
    return bug, sections


async def run_pack_suite(backend: SandboxBackend, image: str, timeout_s: float) -> tuple[dict[str, str], str]:
    """The whole pack's tests in a fresh container of `image`: (test id -> status, log)."""
    async with await backend.start(image, SUITE_LIMITS, labels={"rollhub.role": "swe-lite-build"}) as box:
        result = await box.exec(
            f"COLUMNS=300 timeout -k 5 {int(timeout_s)} {TEST_COMMAND} . > {SUITE_LOG} 2>&1; echo $?",
            timeout_s=timeout_s + 30,
            workdir=WORKDIR,
        )
        log = (await box.read_file(SUITE_LOG, max_bytes=256 << 20)).decode("utf-8", errors="replace")
    if result.timed_out or result.output.strip().endswith(("124", "137")):
        raise SandboxError(f"the pack suite in {image} timed out after {timeout_s:.0f} s")
    return parse_pytest_log(log), log


def problem_statement(spec: TaskSpec, failing: list[str], messages: dict[str, str], max_tests: int = 5) -> str:
    """The issue text: where the project is and which tests fail (never the diff)."""
    lines = [
        f"The project in `{WORKDIR}/{spec.folder}/` has a bug: some of its tests fail.",
        "",
        "Failing tests:" if len(failing) > 1 else "Failing test:",
    ]
    for test in failing[:max_tests]:
        message = messages.get(test, "")
        message = message if len(message) <= 200 else message[:197] + "..."
        lines.append(f"- `{test}`" + (f": {message}" if message else ""))
    if len(failing) > max_tests:
        lines.append(f"- ... and {len(failing) - max_tests} more")
    lines += [
        "",
        f"Fix the code in `{spec.module_path}` so that `python -m pytest {spec.test_path}` passes. "
        "The tests are correct; do not edit them. The other folders are other projects; leave them alone.",
    ]
    return "\n".join(lines)


def make_row(
    spec: TaskSpec,
    pack: str,
    image: str,
    base_commit: str,
    gold: str,
    statuses: dict[str, str],
    log: str,
) -> dict[str, Any] | None:
    """The swebench row of a verified task, or None when the run disagrees with the host."""
    ids = [spec.test_id(name) for name in spec.tests]
    failing = [t for t in ids if statuses.get(t) != "PASSED"]
    passing = [t for t in ids if statuses.get(t) == "PASSED"]
    if not failing or failing != spec.expected_failures or not passing:
        return None
    function = spec.target_function
    instance_id = f"swelite__{pack}-{spec.folder}"
    return {
        "instance_id": instance_id,
        "repo": f"{REPO_PREFIX}-{spec.split}",
        "base_commit": base_commit,
        "patch": gold,
        "test_patch": "",
        "problem_statement": problem_statement(spec, failing, failure_messages(log, failing)),
        "hints_text": "",
        "created_at": "2000-01-01T00:00:00Z",
        "version": "1.0",
        "environment_setup_commit": base_commit,
        "FAIL_TO_PASS": json.dumps(failing),
        "PASS_TO_PASS": json.dumps(passing),
        "image": image,
        "eval_script": pytest_eval_script(base_commit, [spec.test_path], "", TEST_COMMAND),
        "log_parser": DEFAULT_LOG_PARSER,
        "eval_type": "pass_and_fail",
        "rollhub": {
            "package": f"swe-lite-{pack}",
            "package_version": "1.0",
            "requirements": TEST_REQUIREMENTS,
            "mutation": {
                "file": spec.module_path,
                "function": function.name,
                "family": spec.bug.template,
                "line": spec.bug.lineno,
            },
            # the bug answers the tests' own literal calls unlike the gold (the failing tests
            # prove it), and those calls are among the oracle's inputs: the oracle applies
            "trust": TRUST_ORACLE,
            "lite": {
                "split": spec.split,
                "pack": pack,
                "folder": spec.folder,
                "function_family": function.family.id,
                "domain": function.family.domain,
                "bug_template": spec.bug.template,
                "bug_kind": kind_of(spec.bug.template),
                "lines": spec.lines,
                "functions": len(spec.functions),
                "tests": len(ids),
                "fail_to_pass": len(failing),
            },
        },
    }


async def build_pack(
    backend: SandboxBackend, client: Any, split: str, pack: int, specs: list[TaskSpec], options: BuildOptions
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Images and verified rows of one pack."""
    name = pack_name(split, pack)
    root = options.out.parent / "packs" / name
    record = options.out.parent / "packs" / f"{name}.json"
    digest = content_digest(specs)
    if record.is_file():  # a rerun after an interruption: a verified pack whose image still exists
        done = json.loads(record.read_text())
        if done["digest"] == digest and instance_image_current(client, done["summary"]["image"]):
            return done["rows"], done["summary"]
    write_pack_repo(root, specs)
    bug, golds = bug_and_gold_patches(root, specs)
    repo = SimpleNamespace(
        name=f"lite-{name}", version=digest, root=root, import_root="", requirements=TEST_REQUIREMENTS
    )
    clean = await asyncio.to_thread(build_package_image, client, repo)
    # the content digest in the tag: another seed, size or count never overwrites this pack's image
    image, base_commit = await build_instance_image(client, clean, f"swelite__{name}-{repo.version}", bug)
    clean_statuses, _ = await run_pack_suite(backend, clean, options.suite_timeout_s)
    buggy_statuses, log = await run_pack_suite(backend, image, options.suite_timeout_s)
    rows, dropped = [], 0
    for spec in specs:
        ids = [spec.test_id(t) for t in spec.tests]
        row = None
        if all(clean_statuses.get(t) == "PASSED" for t in ids):
            row = make_row(spec, name, image, base_commit, golds[spec.module_path], buggy_statuses, log)
        if row is None:
            dropped += 1
        else:
            rows.append(row)
    summary = {"pack": name, "image": image, "clean_image": clean, "tasks": len(rows), "dropped": dropped}
    record.write_text(json.dumps({"digest": digest, "summary": summary, "rows": rows}))
    logger.info("pack %s: %d tasks, %d dropped, image %s", name, len(rows), dropped, image)
    return rows, summary


async def build(backend: SandboxBackend, client: Any, options: BuildOptions) -> dict[str, Any]:
    """Generate, build and verify every pack; write the rows and `splits.json` beside them."""
    options.validate()
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    packs: list[dict[str, Any]] = []
    splits: dict[str, list[str]] = {s: [] for s in SPLITS}
    # the held-out split first; the file is rewritten after each pack, so a long build can be
    # checked on its first packs while it goes on, and a rerun resumes from the packs' records
    for split, count in (("eval", options.eval), ("train", options.train)):
        if count == 0:
            continue
        for pack, specs in enumerate(make_specs(split, count, options.seed, options.pack_size)):
            pack_rows, summary = await build_pack(backend, client, split, pack, specs, options)
            rows += pack_rows
            packs.append(summary)
            splits[split].append(f"swe-lite-{pack_name(split, pack)}")
            write_rows(options.out, rows)
            (options.out.parent / "splits.json").write_text(json.dumps(splits, indent=1) + "\n")
    return {
        "out": str(options.out),
        "seed": options.seed,
        "tasks": {s: sum(1 for r in rows if r["rollhub"]["lite"]["split"] == s) for s in SPLITS},
        "dropped": sum(p["dropped"] for p in packs),
        "images": 2 * len(packs),
        "packs": packs,
        "wall_s": round(time.monotonic() - started, 1),
    }
