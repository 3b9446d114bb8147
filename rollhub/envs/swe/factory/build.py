"""The offline task factory behind `rollhub swe make-tasks PACKAGE==VERSION` (SWE-smith style).

1. host: sdist + wheels (`package_repo`); 2. package image built with the network off
(`images`); 3. baseline suite twice in fresh containers, flaky tests dropped; 4. AST
mutants (`mutation`), bug patch = `git diff`, gold = its reverse; 5. each mutant
validated in a long-lived container per worker (apply, run the suite under a timeout,
reset): FAIL_TO_PASS = stable passers that now fail, PASS_TO_PASS = the rest; valid iff
both are non-empty, F2P stays under a fraction of the suite, nothing failed to collect
and the suite finished; 6. per-task image with squashed history; 7. swebench 5.x rows with
a problem statement written from the failing tests' names and messages (never the diff),
and `trust` (`oracle.survey_trust`: whether the differential oracle grades the task too);
8. the red team (`redteam`): the gold patch must score 1 through an episode and no forging
attempt may score, else the task is rejected with the reason.

Work is cached under `~/.cache/rollhub/swe/<package>-<version>/` (baseline, one line per
validated candidate, built images), so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.swe.factory.images import build_instance_image, build_package_image, instance_image_current
from rollhub.envs.swe.factory.mutation import FAMILIES, Mutation, find_mutations
from rollhub.envs.swe.factory.package_repo import (
    CACHE_DIR,
    PackageRepo,
    git,
    normalize_name,
    pin_requirements,
    prepare_package,
)
from rollhub.envs.swe.grading.oracle import survey_trust
from rollhub.envs.swe.grading.verdict import parse_pytest_log
from rollhub.envs.swe.redteam import redteam_task
from rollhub.envs.swe.tasks import DEFAULT_LOG_PARSER, WORKDIR, SweTask, pytest_eval_script
from rollhub.sandbox.base import Limits, Sandbox, SandboxBackend, SandboxError

logger = logging.getLogger(__name__)

TEST_COMMAND = "python -m pytest -rA --tb=no -p no:cacheprovider -o addopts='' -o console_output_style=classic"
SUITE_LOG = "/tmp/rollhub_suite.log"
SUITE_LIMITS = Limits(cpus=1.0, memory_mb=1024, pids=512)
_COLLECTION_TROUBLE = re.compile(r"errors? during collection|ERROR collecting|Interrupted: |INTERNALERROR|no tests ran")
_FAILURE_LINE = re.compile(r"^(FAILED|ERROR) (\S.*?)(?: - (.*))?$", re.M)


@dataclass
class FactoryOptions:
    max_tasks: int | None = None
    workers: int = 2
    max_fail_fraction: float = 0.5
    min_timeout_s: float = 30.0
    timeout_factor: float = 10.0
    families: tuple[str, ...] = FAMILIES
    one_per_function: bool = True
    test_requirements: list[str] = field(default_factory=list)
    cache_dir: Path = CACHE_DIR
    seed: int = 0
    #: the library's doctests join the suite (`--doctest-modules` over the modules that have
    #: examples), and only those modules are mutated: tasks whose tests include doctests of the
    #: very module that holds the fix
    doctests: bool = False

    def validate(self) -> None:
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ValueError("max must be >= 1")
        if not 0 < self.max_fail_fraction <= 1:
            raise ValueError("max_fail_fraction must be in (0, 1]")
        if unknown := set(self.families) - set(FAMILIES):
            raise ValueError(f"unknown mutation families {sorted(unknown)}; known: {', '.join(FAMILIES)}")


@dataclass
class Candidate:
    key: str
    file: str
    function: str
    family: str
    line: int
    bug_patch: str
    gold_patch: str


@dataclass
class SuiteRun:
    statuses: dict[str, str]
    log: str
    duration_s: float
    timed_out: bool

    @property
    def passed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s == "PASSED"}

    @property
    def collection_trouble(self) -> bool:
        return bool(_COLLECTION_TROUBLE.search(self.log))


# ---------------------------------------------------------------------- running the suite
def suite_command(repo: PackageRepo) -> str:
    return TEST_COMMAND + (" --doctest-modules" if repo.doctest_modules else "")


def _mode(repo: PackageRepo) -> str:
    """Cache-file suffix of the suite's shape (plain tests, or tests and doctests)."""
    return "-doctest" if repo.doctest_modules else ""


async def run_suite(box: Sandbox, repo: PackageRepo, timeout_s: float) -> SuiteRun:
    targets = " ".join(repo.suite_targets)
    started = time.monotonic()
    result = await box.exec(
        f"COLUMNS=300 timeout -k 5 {int(timeout_s)} {suite_command(repo)} {targets} > {SUITE_LOG} 2>&1; echo $?",
        timeout_s=timeout_s + 30,
        workdir=WORKDIR,
    )
    duration = time.monotonic() - started
    # a suite log is our own test run's output, so it may exceed the policy-facing read cap
    log = (await box.read_file(SUITE_LOG, max_bytes=256 << 20)).decode("utf-8", errors="replace")
    timed_out = result.timed_out or result.output.strip().endswith("124") or result.output.strip().endswith("137")
    return SuiteRun(parse_pytest_log(log), log, duration, timed_out)


async def baseline(backend: SandboxBackend, image: str, repo: PackageRepo, work: Path) -> tuple[list[str], float]:
    """Tests that pass in two runs in fresh containers (flaky ones dropped), and the slower time."""
    cache = work / f"baseline{_mode(repo)}.json"
    if cache.exists():
        data = json.loads(cache.read_text())
        if data.get("image") == image:
            return data["stable"], data["duration_s"]
    runs = []
    for _ in range(2):
        async with await backend.start(image, SUITE_LIMITS, labels={"rollhub.role": "swe-factory"}) as box:
            runs.append(await run_suite(box, repo, timeout_s=900))
    if any(r.timed_out or r.collection_trouble for r in runs) or not runs[0].passed:
        raise SandboxError(
            f"the baseline suite of {repo.name}=={repo.version} does not run cleanly:\n{runs[0].log[-1500:]}"
        )
    stable = sorted(runs[0].passed & runs[1].passed)
    flaky = len(runs[0].passed ^ runs[1].passed)
    logger.info(
        "baseline %s: %d stable passing tests, %d flaky dropped, %.1f s",
        repo.slug,
        len(stable),
        flaky,
        max(r.duration_s for r in runs),
    )
    duration = max(r.duration_s for r in runs)
    cache.write_text(json.dumps({"image": image, "stable": stable, "duration_s": duration, "flaky_dropped": flaky}))
    return stable, duration


# ---------------------------------------------------------------------- candidates
def make_candidates(repo: PackageRepo, options: FactoryOptions) -> list[Candidate]:
    """Every mutant as a (bug, gold) patch pair, made with git in the host repo."""
    candidates = []
    for rel in repo.source_files:
        path = repo.root / rel
        original = path.read_text(encoding="utf-8")
        for mutation in find_mutations(rel, original, options.families):
            try:
                path.write_text(mutation.new_source, encoding="utf-8")
                bug = git(repo.root, "diff", "--no-color", "--", rel)
                gold = git(repo.root, "diff", "-R", "--no-color", "--src-prefix=b/", "--dst-prefix=a/", "--", rel)
            finally:
                path.write_text(original, encoding="utf-8")
            if bug.strip():
                candidates.append(_candidate(mutation, bug, gold))
    order = random.Random(options.seed)
    order.shuffle(candidates)
    return candidates


def _candidate(m: Mutation, bug: str, gold: str) -> Candidate:
    return Candidate(m.key, m.path, m.function, m.family, m.lineno, bug, gold)


def failure_messages(log: str, tests: list[str]) -> dict[str, str]:
    """Test id -> the one-line message pytest printed for it (may be empty)."""
    wanted = set(tests)
    messages = {}
    for match in _FAILURE_LINE.finditer(log):
        test = match.group(2).strip()
        if test in wanted:
            messages[test] = (match.group(3) or "").strip()
    return messages


def problem_statement(package: str, fail_to_pass: list[str], messages: dict[str, str], max_tests: int = 5) -> str:
    """A neutral issue text from the failing tests' names and messages (never from the diff)."""
    shown = fail_to_pass[:max_tests]
    lines = [
        f"Some tests of `{package}` fail on the current code.",
        "",
        "Failing tests:" if len(fail_to_pass) > 1 else "Failing test:",
    ]
    for test in shown:
        message = messages.get(test, "")
        message = message if len(message) <= 200 else message[:197] + "..."
        lines.append(f"- `{test}`" + (f": {message}" if message else ""))
    if len(fail_to_pass) > len(shown):
        lines.append(f"- ... and {len(fail_to_pass) - len(shown)} more")
    lines += [
        "",
        (
            f"Find the cause in the library code of `{package}` and fix it so that these tests pass "
            "without breaking the others. The tests themselves are correct; do not edit them."
        ),
    ]
    return "\n".join(lines)


def instance_id_for(repo: PackageRepo, key: str) -> str:
    name = normalize_name(repo.name).replace("-", "_")
    key = key + _mode(repo)  # the same mutant with doctests in its suite is another task
    return f"{name}__{name}-{repo.version}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


# ---------------------------------------------------------------------- validation
async def _validate_worker(
    backend: SandboxBackend,
    image: str,
    repo: PackageRepo,
    stable: list[str],
    timeout_s: float,
    queue: asyncio.Queue,
    results_file: Path,
    accept: Any,
    progress: Any,
) -> None:
    box: Sandbox | None = None
    try:
        while True:
            candidate: Candidate | None = await queue.get()
            if candidate is None or accept.done():
                return
            if box is None:
                box = await backend.start(image, SUITE_LIMITS, labels={"rollhub.role": "swe-factory"})
            record = await _validate_one(box, repo, stable, timeout_s, candidate)
            if record["status"] == "infra":
                await box.close()
                box = None
            with open(results_file, "a") as f:
                f.write(json.dumps(record) + "\n")
            accept.offer(candidate, record)
            progress.update(1)
    finally:
        if box is not None:
            await box.close()


async def _validate_one(
    box: Sandbox, repo: PackageRepo, stable: list[str], timeout_s: float, candidate: Candidate
) -> dict[str, Any]:
    record: dict[str, Any] = {"key": candidate.key}
    try:
        await box.write_file("/tmp/bug.diff", candidate.bug_patch)
        applied = await box.exec("git apply /tmp/bug.diff", timeout_s=60, workdir=WORKDIR)
        if applied.exit_code != 0:
            return {**record, "status": "apply_failed"}
        run = await run_suite(box, repo, timeout_s)
        reset = await box.exec("git checkout -q -- . && git clean -fdq", timeout_s=60, workdir=WORKDIR)
        if reset.exit_code != 0:
            return {**record, "status": "infra", "reason": "reset failed"}
    except SandboxError as exc:
        return {**record, "status": "infra", "reason": str(exc)[:300]}
    record["duration_s"] = round(run.duration_s, 3)
    if run.timed_out:
        return {**record, "status": "timeout"}
    if run.collection_trouble:
        return {**record, "status": "collection_error"}
    passed = run.passed
    fail_to_pass = [t for t in stable if t not in passed]
    pass_to_pass = [t for t in stable if t in passed]
    record.update(
        fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, messages=failure_messages(run.log, fail_to_pass)
    )
    if not fail_to_pass:
        return {**record, "status": "no_failure"}
    if not pass_to_pass:
        return {**record, "status": "everything_fails"}
    return {**record, "status": "valid"}


class _Acceptance:
    """Keeps valid candidates (one per function if asked) until `max_tasks` are found."""

    def __init__(self, options: FactoryOptions, suite_size: int):
        self.options = options
        self.suite_size = suite_size
        self.accepted: list[tuple[Candidate, dict[str, Any]]] = []
        self._functions: set[tuple[str, str]] = set()
        self.rejected: dict[str, int] = {}
        self.seen = 0

    def offer(self, candidate: Candidate, record: dict[str, Any]) -> None:
        self.seen += 1
        status = record["status"]
        if status == "valid" and len(record["fail_to_pass"]) > self.options.max_fail_fraction * self.suite_size:
            status = "too_many_failures"
        if (
            status == "valid"
            and self.options.one_per_function
            and (candidate.file, candidate.function) in self._functions
        ):
            status = "duplicate_function"
        if status == "valid" and self.done():
            status = "surplus"
        if status != "valid":
            self.rejected[status] = self.rejected.get(status, 0) + 1
            return
        self._functions.add((candidate.file, candidate.function))
        self.accepted.append((candidate, record))

    def done(self) -> bool:
        return self.options.max_tasks is not None and len(self.accepted) >= self.options.max_tasks


# ---------------------------------------------------------------------- rows
def make_row(
    repo: PackageRepo, candidate: Candidate, record: dict[str, Any], image: str, base_commit: str
) -> dict[str, Any]:
    instance_id = instance_id_for(repo, candidate.key)
    f2p, p2p = record["fail_to_pass"], record["pass_to_pass"]
    return {
        "instance_id": instance_id,
        "repo": f"pypi/{normalize_name(repo.name)}",
        "base_commit": base_commit,
        "patch": candidate.gold_patch,
        "test_patch": "",
        "problem_statement": problem_statement(repo.name, f2p, record.get("messages", {})),
        "hints_text": "",
        "created_at": "2000-01-01T00:00:00Z",
        "version": repo.version,
        "environment_setup_commit": base_commit,
        "FAIL_TO_PASS": json.dumps(f2p),
        "PASS_TO_PASS": json.dumps(p2p),
        "image": image,
        # test files are reset to the base commit; doctest modules are run, never reset (they hold the fix)
        "eval_script": pytest_eval_script(
            base_commit, repo.test_targets, "", suite_command(repo), test_targets=repo.suite_targets
        ),
        "log_parser": DEFAULT_LOG_PARSER,
        "eval_type": "pass_and_fail",
        # provenance for `rollhub swe build-images` (not shown to the agent)
        "rollhub": {
            "package": repo.name,
            "package_version": repo.version,
            "requirements": repo.requirements,
            **({"doctest_modules": repo.doctest_modules} if repo.doctest_modules else {}),
            "mutation": {
                "file": candidate.file,
                "function": candidate.function,
                "family": candidate.family,
                "line": candidate.line,
            },
        },
    }


async def make_tasks(
    requirement: str,
    backend: SandboxBackend,
    client: Any,
    options: FactoryOptions,
    *,
    finished: dict[str, dict[str, Any]] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the whole recipe for one PACKAGE==VERSION; returns (rows, summary).

    `on_row` receives each task as soon as it passed the red team (the CLI writes it to the
    output file then), and `finished` (instance id -> row, e.g. that file's rows) skips tasks
    an interrupted run already finished whose image still exists: image builds and the red
    team are the slow part, so a rerun resumes them too."""
    from tqdm import tqdm

    options.validate()
    started = time.monotonic()
    repo = prepare_package(requirement, options.cache_dir, options.test_requirements)
    repo.requirements = pin_requirements(repo.requirements, options.cache_dir)
    if options.doctests:
        if not repo.use_doctests():
            raise UserError(f"no library module of {repo.name}=={repo.version} has doctest examples")
        repo.source_files = list(repo.doctest_modules)
    work = options.cache_dir / repo.slug
    image = await asyncio.to_thread(build_package_image, client, repo)
    stable, baseline_s = await baseline(backend, image, repo, work)
    timeout_s = max(options.min_timeout_s, options.timeout_factor * baseline_s)
    candidates = make_candidates(repo, options)
    accept = _Acceptance(options, len(stable))

    results_file = work / f"validated-{hashlib.sha256((image + _mode(repo)).encode()).hexdigest()[:12]}.jsonl"
    done: dict[str, dict[str, Any]] = {}
    if results_file.exists():
        for line in results_file.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                done[record["key"]] = record
    by_key = {c.key: c for c in candidates}
    for key, record in done.items():
        if key in by_key and record["status"] != "infra":
            accept.offer(by_key[key], record)
    todo = [c for c in candidates if c.key not in done or done[c.key]["status"] == "infra"]
    if not accept.done() and todo:
        queue: asyncio.Queue = asyncio.Queue()
        for candidate in todo:
            queue.put_nowait(candidate)
        workers = min(options.workers, len(todo))
        for _ in range(workers):
            queue.put_nowait(None)
        with tqdm(total=len(todo), desc=f"validate {repo.slug}", unit="mutant") as progress:
            await asyncio.gather(
                *[
                    _validate_worker(backend, image, repo, stable, timeout_s, queue, results_file, accept, progress)
                    for _ in range(workers)
                ]
            )

    rows = []
    gold_failed = 0
    forgeable: dict[str, str] = {}
    finished = finished or {}
    for candidate, record in tqdm(accept.accepted, desc=f"task images {repo.slug}", unit="task"):
        instance_id = instance_id_for(repo, candidate.key)
        done_row = finished.get(instance_id)
        if done_row is not None and instance_image_current(client, done_row["image"]):
            rows.append(done_row)
            continue
        tag, base_commit = await build_instance_image(client, image, instance_id, candidate.bug_patch)
        row = make_row(repo, candidate, record, tag, base_commit)
        # whether the differential oracle can grade it (a module-level function it tells from the bug)
        row["rollhub"]["trust"] = (await survey_trust(backend, SweTask.from_row(row)))["trust"]
        # the last gate, the red team: the gold patch, applied by the expert in an episode, must
        # resolve the task in its own image, and no forging attempt may score (`redteam`)
        report = await redteam_task(backend, SweTask.from_row(row), eval_timeout_s=timeout_s + 60)
        if not report.ok:
            logger.warning("dropping %s: %s", instance_id, report.reason())
            if report.gold_reward != 1.0:
                gold_failed += 1
            else:
                forgeable[instance_id] = report.reason()
            client.images.remove(tag, force=True)
            continue
        rows.append(row)
        if on_row is not None:
            on_row(row)
    summary = {
        "package": f"{repo.name}=={repo.version}",
        "package_image": image,
        "suite_tests": len(stable),
        "baseline_s": round(baseline_s, 2),
        "candidates": len(candidates),
        "validated": accept.seen,
        "valid_tasks": len(rows),
        "gold_check_failed": gold_failed,
        "rejected_forgeable": forgeable,
        "rejected": accept.rejected,
        "wall_s": round(time.monotonic() - started, 1),
    }
    return rows, summary


async def build_images(
    rows: list[dict[str, Any]],
    backend: SandboxBackend,
    client: Any,
    *,
    force: bool = False,
    cache_dir: Path = CACHE_DIR,
) -> dict[str, Any]:
    """Rebuild the images of factory rows (package image, then each missing task layer) and
    check that each rebuilt history has the row's base_commit."""
    from tqdm import tqdm

    built, present, mismatched = 0, 0, []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        meta = row.get("rollhub")
        if not meta:
            raise ValueError(
                f"row {row['instance_id']} was not made by `rollhub swe make-tasks`; "
                f"its image must come from a registry ({row.get('image')})"
            )
        groups.setdefault((meta["package"], meta["package_version"]), []).append(row)
    for (name, version), group in groups.items():
        missing = [r for r in group if force or not instance_image_current(client, r["image"])]
        present += len(group) - len(missing)
        if not missing:
            continue
        repo = prepare_package(f"{name}=={version}", cache_dir)
        repo.requirements = list(group[0]["rollhub"]["requirements"])  # pinned at make-tasks time
        image = await asyncio.to_thread(build_package_image, client, repo)
        for row in tqdm(missing, desc=f"task images {repo.slug}", unit="task"):
            bug = _reverse(repo, row["patch"])
            expected = row["image"]
            tag, base_commit = await build_instance_image(client, image, row["instance_id"], bug)
            if tag != expected:
                client.api.tag(tag, *expected.rsplit(":", 1))
            if base_commit != row["base_commit"]:
                mismatched.append(row["instance_id"])
            built += 1
    return {"built": built, "already_present": present, "base_commit_mismatch": mismatched}


def _reverse(repo: PackageRepo, gold_patch: str) -> str:
    """The bug patch from a gold patch, checked against the pristine repo on the host."""
    git(repo.root, "apply", "--check", "-R", "-", input_text=gold_patch)
    git(repo.root, "apply", "-R", "-", input_text=gold_patch)
    try:
        return git(repo.root, "diff", "--no-color")
    finally:
        git(repo.root, "checkout", "-q", "--", ".")
