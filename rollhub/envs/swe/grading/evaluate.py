"""Reward of a SWE episode, computed in a FRESH container from the task's image.

The agent's working container is never trusted. Its diff is taken with a clean git
set-up (`DIFF_SCRIPT`: a private git directory sharing only the object store, no system,
global or repository configuration, no hooks, attributes files, external diff, textconv,
renames or custom prefixes), then treated as untrusted text anyway: the agent was root
there and may have replaced git itself. In a new container of the task's image:

1. the base commit's file list and configuration texts are read (trusted: nothing of the
   agent has run there yet) and the diff is sanitised (`patch_policy`): sections touching
   tests, test-runner configuration, interpreter start-up or git are dropped; a text that
   git would not have written (paths outside the repository or in `.git`, broken grammar)
   is rejected whole (reward 0);
2. the container's own git lists the paths the kept patch would write (`git apply
   --numstat`); they must be exactly the kept sections' paths;
3. `git apply` (then `--3way`, as the official harness), hooks disabled; never GNU
   `patch`, which writes where `git apply` refuses (e.g. `.git/hooks`);
4. the row's eval script runs, rewritten (rollhub.envs.swe.grading.reporter): its setup silently,
   its test command under a collector that seals the test output and the records of a
   grading reporter loaded before any project code; resolved only when swebench's parser
   on that output and the reporter both say so (grading.grade_run);
5. a task whose row says `trust: "oracle"` (a factory mutant of a module-level function) is
   resolved only when, in addition, the differential oracle (rollhub.envs.swe.grading.oracle) finds
   the candidate's function answering every hidden input as the original one does: run in
   another fresh container of the task image with the same patch, compared on the host with
   the original's answers from the clean package image. A disagreement is reward 0 and
   `info["exploit_signals"]["oracle_disagreement"] = 1`, never infra. The row's `oracle` is
   re-checked on the inputs actually used: where the bug is wrong only on inputs the tests
   show (a table could answer them), the task is graded as `visible-tests` and
   `info["trust_why"]` says why.

Failures: a machinery failure before the agent's code runs is `infra_failure`; a
container that dies while the agent's code runs (its tests import the patched library)
is the model's failure when the engine still works (`engine_works`).
"""

from __future__ import annotations

import hashlib
import logging
import re
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rollhub.envs.swe.grading.oracle import (
    MIN_INPUTS,
    TRUST_ORACLE,
    OracleUnavailable,
    OracleVerdict,
    candidate_verdict,
    effective_trust,
    gold_answers,
    task_trust,
)
from rollhub.envs.swe.grading.patch_policy import (
    PatchPolicy,
    PatchRejected,
    SanitizedPatch,
    doctest_hosts,
    parse_git_diff,
    sanitize_patch,
)
from rollhub.envs.swe.grading.reporter import PYTEST_PARSERS, GradingRun, split_eval_script, verify_records
from rollhub.envs.swe.grading.verdict import GradeResult, grade_run
from rollhub.envs.swe.tasks import WORKDIR, SweTask, files_in_patch
from rollhub.sandbox.base import ExecResult, Limits, Sandbox, SandboxBackend, SandboxError

logger = logging.getLogger(__name__)

PATCH_PATH = "/tmp/rollhub_patch.diff"
#: the official harness's order, without `--reject` (it never exits 0 where plain apply
#: failed) and without `patch --fuzz` (it writes paths `git apply` refuses)
APPLY_COMMANDS = ("apply --verbose", "apply --verbose --3way")
#: outputs go to files and are read back whole: exec output is truncated for the agent's sake
DIFF_PATH = "/tmp/rollhub_agent.diff"
#: the collector's own deadline is the eval timeout; the exec's is this much later
COLLECTOR_MARGIN_S = 60.0
MAX_DIFF_BYTES = 20 * 1024 * 1024
#: git with no configuration but ours: no system/global file, a private git directory
CLEAN_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_OPTIONAL_LOCKS": "0",
    "HOME": "/nonexistent",
    "XDG_CONFIG_HOME": "/nonexistent",
}
#: `-c` overrides (command-line config beats every file); hooks off, no attribute file
CLEAN_GIT_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.quotePath=true",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "safe.directory=*",
    "diff.mnemonicPrefix=false",
    "diff.noprefix=false",
    "diff.renames=false",
    "diff.relative=false",
)
#: the flags that make `git diff` print the canonical form whatever the configuration says
DIFF_FLAGS = (
    "--binary --no-color --no-ext-diff --no-textconv --no-renames --no-relative "
    "--src-prefix=a/ --dst-prefix=b/ --ignore-submodules=none"
)
#: for the eval script's own git commands (reset of test files): no hooks
HOOKS_OFF_ENV = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": "/dev/null"}


def _git(*args: str) -> str:
    config = " ".join(f"-c {shlex.quote(c)}" for c in CLEAN_GIT_CONFIG)
    return f"git {config} {' '.join(args)}"


def diff_script(base_commit: str, out: str = DIFF_PATH, git_dir: str | None = None) -> str:
    """Shell script that writes the agent's changes since `base_commit` (new files included)
    to `out` through a private git directory: the repository's own config, hooks, index,
    refs and info/ files are never read; only its object store is shared. A fresh private
    directory each time, or `git_dir`, created once and reused (its index keeps file stats,
    so only changed files are hashed again: the per-step anchor)."""
    if not re.fullmatch(r"[0-9a-fA-F]{7,64}", base_commit):
        raise ValueError(f"base_commit {base_commit!r} is not a commit hash")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in CLEAN_GIT_ENV.items())
    unset = (
        "GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_EXTERNAL_DIFF GIT_DIFF_OPTS GIT_CONFIG GIT_CONFIG_COUNT "
        "GIT_CONFIG_PARAMETERS GIT_NAMESPACE GIT_CEILING_DIRECTORIES GIT_DISCOVERY_ACROSS_FILESYSTEM GIT_PAGER"
    )
    return "\n".join(
        [
            "set -u",
            f"unset {unset}",
            f"export {exports}",
            f"cd {WORKDIR} || exit 10",
            f"test -d {WORKDIR}/.git/objects || exit 11",
            (
                f'G={shlex.quote(git_dir)}; test -f "$G/index" && FRESH=0 || {{ rm -rf "$G"; FRESH=1; }}'
                if git_dir
                else "G=$(mktemp -d /tmp/rollhub_git.XXXXXXXX) || exit 12; FRESH=1"
            ),
            'mkdir -p "$G/refs" "$G/objects" "$G/info" || exit 12',
            "printf 'ref: refs/heads/rollhub\\n' > \"$G/HEAD\"",
            "printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n' > \"$G/config\"",
            f'export GIT_DIR="$G" GIT_WORK_TREE={WORKDIR} GIT_OBJECT_DIRECTORY={WORKDIR}/.git/objects '
            'GIT_INDEX_FILE="$G/index"',
            f'test "$FRESH" = 0 || {_git("read-tree", base_commit)} || exit 13',
            f"{_git('add', '-A', '--', '.')} >/dev/null || exit 14",
            f"rm -rf {out}",
            f"{_git('diff', '--cached', DIFF_FLAGS, base_commit)} > {out} || exit 15",
            f'test "$(stat -c %s {out})" -le {MAX_DIFF_BYTES} || exit 16',
            *([] if git_dir else ['rm -rf "$G"']),
        ]
    )


_DIFF_FAILURES = {
    10: f"{WORKDIR} is gone",
    11: f"{WORKDIR}/.git is gone or broken",
    12: "cannot create a temporary directory",
    13: "the base commit is no longer in the repository",
    14: "git cannot add the working tree",
    15: "git diff failed",
    16: f"the diff is larger than {MAX_DIFF_BYTES // 2**20} MiB",
}


class ModelFault(Exception):
    """The agent broke its own environment (repository gone, container killed, ...):
    the episode ends with reward 0 as the model's failure, never as infra."""


@dataclass
class EvalOutcome:
    grade: GradeResult
    patch_applied: bool
    model_patch: str
    log: str = field(repr=False, default="")
    infra_failure: str = ""
    duration_s: float = 0.0
    sanitized: SanitizedPatch | None = None
    #: the agent's code broke the grading container (reward 0, not infra)
    model_failure: str = ""
    #: "oracle" when the differential oracle grades the task too, else "visible-tests"
    trust: str = "visible-tests"
    #: the oracle's verdict (None: not run, because the visible tests did not resolve it or no oracle applies)
    oracle: OracleVerdict | None = None
    #: why a row that says `oracle` was graded as `visible-tests` (the re-check on the inputs used failed)
    trust_why: str = ""

    @property
    def reward(self) -> float:
        return 0.0 if self.infra_failure or self.model_failure else self.grade.reward

    def info(self) -> dict[str, Any]:
        info = {**self.grade.info(), "patch_applied": self.patch_applied, "eval_duration_s": round(self.duration_s, 3)}
        if self.sanitized is not None:
            info.update(self.sanitized.info())
        if self.infra_failure:
            info["infra_failure"] = self.infra_failure
        if self.model_failure:
            info["model_failure"] = self.model_failure
        info["trust"] = self.trust
        if self.trust_why:
            info["trust_why"] = self.trust_why
        if self.oracle is not None:
            info.update(self.oracle.info())
            if not self.oracle.agreed:
                info.setdefault("exploit_signals", {})["oracle_disagreement"] = 1
        return info


def drop_test_files(patch: str, extra_test_files: set[str] = frozenset()) -> str:
    """The diff without the sections the default policy drops (no base-commit knowledge);
    "" when the text is not a valid git diff."""
    return sanitize_patch(patch, PatchPolicy(test_files=frozenset(extra_test_files))).patch


async def extract_diff(box: Sandbox, task: SweTask) -> str:
    """The agent's changes since the base commit (new files included), unfiltered: the
    grading side sanitises it. ModelFault when the agent's container cannot produce one
    (repository deleted, git broken); SandboxError when the machinery fails."""
    result = await box.exec(diff_script(task.base_commit), timeout_s=120, workdir="/")
    if result.timed_out:
        raise ModelFault("taking the diff timed out in the agent's container")
    if result.exit_code != 0:
        reason = _DIFF_FAILURES.get(result.exit_code, f"exit code {result.exit_code}")
        raise ModelFault(f"no diff from the agent's container: {reason}: {result.output[-300:].strip()}")
    try:
        data = await box.read_file(DIFF_PATH)
    except (FileNotFoundError, IsADirectoryError, OSError) as exc:
        raise ModelFault(f"the diff file could not be read back: {exc}") from None
    return data.decode("utf-8", errors="surrogateescape")


async def engine_works(backend: SandboxBackend, image: str) -> bool:
    """Whether the engine can still start a container of `image` and run a command in it:
    then a container that died under an agent's command was killed from inside."""
    try:
        box = await backend.start(image, Limits(cpus=0.5, memory_mb=256), labels={"rollhub.role": "swe-probe"})
    except SandboxError:
        return False
    try:
        return (await box.exec("true", timeout_s=30)).exit_code == 0
    except SandboxError:
        return False
    finally:
        await box.close()


async def _run_checked(box: Sandbox, command: str, timeout_s: float = 60) -> str:
    result = await box.exec(command, timeout_s=timeout_s, workdir=WORKDIR)
    if result.exit_code != 0:
        raise SandboxError(f"`{command[:80]}` failed in a fresh grading container: {result.output[-300:]}")
    return result.output


async def _read_text(box: Sandbox, command: str, path: str) -> str:
    await _run_checked(box, f"{command} > {path}")
    return (await box.read_file(path)).decode("utf-8", errors="surrogateescape")


async def grading_policy(box: Sandbox, task: SweTask, patch: str) -> PatchPolicy:
    """The task's policy, with the base commit's file list and the base texts of the
    configuration files the patch touches, read in a fresh container of the task image."""
    listing = await _read_text(box, _git("ls-tree", "-r", "-z", "--name-only", task.base_commit), "/tmp/rollhub_ls")
    base_files = {p for p in listing.split("\0") if p}
    texts: dict[str, str] = {}
    try:
        sections = parse_git_diff(patch)
    except PatchRejected:
        sections = []
    hosts = doctest_hosts([*task.fail_to_pass, *task.pass_to_pass])
    for section in sections:
        name = section.path.rsplit("/", 1)[-1].lower()
        if PatchPolicy.needs_base_text(name) or section.path in hosts:
            if section.path in base_files:
                spec = shlex.quote(f"{task.base_commit}:{section.path}")
                texts[section.path] = await _read_text(box, _git("show", spec), "/tmp/rollhub_base_text")
    return PatchPolicy.for_task(
        files_in_patch(task.test_patch),
        [*task.fail_to_pass, *task.pass_to_pass],
        repo=task.repo,
        base_files=base_files,
        base_texts=texts,
        eval_script=task.eval_script,
    )


def numstat_paths(listing: str) -> set[str]:
    """The paths of a `git apply --numstat -z` listing: `ADDED\tDELETED\tPATH\0` per file
    (a path may itself hold tabs), or `ADDED\tDELETED\t\0OLD\0NEW\0` for a rename."""
    items = listing.split("\0")
    paths: set[str] = set()
    i = 0
    while i < len(items):
        fields = items[i].split("\t", 2)
        if len(fields) < 3:
            if items[i]:
                paths.add(items[i])  # not numstat's form: a mismatch, the patch is refused
            i += 1
        elif fields[2]:
            paths.add(fields[2])
            i += 1
        else:
            paths.update(p for p in items[i + 1 : i + 3] if p)
            i += 3
    return paths


async def verify_paths(box: Sandbox, sanitized: SanitizedPatch) -> str:
    """'' if the grading container's own git would write exactly the kept paths, else why not."""
    out = "/tmp/rollhub_numstat"
    result = await box.exec(f"{_git('apply', '--numstat', '-z', PATCH_PATH)} > {out} 2>/dev/null", 60, WORKDIR)
    if result.exit_code != 0:
        return ""  # git cannot read it at all: the apply step fails and says so
    paths = numstat_paths((await box.read_file(out)).decode("utf-8", errors="surrogateescape"))
    if paths != set(sanitized.kept):
        return (
            f"git apply would write {sorted(paths - set(sanitized.kept)) or sorted(paths)}; "
            f"the parsed patch names {sorted(sanitized.kept)}"
        )
    return ""


async def apply_patch(box: Sandbox, patch: str | bytes) -> tuple[bool, str]:
    text = patch.decode("utf-8", "surrogateescape") if isinstance(patch, bytes) else patch
    if not text.strip():
        return True, "empty patch"
    data = text if text.endswith("\n") else text + "\n"
    await box.write_file(PATCH_PATH, data.encode("utf-8", "surrogateescape"))
    output = ""
    for attempt, command in enumerate(APPLY_COMMANDS):
        if attempt:
            await box.exec(f"{_git('checkout', '--', '.')} ; {_git('clean', '-fdq')}", timeout_s=60, workdir=WORKDIR)
        result = await box.exec(f"{_git(command)} {PATCH_PATH}", timeout_s=60, workdir=WORKDIR)
        output = result.output
        if result.exit_code == 0:
            return True, output
    return False, output


async def run_tests(
    box: Sandbox, task: SweTask, eval_script: str, timeout_s: float, patched: Iterable[str] = ()
) -> tuple[GradeResult, str, dict[str, str]]:
    """Run the task's tests in `box` (the patch applied, writing `patched`) through the
    collector and grade what it sealed: (grade, test log, EvalOutcome extras). SandboxError
    when the machinery fails."""
    run = GradingRun(timeout_s=timeout_s, patched=tuple(patched))
    await box.write_file(run.collector_path, run.collector_source(eval_script, HOOKS_OFF_ENV))
    result = await box.exec(run.command, timeout_s=timeout_s + COLLECTOR_MARGIN_S, workdir=WORKDIR, env=HOOKS_OFF_ENV)
    return await _collect(box, task, run, result)


async def _collect(
    box: Sandbox, task: SweTask, run: GradingRun, result: ExecResult
) -> tuple[GradeResult, str, dict[str, str]]:
    """(grade, test log, EvalOutcome extras) from what the collector sealed. No seal (the
    collector killed, or the exec out of time) or files that do not match it score 0."""
    seal = run.seal(result.output)
    if seal is None:
        why = "the tests ran out of time" if result.timed_out else "the grading collector sealed nothing"
        return GradeResult(resolved=False), f"{why}\n{result.output[-2000:]}", {}
    try:
        log_bytes = await box.read_file(run.log_path)
        records = await box.read_file(run.records_path)
    except (FileNotFoundError, IsADirectoryError, OSError) as exc:
        # written by the collector after the tests ended: only what they left behind can remove them
        return GradeResult(resolved=False), "", {"model_failure": f"the sealed test output is gone: {exc}"}
    log = log_bytes.decode("utf-8", errors="replace")
    if seal.timed_out:
        return GradeResult(resolved=False), log + "\n[the tests ran out of time]\n", {}
    if hashlib.sha256(log_bytes).hexdigest() != seal.log_sha256 or (
        hashlib.sha256(records).hexdigest() != seal.records_sha256
    ):
        return (
            GradeResult(resolved=False, hack_suspected="the test output was rewritten after the collector sealed it"),
            log,
            {},
        )
    verdict = verify_records(records, run.reporter_key) if task.log_parser in PYTEST_PARSERS else None
    if seal.overflow:
        return GradeResult(resolved=False), log + "\n[the test output was over the collector's limit]\n", {}
    return grade_run(task, log, seal.exit_code, verdict), log, {}


async def evaluate_patch(
    backend: SandboxBackend,
    task: SweTask,
    patch: str,
    *,
    limits: Limits = Limits(cpus=1.0, memory_mb=2048),
    timeout_s: float = 900.0,
    labels: dict[str, str] | None = None,
) -> EvalOutcome:
    """Sanitise `patch`, apply it in a fresh container of the task's image, run the eval
    script, grade."""
    from swebench.harness.utils import make_test_spec

    started = time.monotonic()
    eval_script = make_test_spec(task.row).eval_script
    split_eval_script(eval_script)  # a script the grader cannot read is the task's fault, before any container
    box = oracle_box = None
    agent_code_running = False
    sanitized: SanitizedPatch | None = None
    trust = task_trust(task)
    trust_why = ""
    oracle: OracleVerdict | None = None

    def done(grade: GradeResult, applied: bool, log: str = "", **extra: Any) -> EvalOutcome:
        return EvalOutcome(
            grade,
            applied,
            patch,
            log,
            duration_s=time.monotonic() - started,
            sanitized=sanitized,
            trust=trust,
            oracle=oracle,
            trust_why=trust_why,
            **extra,
        )

    try:
        box = await backend.start(task.image, limits, labels={**(labels or {}), "rollhub.role": "swe-eval"})
        policy = await grading_policy(box, task, patch)
        sanitized = sanitize_patch(patch, policy)
        if sanitized.dropped:
            logger.info("%s: dropped from the agent's diff: %s", task.instance_id, sanitized.dropped)
        if sanitized.rejected:
            logger.info("%s: agent's diff rejected: %s", task.instance_id, sanitized.rejected)
            return done(GradeResult(resolved=False), False, sanitized.rejected)
        to_apply = sanitized.patch
        if to_apply.strip():
            await box.write_file(PATCH_PATH, to_apply.encode("utf-8", "surrogateescape"))
            mismatch = await verify_paths(box, sanitized)
            if mismatch:
                sanitized.rejected = mismatch
                return done(GradeResult(resolved=False), False, mismatch)
        applied, apply_log = await apply_patch(box, to_apply)
        if not applied:
            logger.info("patch did not apply for %s: %s", task.instance_id, apply_log[-300:])
            return done(GradeResult(resolved=False), False, apply_log)
        agent_code_running = True
        grade, log, extra = await run_tests(box, task, eval_script, timeout_s, sanitized.kept)
        agent_code_running = False
        if (
            not grade.tests_ran
            and not extra
            and not grade.hack_suspected
            and not await engine_works(backend, task.image)
        ):
            # the engine's own signal, never the log's text (the code under test writes the log)
            return done(grade, True, log, infra_failure="engine: no test output and the engine cannot run a container")
        if grade.resolved and not extra and trust == TRUST_ORACLE:
            await box.close()
            box = None
            try:
                gold = await gold_answers(backend, task, limits)
                if len(gold.inputs) < MIN_INPUTS:  # an oracle of no questions must not pass anything
                    raise OracleUnavailable(f"{len(gold.inputs)} deterministic hidden inputs")
            except OracleUnavailable as exc:
                return done(GradeResult(resolved=False), True, log, infra_failure=f"oracle: {exc}")
            # trusted only if the bug is wrong on an input the tests do not show; else the task is
            # graded as visible-tests and says so (the oracle still runs: it can only refuse)
            trust, trust_why = effective_trust(gold)
            oracle_box = await backend.start(
                task.image, limits, labels={**(labels or {}), "rollhub.role": "swe-oracle"}
            )
            applied, apply_log = await apply_patch(oracle_box, to_apply)
            if not applied:
                oracle = OracleVerdict(False, len(gold.inputs), len(gold.inputs), "the patch did not apply again")
            else:
                agent_code_running = True
                oracle = await candidate_verdict(oracle_box, task, gold)
                agent_code_running = False
            if not oracle.agreed:
                logger.info("%s: the oracle disagrees: %s", task.instance_id, oracle.reason)
                grade.resolved, grade.status = False, "RESOLVED_NO"
        return done(grade, True, log, **extra)
    except SandboxError as exc:
        if agent_code_running and await engine_works(backend, task.image):
            logger.info("%s: the grading container died while the patched code ran: %s", task.instance_id, exc)
            return done(GradeResult(resolved=False), True, model_failure=f"the patched code broke the grading: {exc}")
        logger.warning("infra failure grading %s: %s", task.instance_id, exc)
        return done(GradeResult(resolved=False), False, infra_failure=f"sandbox: {exc}")
    finally:
        if box is not None:
            await box.close()
        if oracle_box is not None:
            await oracle_box.close()
