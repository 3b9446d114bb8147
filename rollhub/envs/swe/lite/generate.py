"""SWE-lite task specs: which functions, which bug, which tests, decided on the host from a seed.

A task is one small project folder `pkg_NNNN/` (an `__init__.py`, one module of two or three
generated functions, one test file); one function carries one bug. The split is decided here:
`split_parts(seed)` holds out a share of the function families and of the bug templates, and a
held-out task draws only held-out families and templates, a training task only the others.

The tests' expected values come from running the correct function on the host; a bug is kept
only when at least one test of its function fails on the host too (the container run in
`build` then verifies every FAIL_TO_PASS and PASS_TO_PASS for real).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from rollhub.envs.swe.lite.bugs import Bug, all_templates, find_bugs, kind_of
from rollhub.envs.swe.lite.families import Family, Function, all_families, body_key, compile_function, make_function

SPLITS = ("train", "eval")
#: share of families and of each kind's templates held out for the eval split
HELD_OUT_FRACTION = 0.2
#: a module shorter than this gets another function
MIN_LINES = 22
_DOMAIN_WEIGHTS = {"ints": 0.45, "chars": 0.2, "words": 0.2, "format": 0.15}
_MODULES = {
    "ints": ["stats", "metrics", "series", "tally", "numbers"],
    "chars": ["text_utils", "strings", "cleaning", "labels"],
    "words": ["words", "phrases", "tokens", "text_utils"],
    "format": ["formatting", "layout", "display", "strings"],
}


@dataclass(frozen=True)
class SplitParts:
    families: dict[str, list[Family]]
    templates: dict[str, list[str]]


def split_parts(seed: int) -> SplitParts:
    """Families and templates of each split: disjoint, every domain and every kind with two or
    more templates present in both."""
    rng = random.Random(f"swe-lite-split:{seed}")
    families: dict[str, list[Family]] = {s: [] for s in SPLITS}
    by_domain: dict[str, list[Family]] = {}
    for family in all_families():
        by_domain.setdefault(family.domain, []).append(family)
    for group in by_domain.values():
        shuffled = sorted(group, key=lambda f: f.id)
        rng.shuffle(shuffled)
        held = max(1, round(HELD_OUT_FRACTION * len(shuffled)))
        families["eval"] += shuffled[:held]
        families["train"] += shuffled[held:]
    templates: dict[str, list[str]] = {s: [] for s in SPLITS}
    by_kind: dict[str, list[str]] = {}
    for template in all_templates():
        by_kind.setdefault(kind_of(template), []).append(template)
    for group in by_kind.values():
        shuffled = list(group)
        rng.shuffle(shuffled)
        held = max(1, round(HELD_OUT_FRACTION * len(shuffled))) if len(shuffled) > 1 else 0
        templates["eval"] += shuffled[:held]
        templates["train"] += shuffled[held:]
    return SplitParts(families, templates)


@dataclass
class TaskSpec:
    """One task before its images exist: the folder's files and what the host expects."""

    split: str
    index: int
    folder: str
    module: str
    functions: list[Function]
    target: int
    bug: Bug
    #: test name -> (function index, argument tuple, expected repr)
    tests: dict[str, tuple[int, tuple[Any, ...], str]] = field(default_factory=dict)
    #: tests the host saw fail with the bug
    expected_failures: list[str] = field(default_factory=list)

    @property
    def target_function(self) -> Function:
        return self.functions[self.target]

    @property
    def module_path(self) -> str:
        return f"{self.folder}/{self.module}.py"

    @property
    def test_path(self) -> str:
        return f"{self.folder}/test_{self.module}.py"

    def test_id(self, name: str) -> str:
        return f"{self.test_path}::{name}"

    def module_source(self, buggy: bool) -> str:
        header = f'"""{self.module.replace("_", " ").capitalize()} helpers of {self.folder}."""\n'
        bodies = [
            self.bug.source if buggy and i == self.target else function.source
            for i, function in enumerate(self.functions)
        ]
        return header + "".join("\n\n" + body for body in bodies)

    def test_source(self) -> str:
        names = ", ".join(f.name for f in self.functions)
        lines = [f"from {self.folder}.{self.module} import {names}", ""]
        for name, (index, args, expected) in self.tests.items():
            call = f"{self.functions[index].name}({', '.join(repr(a) for a in args)})"
            lines += ["", f"def {name}():", f"    assert {call} == {expected}", ""]
        return "\n".join(lines)

    @property
    def lines(self) -> int:
        return self.module_source(buggy=False).count("\n") + 1


def _answer(function: Any, args: tuple[Any, ...]) -> str | None:
    try:
        return repr(function(*args))
    except Exception:  # noqa: BLE001 - a mutant may raise anything; that answer differs
        return None


def _draw_family(rng: random.Random, families: list[Family], domain: str | None = None) -> Family:
    if domain is None:
        domains = [d for d in _DOMAIN_WEIGHTS if any(f.domain == d for f in families)]
        domain = rng.choices(domains, weights=[_DOMAIN_WEIGHTS[d] for d in domains])[0]
    return rng.choice([f for f in families if f.domain == domain])


def make_spec(
    split: str, index: int, seed: int, parts: SplitParts, taken: set[str], attempts: int = 50
) -> TaskSpec | None:
    """Task `index` of `split`: deterministic in (seed, split, index) and in `taken` (body
    keys of functions already in the same image, which it must not repeat: another folder
    holding this task's function unmutated would hand the agent the fix)."""
    rng = random.Random(f"swe-lite:{seed}:{split}:{index}")
    families, templates = parts.families[split], parts.templates[split]
    for _ in range(attempts):
        target_family = _draw_family(rng, families)
        domain = "text" if target_family.domain in ("chars", "words", "format") else "ints"
        count = rng.choice([2, 3])
        chosen = [make_function(target_family, rng)]
        # two to four functions, and at least MIN_LINES lines of module
        while len(chosen) < count or (len(chosen) < 4 and sum(f.source.count("\n") + 2 for f in chosen) < MIN_LINES):
            pool = families if domain == "ints" else [f for f in families if f.domain != "ints"]
            other = make_function(_draw_family(rng, pool, "ints" if domain == "ints" else None), rng)
            if other.name not in {f.name for f in chosen}:
                chosen.append(other)
        keys = [body_key(f.source) for f in chosen]
        if len(set(keys)) < len(keys) or taken.intersection(keys):
            continue
        target = chosen[0]
        bugs = _killed_bugs(target, templates)
        if not bugs:
            continue
        kinds = sorted({kind_of(b.template) for b in bugs})
        kind = rng.choice(kinds)
        bug = rng.choice([b for b in bugs if kind_of(b.template) == kind])
        order = list(range(len(chosen)))
        rng.shuffle(order)
        functions = [chosen[i] for i in order]
        spec = TaskSpec(
            split,
            index,
            folder=f"pkg_{index:04d}",
            module=rng.choice(_MODULES[target_family.domain]),
            functions=functions,
            target=order.index(0),
            bug=bug,
        )
        _fill_tests(spec)
        if not spec.expected_failures:
            continue
        taken.update(keys)
        return spec
    return None


def _killed_bugs(function: Function, templates: list[str]) -> list[Bug]:
    good = function.compiled()
    expected = [_answer(good, args) for args in function.inputs]
    killed = []
    for bug in find_bugs(function.source, templates):
        try:
            mutant = compile_function(bug.source, function.name)
        except SyntaxError:
            continue
        if [_answer(mutant, args) for args in function.inputs] != expected:
            killed.append(bug)
    return killed


def _fill_tests(spec: TaskSpec) -> None:
    mutant = compile_function(spec.bug.source, spec.target_function.name)
    for index, function in enumerate(spec.functions):
        good = function.compiled()
        for case, args in enumerate(function.inputs):
            expected = _answer(good, args)
            if expected is None:
                continue
            name = f"test_{function.name}_{case}"
            spec.tests[name] = (index, args, expected)
            if index == spec.target and _answer(mutant, args) != expected:
                spec.expected_failures.append(spec.test_id(name))


def make_specs(split: str, count: int, seed: int, pack_size: int) -> list[list[TaskSpec]]:
    """`count` tasks of `split`, in packs of at most `pack_size` (one image each); within a
    pack no function body appears twice."""
    parts = split_parts(seed)
    packs: list[list[TaskSpec]] = []
    taken: set[str] = set()
    index = 0
    produced = 0
    while produced < count:
        if not packs or len(packs[-1]) >= pack_size:
            packs.append([])
            taken = set()
        spec = make_spec(split, index, seed, parts, taken)
        index += 1
        if spec is not None:
            packs[-1].append(spec)
            produced += 1
    return packs


def content_digest(specs: list[TaskSpec]) -> str:
    """A digest of the specs' files, to tell two builds of the same seed apart from others."""
    digest = hashlib.sha256()
    for spec in specs:
        digest.update((spec.module_source(False) + spec.module_source(True) + spec.test_source()).encode())
    return digest.hexdigest()[:12]
