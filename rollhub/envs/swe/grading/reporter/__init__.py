"""Test outcomes through a channel the code under test cannot write.

The official eval script prints `git status` / `git diff` (the agent's own text) into the log
and brackets the test output with fixed markers, in a log file that the test process holds
open for writing; whatever it prints, or rewrites in place, is what the parser reads. Here:

- the script is rewritten (`split_eval_script`): what runs before the tests (resetting the
  test files, applying the test patch) still runs, silently; `git status/show/diff/log` are
  dropped; the test command's output is the only thing in the log, so no marker is needed to
  find it and none the tests print can move its bounds (the markers the official parser wants
  are added on the host, around a log that may not contain any of them);
- the collector (collector.py) runs the tests under a key the tests never hold and hands back
  the log, the reporter's records and the exit status, sealed (`Seal`);
- the reporter (pytest_plugin.py), loaded before any project code under a random module
  name, records each test's outcome in a MAC chain closed at `pytest_unconfigure`, and
  checks the runner's internals for tampering (`verify_records`).

The grade is resolved only when swebench's parser on the log and the reporter's records both
say so; `hack_suspected` says why they did not agree (grading.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.swe.tasks import END_MARKER, START_MARKER, WORKDIR

_HERE = Path(__file__).parent
#: the descriptor the records pipe has in the test process (the plugin moves it at once)
RECORDS_FD = 197
#: log parsers whose runs are pytest runs: the reporter must speak for them
PYTEST_PARSERS = frozenset({"parse_log_pytest", "parse_log_pytest_v2", "parse_log_pytest_options"})
#: what the official script prints about the repository, before the tests: never run
_INSPECTION = re.compile(r"^\s*git(\s+(-c\s+\S+|--?[\w-]+(=\S+)?))*\s+(status|show|diff|log)\b")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][\w.-]*)\1")


class EvalScriptError(UserError):
    """The task's eval script has no test-output markers to find the test command by."""


def split_eval_script(script: str) -> tuple[list[str], list[str]]:
    """(setup lines, test lines) of a swebench eval script: the lines before the start
    marker, without the shebang, `set` flags and the commands that print the repository,
    and the lines between the markers. Heredoc bodies are kept whole and never judged."""
    lines = script.split("\n")
    setup: list[str] = []
    test: list[str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        block = [line]
        heredoc = _HEREDOC.search(line)
        if heredoc:
            end = heredoc.group(2)
            while i + 1 < len(lines):
                i += 1
                block.append(lines[i])
                if lines[i].strip() == end:
                    break
        i += 1
        if START_MARKER in line and test is None:
            test = []
            continue
        if END_MARKER in line and test is not None:
            return setup, test
        if test is not None:
            test.extend(block)
        elif not (line.startswith("#!") or re.fullmatch(r"\s*set\s+-[\w]+(\s+\w+)*\s*", line)):
            if not _INSPECTION.match(line):
                setup.extend(block)
    raise EvalScriptError("the eval script has no start and end of test output markers around its test command")


@dataclass
class Seal:
    """What the collector printed, verified: digests of the files it wrote, the test
    script's exit status, whether it ran out of time."""

    log_sha256: str
    records_sha256: str
    exit_code: int | None
    timed_out: bool
    overflow: bool
    sealed: bool
    duration_s: float


@dataclass
class RecordsVerdict:
    """The reporter's records, checked: `problems` are reasons to distrust the run."""

    opened: bool = False
    closed: bool = False
    #: the chain broke (a record that does not verify): nothing after it is read
    broken: str = ""
    tamper: list[str] = field(default_factory=list)
    #: shown test id -> phase -> (outcome, xfail reason or None, raised or None)
    phases: dict[str, dict[str, tuple[str, str | None, bool | None]]] = field(default_factory=dict)
    exitstatus: int | None = None
    records: int = 0

    def problems(self) -> list[str]:
        found = []
        if not self.opened:
            found.append("the grading reporter never started")
        if self.broken:
            found.append(f"the reporter's record chain is broken ({self.broken})")
        elif self.opened and not self.closed:
            found.append("the test process ended before the reporter closed (os._exit, a crash or a kill)")
        found += [f"tampering: {t}" for t in self.tamper]
        for test, phases in self.phases.items():
            call = phases.get("call")
            if call is not None and call[0] == "passed" and call[2]:
                found.append(f"{test}: reported passed although its call raised")
        return found

    def summary_lines(self) -> str:
        """The outcome of each test as `pytest -rA` would summarise it, for swebench's own
        parser to turn into its test ids."""
        lines = []
        for test, phases in self.phases.items():
            setup, call, teardown = phases.get("setup"), phases.get("call"), phases.get("teardown")
            if any(p is not None and p[0] == "failed" for p in (setup, teardown)):
                lines.append(f"ERROR {test}")
            elif call is None:
                lines.append(f"SKIPPED {test}" if setup and setup[0] == "skipped" else f"FAILED {test}")
            elif call[0] == "passed" and call[1] is None and teardown is not None:
                lines.append(f"PASSED {test}")
            elif call[0] == "skipped" and call[1] is not None and teardown is not None:
                reason = call[1].split("\n", 1)[0]
                lines.append(f"XFAIL {test}" + (f" - {reason}" if reason else ""))
            elif call[0] == "skipped":
                lines.append(f"SKIPPED {test}")
            else:
                lines.append(f"FAILED {test}")
        return "\n".join(lines) + "\n"


def verify_records(data: bytes, key: bytes) -> RecordsVerdict:
    """Read the reporter's MAC chain up to its close record; records after it are ignored."""
    verdict = RecordsVerdict()
    mac = hmac.new(key, digestmod=hashlib.sha256)
    prev = b""
    for n, raw in enumerate(data.split(b"\n")):
        if verdict.closed:
            break
        if not raw:
            continue
        payload, _, tag = raw.rpartition(b" ")
        step = mac.copy()
        step.update(prev + b"\n" + payload)
        expected = step.hexdigest().encode()
        if not hmac.compare_digest(expected, tag):
            verdict.broken = f"record {n} does not verify"
            break
        try:
            seq, kind, body = json.loads(payload)
        except (ValueError, TypeError):
            verdict.broken = f"record {n} is not a record"
            break
        if seq != verdict.records:
            verdict.broken = f"record {n} is out of sequence"
            break
        prev = expected
        verdict.records += 1
        if kind == "open":
            verdict.opened = True
        elif kind == "report":
            verdict.tamper += body.get("tamper", [])
            raised = body.get("raised")
            verdict.phases.setdefault(str(body["id"]), {})[str(body["when"])] = (
                str(body["outcome"]),
                body.get("xfail"),
                raised if isinstance(raised, bool) else None,
            )
        elif kind == "close":
            verdict.tamper += body.get("tamper", [])
            verdict.exitstatus = body.get("exitstatus")
            verdict.closed = True
    return verdict


@dataclass
class GradingRun:
    """One evaluation's collector and reporter: fresh keys, folder and module name."""

    workdir: str = WORKDIR
    timeout_s: float = 900.0
    #: repository paths the patch writes (their code is the agent's)
    patched: tuple[str, ...] = ()
    folder: str = field(default_factory=lambda: f"/tmp/rollhub_grade_{secrets.token_hex(8)}")
    module: str = field(default_factory=lambda: f"rollhub_grading_{secrets.token_hex(8)}")
    tag: str = field(default_factory=lambda: f"ROLLHUB-SEAL-{secrets.token_hex(8)}")
    collector_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    reporter_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def collector_path(self) -> str:
        return f"{self.folder}.py"

    @property
    def command(self) -> str:
        """The collector on the image's Python 3 (on PATH, else conda's base, as in the
        official images before their environment is activated)."""
        path = shlex.quote(self.collector_path)
        return (
            "for p in python3 /opt/miniconda3/bin/python3 /usr/bin/python3; do "
            f'command -v "$p" >/dev/null 2>&1 && exec "$p" {path}; done; echo "no python3 for the grader" >&2; exit 127'
        )

    @property
    def log_path(self) -> str:
        return f"{self.folder}/test.log"

    @property
    def records_path(self) -> str:
        return f"{self.folder}/records"

    def collector_source(self, eval_script: str, env: dict[str, str] | None = None) -> bytes:
        """The one file to write into the grading container (at `collector_path`) before
        running `command`: the collector with its settings, the reporter plugin, the test
        script and both keys; it deletes itself as it starts."""
        setup, test = split_eval_script(eval_script)
        # swebench's scripts keep the test command's status in a variable (an assignment, which
        # exits 0): the script exits with that status, so it can be checked against pytest's own
        status = 'exit "${SWEBENCH_TEST_EXIT_CODE:-$?}"'
        body = "\n".join(["#!/bin/bash", "set -uo pipefail", "{", ":", *setup, "} >/dev/null 2>&1", *test, status])
        body += "\n"
        plugin = (_HERE / "pytest_plugin.py").read_text()
        plugin = re.sub(r'(?m)^KEY_PATH = ""$', f"KEY_PATH = {json.dumps(self.folder + '/reporter.key')}", plugin)
        plugin = re.sub(r"(?m)^FD = -1$", f"FD = {RECORDS_FD}", plugin)
        plugin = re.sub(r'(?m)^REPO = "/testbed"$', f"REPO = {json.dumps(self.workdir)}", plugin)
        patched = f"PATCHED = frozenset({json.dumps(sorted(self.patched))})"
        plugin = re.sub(r"(?m)^PATCHED = frozenset\(\)$", lambda _: patched, plugin)
        settings = {
            "folder": self.folder,
            "key": self.collector_key.hex(),
            "reporter_key": self.reporter_key.hex(),
            "script": body,
            "plugin": plugin,
            "module": self.module,
            "fd": RECORDS_FD,
            "timeout_s": self.timeout_s,
            "workdir": self.workdir,
            "tag": self.tag,
            "env": dict(env or {}),
        }
        source = (_HERE / "collector.py").read_text()
        filled = f"SETTINGS = json.loads({json.dumps(json.dumps(settings))})"
        source, n = re.subn(r"(?m)^SETTINGS = None$", lambda _: filled, source)
        assert n == 1, "collector.py lost its SETTINGS line"
        return source.encode()

    def seal(self, output: str) -> Seal | None:
        """The collector's sealed line in the exec's output; None when there is none that
        verifies (the collector was killed, or the exec ran out of time)."""
        found = None
        for line in output.splitlines():
            parts = line.strip().split(" ")
            if len(parts) != 3 or parts[0] != self.tag:
                continue
            expected = hmac.new(self.collector_key, parts[1].encode(), hashlib.sha256).hexdigest()
            if hmac.compare_digest(expected, parts[2]):
                body: dict[str, Any] = json.loads(parts[1])
                found = Seal(**{k: body[k] for k in Seal.__dataclass_fields__})
        return found
