"""The differential oracle: a factory task's verdict that the candidate's process cannot forge.

The visible tests run the patched library inside the test process, so patched code can reach
the runner and forge a pass (rewrite tests, reset the reporter, answer the tested inputs from
a table). For a factory task the correct function is known (the package's unmutated source),
so the grader also asks both versions the same hidden questions (`oracle_inputs`):

- the candidate: a fresh container of the task image with the candidate's patch applied;
- the gold: a fresh container of the package image, the unmutated source the task image was
  built on (never the candidate's image, never a history the agent's container holds);
- in each, a minimal harness imports the module, calls the function on each input and writes
  one line of JSON to a file it opened before the import (read back whole: exec output is
  clipped): per input, the repr of the return value (iterators read out) or the exception's
  class (with its single-inheritance ancestors), what it printed, and the repr of the
  arguments after the call (in-place changes); a call past its time is answered `timeout`;
- the host parses that strictly and compares (`oracle_compare`: values by shape, exceptions by
  class): any malformed output, missing input or different answer is a disagreement, and the
  task is not resolved (reward 0).

The gold runs twice; inputs whose answers differ between the runs, hold an object address or
time out are dropped; the bug (the unpatched task image) runs once on what is kept. A task
carries `trust: "oracle"` in its row (`row["rollhub"]["trust"]`) when its function is a
module-level one, enough inputs survive, and the bug answers at least one input the tests do
not show unlike the gold (`survey_trust`: a bug told apart only on the tests' own inputs is
kept by a table of the visible answers, which the oracle would then pass); grading re-checks
that on the inputs it uses (`effective_trust`). Every other task is graded by its visible
tests alone and says `trust: "visible-tests"`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from rollhub.envs.swe.grading.oracle_compare import TIMEOUT, same_answer
from rollhub.envs.swe.grading.oracle_inputs import (
    ITERATOR,
    call_sites,
    find_function,
    hidden_inputs,
    is_visible,
    neighbours,
    signature_of,
)
from rollhub.envs.swe.tasks import WORKDIR, SweTask
from rollhub.sandbox.base import Limits, Sandbox, SandboxBackend

logger = logging.getLogger(__name__)

TRUST_ORACLE = "oracle"
TRUST_VISIBLE_TESTS = "visible-tests"
#: fewer deterministic inputs than this and the oracle does not apply
MIN_INPUTS = 3
HARNESS_PATH = "/tmp/rollhub_oracle_harness.py"
INPUTS_PATH = "/tmp/rollhub_oracle_inputs.json"
ANSWERS_PATH = "/tmp/rollhub_oracle_answers.json"
MAX_ANSWERS_BYTES = 64 << 20
#: one candidate call may take this long before it counts as a timeout (a disagreement): generous,
#: a slow but correct fix passes; the gold gets GOLD_CALL_TIMEOUT_S and its slower inputs are
#: dropped, so the candidate always has CALL_TIMEOUT_S / GOLD_CALL_TIMEOUT_S times the gold's time
CALL_TIMEOUT_S = 10.0
GOLD_CALL_TIMEOUT_S = 2.0
#: the harness's whole run: past it the inputs left are answered `timeout` (a clear signal, never
#: a crash); the process is killed HARNESS_KILL_S later if a call swallows its timeout
HARNESS_BUDGET_S = 150.0
HARNESS_TIMEOUT_S = 240.0
#: repr texts are cut here on both sides alike
MAX_REPR_CHARS = 4000
PACKAGE_IMAGE_PREFIX = "rollhub/swe-pkg-"

_HARNESS_BODY = r"""
import ast, io, itertools, json, os, signal, sys, time, types, contextlib
path, name, nonce, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
call_timeout, budget = (float(x) for x in sys.argv[5].split("/"))
with open(sys.argv[6]) as f:
    inputs = json.load(f)
os.unlink(sys.argv[6])
out = os.open(sys.argv[7], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.dup2(null, 2)
dumps = json.dumps

def emit(payload):
    data = (nonce + " " + dumps(payload) + "\n").encode()
    while data:
        data = data[os.write(out, data):]
    os._exit(0)

def module_name(path):
    best = None
    for entry in sys.path:
        entry = os.path.abspath(entry or ".")
        if path.startswith(entry + os.sep) and path.endswith(".py"):
            parts = path[len(entry) + 1:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts and all(p.isidentifier() for p in parts) and (best is None or len(entry) > best[0]):
                best = (len(entry), ".".join(parts))
    return best and best[1]

class Late(BaseException):
    pass

def alarm(signum, frame):
    raise Late()

def raised(exc):
    # the class and its ancestors while each has one base: a single-inheritance subclass of the
    # gold's class agrees, a class of several bases only as itself
    kind = type(exc)
    chain = [kind]
    while len(kind.__bases__) == 1 and kind.__bases__[0] is not object:
        kind = kind.__bases__[0]
        chain.append(kind)
    return "raise:" + "<".join(getattr(k, "__module__", "?") + "." + getattr(k, "__qualname__", "?") for k in chain)

def text(value):
    try:
        shown = repr(value)
    except BaseException as exc:
        shown = "repr-raised:" + type(exc).__name__
    return shown[:limit]

try:
    import importlib
    module = importlib.import_module(module_name(path))
    function = getattr(module, name)
except BaseException as exc:
    emit({"error": "import:" + type(exc).__name__})
signal.signal(signal.SIGALRM, alarm)
results = []
started = time.monotonic()
def as_argument(value):
    if isinstance(value, dict) and set(value) == {ITERATOR} and isinstance(value[ITERATOR], list):
        return iter(value[ITERATOR])
    return value

def shown_argument(given, after):
    return "<iterator>" if given is not after and type(after).__name__.endswith("iterator") else after

for item in inputs:
    given_args, given_kwargs = ast.literal_eval(item)
    args = [as_argument(a) for a in given_args]
    kwargs = {k: as_argument(v) for k, v in given_kwargs.items()}
    printed = io.StringIO()
    if time.monotonic() - started > budget:  # the whole run's budget spent: the rest are timeouts
        results.append([TIMEOUT, "", ""])
        continue
    signal.setitimer(signal.ITIMER_REAL, call_timeout)
    try:
        with contextlib.redirect_stdout(printed):
            value = function(*args, **kwargs)
            if isinstance(value, (types.GeneratorType, map, filter, zip, itertools.chain)) or (
                hasattr(value, "__next__") and hasattr(value, "__iter__")
            ):
                value = ("iterator", list(itertools.islice(value, 1000)))
        answer = "return:" + text(value)
    except Late:
        answer = TIMEOUT
    except SystemExit as exc:
        answer = "raise:SystemExit:" + text(exc.code)
    except BaseException as exc:
        answer = raised(exc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    after_args = tuple(shown_argument(g, a) for g, a in zip(given_args, args))
    after_kwargs = {k: shown_argument(given_kwargs[k], v) for k, v in kwargs.items()}
    results.append([answer, text((after_args, after_kwargs)), printed.getvalue()[:limit]])
emit({"results": results})
"""
#: the harness run in both containers: it reads the inputs, imports the module, writes the answers
HARNESS = f"ITERATOR = {ITERATOR!r}\nTIMEOUT = {TIMEOUT!r}\n" + _HARNESS_BODY


class OracleUnavailable(Exception):
    """The oracle cannot be run for this task (no clean image, the gold does not import):
    the machinery's fault, never the model's."""


@dataclass
class OracleVerdict:
    """The oracle's verdict on one candidate."""

    agreed: bool
    inputs: int
    disagreements: int = 0
    #: why it disagreed, e.g. the first differing input (never the expected answer)
    reason: str = ""
    duration_s: float = 0.0
    #: of the disagreements, the inputs the candidate ran out of time on
    timeouts: int = 0

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "oracle_agreed": self.agreed,
            "oracle_inputs": self.inputs,
            "oracle_disagreements": self.disagreements,
            "oracle_duration_s": round(self.duration_s, 3),
        }
        if self.reason:
            info["oracle_reason"] = self.reason
        if self.timeouts:
            info["oracle_timeouts"] = self.timeouts
        return info


@dataclass
class GoldAnswers:
    """The inputs (as literal texts) the oracle keeps for a task and the gold's answers."""

    inputs: list[str]
    answers: list[list[str]]
    clean_image: str
    dropped: int = 0
    notes: list[str] = field(default_factory=list)
    #: per input: whether the tests or doctests show it (a table could answer it)
    visible: list[bool] = field(default_factory=list)
    #: per input: whether the unpatched task image (the bug) answers it unlike the gold
    bug_disagrees: list[bool] = field(default_factory=list)

    @property
    def exposing_hidden(self) -> int:
        """Inputs no table of the visible answers holds on which the bug is wrong: with none,
        a patch answering the visible inputs from a table and keeping the bug would agree."""
        return sum(d and not v for d, v in zip(self.bug_disagrees, self.visible))


def task_trust(task: SweTask) -> str:
    """`oracle` when the task's row says the differential oracle grades it, else `visible-tests`."""
    meta = task.row.get("rollhub") or {}
    return TRUST_ORACLE if meta.get("trust") == TRUST_ORACLE else TRUST_VISIBLE_TESTS


def oracle_target(task: SweTask) -> tuple[str, str] | None:
    """(file, function) of a factory task whose mutated function is module-level, else None."""
    mutation = (task.row.get("rollhub") or {}).get("mutation") or {}
    file, function = mutation.get("file"), mutation.get("function")
    if not file or not function or "." in function or not str(file).endswith(".py"):
        return None
    return str(file), str(function)


def clean_image(task: SweTask, client: Any = None) -> str:
    """The package image the task image was built on (its unmutated source), found in the
    task image's own ancestry by its tag; OracleUnavailable when there is none."""
    import docker
    import docker.errors

    client = client or docker.from_env()
    try:
        history = client.images.get(task.image).history()
    except docker.errors.ImageNotFound:
        raise OracleUnavailable(f"the task image {task.image} is missing") from None
    for layer in history:
        for tag in layer.get("Tags") or []:
            if tag.startswith(PACKAGE_IMAGE_PREFIX):
                return tag
    raise OracleUnavailable(f"no package image ({PACKAGE_IMAGE_PREFIX}*) in the ancestry of {task.image}")


def parse_harness_output(output: str, nonce: str, inputs: int) -> list[list[str]] | None:
    """The harness's answers, or None when its output is not exactly one line of the form
    it prints with an answer for every input."""
    text = output.strip("\n")
    if "\n" in text or not text.startswith(nonce + " "):
        return None
    try:
        payload = json.loads(text[len(nonce) + 1 :])
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(payload, dict) or set(payload) != {"results"}:
        return None
    results = payload["results"]
    if not isinstance(results, list) or len(results) != inputs:
        return None
    for item in results:
        if not (isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item)):
            return None
    return results


async def run_harness(
    box: Sandbox,
    file: str,
    function: str,
    inputs: list[str],
    timeout_s: float = HARNESS_TIMEOUT_S,
    call_timeout_s: float = CALL_TIMEOUT_S,
    budget_s: float = HARNESS_BUDGET_S,
) -> tuple[list[list[str]] | None, str]:
    """Run the harness in `box` on `inputs`; (answers or None when malformed, raw output)."""
    nonce = secrets.token_hex(16)
    await box.write_file(HARNESS_PATH, HARNESS)
    await box.write_file(INPUTS_PATH, json.dumps(inputs))
    timing = f"{call_timeout_s}/{budget_s}"
    argv = [f"{WORKDIR}/{file}", function, nonce, str(MAX_REPR_CHARS), timing, INPUTS_PATH, ANSWERS_PATH]
    command = (
        f"cd / && rm -f {ANSWERS_PATH} && PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 timeout -k 5 {int(timeout_s)} "
        f"python -s {HARNESS_PATH} {' '.join(shlex.quote(a) for a in argv)}"
    )
    result = await box.exec(command, timeout_s=timeout_s + 30, workdir="/")
    try:  # a file, read back whole: exec output is clipped for the agent's sake
        text = (await box.read_file(ANSWERS_PATH, max_bytes=MAX_ANSWERS_BYTES)).decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError, OSError) as exc:
        return None, f"no answers ({type(exc).__name__}): {result.output[-400:]}"
    return parse_harness_output(text, nonce, len(inputs)), result.output[-400:]


async def _texts(box: Sandbox, paths: list[str]) -> dict[str, str]:
    texts = {}
    for path in paths:
        try:
            texts[path] = (await box.read_file(f"{WORKDIR}/{path}")).decode("utf-8", errors="replace")
        except (FileNotFoundError, IsADirectoryError, OSError):
            continue
    return texts


def _test_files(task: SweTask) -> list[str]:
    files = []
    for test in [*task.fail_to_pass, *task.pass_to_pass]:
        path = test.split("::", 1)[0]
        if path.endswith(".py") and ".." not in path and not path.startswith("/") and path not in files:
            files.append(path)
    return files


_GOLD: dict[tuple[str, str], GoldAnswers] = {}


def _usable(first: list[str], second: list[str]) -> bool:
    """A gold answer that can be compared: stable, in time, without an object address, and printable
    (`repr-raised:` text is the same for every value whose repr fails, e.g. any int past 4,300 digits)."""
    text = first[0] + first[1]
    return first == second and first[0] != TIMEOUT and " at 0x" not in text and "repr-raised:" not in text


async def _stable(box: Sandbox, file: str, function: str, inputs: list[str]) -> list[tuple[int, list[str]]] | None:
    """The gold's answers, run twice: (index, answer) of those the same both times, without a
    timeout or an object address; None when the harness fails."""
    runs = [await run_harness(box, file, function, inputs, call_timeout_s=GOLD_CALL_TIMEOUT_S) for _ in range(2)]
    if runs[0][0] is None or runs[1][0] is None:
        return None
    return [(i, a) for i, (a, b) in enumerate(zip(runs[0][0], runs[1][0])) if _usable(a, b)]


async def gold_answers(backend: SandboxBackend, task: SweTask, limits: Limits, client: Any = None) -> GoldAnswers:
    """The task's hidden inputs, the gold's answers (from a fresh container of the clean package
    image, run twice: what differs between the runs is dropped) and where the bug (the unpatched
    task image) answers unlike them. Where the bug is wrong only on inputs the tests show, their
    neighbours are asked too (`neighbours`). Cached per process."""
    target = oracle_target(task)
    if target is None:
        raise OracleUnavailable(f"{task.instance_id}: the mutated function is not a module-level function")
    file, function = target
    image = await asyncio.to_thread(clean_image, task, client)
    key = (task.instance_id, image)
    if key in _GOLD:
        return _GOLD[key]
    box = await backend.start(image, limits, labels={"rollhub.role": "swe-oracle-gold"})
    bug_box = None
    try:
        texts = await _texts(box, [file, *_test_files(task)])
        node = find_function(texts.get(file, ""), function)
        if node is None:
            raise OracleUnavailable(f"{task.instance_id}: no module-level `def {function}` in {file}")
        tests = [text for path, text in texts.items() if path != file]
        sites = call_sites(tests, function, sources=[texts[file]])
        chosen = hidden_inputs(task.instance_id, signature_of(node), sites)
        kept = await _stable(box, file, function, [repr(i) for i in chosen])
        if kept is None:
            raise OracleUnavailable(f"{task.instance_id}: the gold harness failed")
        answers = GoldAnswers([repr(chosen[i]) for i, _ in kept], [a for _, a in kept], image)
        answers.visible = [is_visible(*chosen[i], sites) for i, _ in kept]
        answers.dropped = len(chosen) - len(kept)
        asked = [chosen[i] for i, _ in kept]
        if len(answers.inputs) >= MIN_INPUTS:
            bug_box = await backend.start(task.image, limits, labels={"rollhub.role": "swe-oracle-bug"})
            bug, _ = await run_harness(bug_box, file, function, answers.inputs)
            if bug is None:
                raise OracleUnavailable(f"{task.instance_id}: the unpatched task image's harness output was malformed")
            mark_bug(answers, bug)
            if answers.exposing_hidden == 0 and any(answers.bug_disagrees):
                exposing = [asked[i] for i, wrong in enumerate(answers.bug_disagrees) if wrong]
                near = neighbours(exposing, sites, taken={repr(i) for i in chosen})
                more = await _stable(box, file, function, [repr(i) for i in near]) if near else None
                if more:
                    inputs = [repr(near[i]) for i, _ in more]
                    bug, _ = await run_harness(bug_box, file, function, inputs)
                    if bug is None:
                        raise OracleUnavailable(f"{task.instance_id}: the unpatched task image's harness failed")
                    answers.inputs += inputs
                    answers.answers += [a for _, a in more]
                    answers.visible += [False] * len(more)  # `neighbours` leaves the visible out
                    answers.bug_disagrees += [not same_answer(g, b) for (_, g), b in zip(more, bug)]
                    answers.dropped += len(near) - len(more)
    finally:
        await box.close()
        if bug_box is not None:
            await bug_box.close()
    _GOLD[key] = answers
    return answers


def mark_bug(gold: GoldAnswers, bug: list[list[str]]) -> GoldAnswers:
    """Record where the bug (the unpatched task image's answers) disagrees with the gold."""
    gold.bug_disagrees = [not same_answer(g, b) for g, b in zip(gold.answers, bug)]
    return gold


def effective_trust(gold: GoldAnswers) -> tuple[str, str]:
    """(trust, why) for a task whose row says `oracle`, from the inputs the oracle uses: the
    oracle is trusted only where the bug is wrong on an input no table of the visible answers
    holds; otherwise the task is graded as `visible-tests` and says why."""
    if len(gold.inputs) < MIN_INPUTS:
        return TRUST_VISIBLE_TESTS, f"{len(gold.inputs)} deterministic inputs"
    if gold.exposing_hidden == 0:
        shown = sum(d and v for d, v in zip(gold.bug_disagrees, gold.visible))
        return TRUST_VISIBLE_TESTS, (
            f"the bug answers every input the tests do not show as the gold does ({shown} visible inputs expose it)"
        )
    return TRUST_ORACLE, ""


def compare(gold: GoldAnswers, candidate: list[list[str]] | None) -> OracleVerdict:
    """Agreement on every kept input; malformed candidate output is a disagreement."""
    if candidate is None:
        return OracleVerdict(False, len(gold.inputs), len(gold.inputs), "the harness's output was malformed")
    differing = [i for i, (g, c) in enumerate(zip(gold.answers, candidate)) if not same_answer(g, c)]
    if not differing:
        return OracleVerdict(True, len(gold.inputs))
    timeouts = sum(candidate[i][0] == TIMEOUT for i in differing)
    first = differing[0]
    late = (
        f"; {timeouts} ran out of time (over {CALL_TIMEOUT_S:g} s a call or {HARNESS_BUDGET_S:g} s in all)"
        if timeouts
        else ""
    )
    return OracleVerdict(
        False,
        len(gold.inputs),
        len(differing),
        f"{len(differing)} of {len(gold.inputs)} hidden inputs answered unlike the original function{late} "
        f"(first: {gold.inputs[first][:200]})",
        timeouts=timeouts,
    )


async def candidate_verdict(box: Sandbox, task: SweTask, gold: GoldAnswers) -> OracleVerdict:
    """Run the harness in `box` (the task image with the candidate's patch applied) and
    compare with the gold on the host."""
    started = time.monotonic()
    target = oracle_target(task)
    assert target is not None  # gold_answers has checked
    answers, _ = await run_harness(box, *target, gold.inputs)
    verdict = compare(gold, answers)
    verdict.duration_s = time.monotonic() - started
    return verdict


async def survey_trust(
    backend: SandboxBackend, task: SweTask, limits: Limits = Limits(cpus=1.0, memory_mb=1024), client: Any = None
) -> dict[str, Any]:
    """Whether the oracle applies to `task`: its function is module-level, at least
    MIN_INPUTS deterministic inputs survive, and the unpatched task image (the bug) answers
    at least one input the tests do not show unlike the gold. Returns the row's `trust` and
    the counts."""
    if oracle_target(task) is None:
        return {"trust": TRUST_VISIBLE_TESTS, "why": "not a module-level function"}
    try:
        gold = await gold_answers(backend, task, limits, client)
    except OracleUnavailable as exc:
        return {"trust": TRUST_VISIBLE_TESTS, "why": str(exc)}
    trust, why = effective_trust(gold)
    counts = {
        "inputs": len(gold.inputs),
        "hidden_inputs": len(gold.inputs) - sum(gold.visible),
        "bug_disagreements": sum(gold.bug_disagrees),
        "bug_hidden_disagreements": gold.exposing_hidden,
    }
    return {"trust": trust, **({"why": why} if why else {}), **counts}
