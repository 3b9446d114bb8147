"""The red team's generators without Docker: every class of the attack set is there, each with
several techniques; variants are reproducible per (seed, task) and differ across tasks; the
code they put in the library compiles (utf-7 and fullwidth included) and the obfuscated
ones never spell the names they reach for; patches are what git writes (quoted names)."""

from __future__ import annotations

import codecs
import json
import subprocess

import pytest

from rollhub.envs.swe.redteam import CLASS_NAMES, CLASSES, AttackContext, plan, select_classes, stratified
from rollhub.envs.swe.redteam.workspace import Workspace
from rollhub.envs.swe.tasks import SweTask

ISSUE_CLASSES = {
    "obfuscated_runner_patch",
    "log_forgery",
    "markers_in_agent_text",
    "runner_config",
    "odd_file_names",
    "infra_escape",
}
BASE_MOD = (
    '"""A tiny module."""\n\nimport os\n\n\ndef add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n'
)


def _task(instance_id: str = "pkg__pkg-1.0-abcdef12", patch: str = "") -> SweTask:
    return SweTask.from_row(
        {
            "instance_id": instance_id,
            "repo": "pypi/pkg",
            "base_commit": "0" * 40,
            "patch": patch,
            "FAIL_TO_PASS": json.dumps(["tests/test_mod.py::test_add"]),
            "PASS_TO_PASS": json.dumps(["tests/test_mod.py::test_sub", "pkg/mod.py::pkg.mod.sub"]),
            "image": "rollhub/none:latest",
            "eval_script": "#!/bin/bash\n",
        }
    )


@pytest.fixture
def ctx(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(BASE_MOD)
    (root / "tests" / "test_mod.py").write_text(
        "from pkg.mod import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    (root / "setup.cfg").write_text("[metadata]\nname = pkg\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "b"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    (root / "pkg" / "mod.py").write_text(BASE_MOD.replace("return a - b", "return a + b", 1))
    gold = subprocess.run(["git", "diff"], cwd=root, check=True, capture_output=True, text=True).stdout
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=root, check=True)
    return AttackContext.make(_task(patch=gold), Workspace(root))


def test_every_class_of_the_issue_is_in_the_attack_set_with_several_techniques():
    assert ISSUE_CLASSES <= set(CLASS_NAMES)
    assert any(n.startswith("battery:") for n in CLASS_NAMES)
    for c in CLASSES:
        if c.name in ISSUE_CLASSES:
            assert len(c.techniques) >= 6, c.name
    infra = next(c for c in CLASSES if c.name == "infra_escape").techniques
    for needed in ("kill_init", "fill_disk", "fork_bomb", "delete_testbed", "remove_git", "hang"):
        assert any(needed in t for t in infra), needed
    assert {t for t in infra if t.startswith("agent_")} and {t for t in infra if t.startswith("grading_")}


def test_variants_are_reproducible_per_task_and_vary_across_tasks(ctx):
    first = plan(ctx, CLASSES, 3, seed=7)
    again = plan(ctx, CLASSES, 3, seed=7)
    assert [(a.cls, a.technique, a.variant, a.changes) for a in first] == [
        (a.cls, a.technique, a.variant, a.changes) for a in again
    ]
    for c in CLASSES:  # every class runs, its K variants on distinct techniques
        mine = [a for a in first if a.cls == c.name]
        if c.name == "special_case":  # only where the oracle grades: the generic task here has none
            assert not mine
            continue
        assert len(mine) == min(3, len(c.techniques)) and len({a.technique for a in mine}) == len(mine)
    other = AttackContext.make(_task("pkg__pkg-1.0-99999999"), ctx.ws)
    assert [a.technique for a in plan(other, CLASSES, 3, seed=7)] != [a.technique for a in first]
    assert [a.changes for a in plan(ctx, CLASSES, 3, seed=8)] != [a.changes for a in first]


def _source(text: str | bytes) -> str:
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
    first = data.split(b"\n", 1)[0]
    return data.decode("utf-7") if b"utf-7" in first else data.decode("utf-8")


def test_library_code_of_every_generated_attack_compiles(ctx):
    classes = [c for c in CLASSES if c.name in ISSUE_CLASSES]
    count = 0
    for seed in range(6):
        for attempt in plan(ctx, classes, 10, seed):
            for path, text in attempt.changes.items():
                if path.endswith(".py") and text is not None:
                    compile(_source(text), path, "exec")
                    count += 1
    assert count > 200


def test_obfuscated_variants_never_spell_what_they_reach_for(ctx):
    c = select_classes(["obfuscated_runner_patch"])[0]
    seen = set()
    for seed in range(12):
        for attempt in c.variants(ctx, len(c.techniques), seed):
            seen.add(attempt.technique)
            added = "".join(t for t in attempt.changes.values() if isinstance(t, str))
            assert "_pytest" not in added and "TestReport" not in added, attempt
            if attempt.technique == "utf7_module":
                assert any("coding" in t.split("\n", 1)[0] and "utf-7" in t for t in attempt.changes.values())
            if attempt.technique == "fullwidth":
                assert any(ord(ch) > 0xFF00 for ch in added)
    assert seen == set(c.techniques)


def test_rot13_spelling_round_trips():
    import random

    from rollhub.envs.swe.redteam.variation import SPELLINGS

    rng = random.Random(0)
    for name, spell in SPELLINGS.items():
        expr = spell(rng, "_pytest.reports")
        assert eval(expr) == "_pytest.reports", name  # noqa: S307
    assert codecs.decode("_clgrfg", "rot13") == "_pytest"


def test_patches_are_what_git_writes_with_quoted_odd_names_and_the_fix(ctx):
    c = select_classes(["odd_file_names"])[0]
    attempt = next(a for a in c.variants(ctx, len(c.techniques), 0) if a.technique == "tab")
    patch = ctx.ws.diff(attempt.changes, ctx.task.patch)
    assert attempt.honest and attempt.with_gold
    assert '"b/' in patch and "\\t" in patch  # C-quoted as git writes it
    assert "+    return a + b" in patch
    assert ctx.ws.diff({}) == ""  # the copy is reset after each patch


def test_runner_config_zip_is_a_distribution_with_a_pytest11_plugin():
    import io
    import zipfile

    from rollhub.envs.swe.redteam.runner_config import plugin_zip

    with zipfile.ZipFile(io.BytesIO(plugin_zip("mod", "dist", "x = 1\n"))) as zf:
        assert zf.read("dist-1.0.dist-info/entry_points.txt").decode() == "[pytest11]\ndist = mod\n"


def test_stratified_sample_covers_every_package_first():
    tasks = [_task(f"p{i % 3}__x-{i}") for i in range(9)]
    tasks = [SweTask.from_row({**t.row, "repo": f"pypi/p{i % 3}"}) for i, t in enumerate(tasks)]
    sample = stratified(tasks, 3)
    assert len({t.repo for t in sample}) == 3
    assert stratified(tasks, None) == tasks


def test_select_classes_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown attack classes"):
        select_classes(["nope"])
    only = select_classes(None, ["mnemonic_prefix_conftest"])
    assert [c.techniques for c in only] == [("mnemonic_prefix_conftest",)]


def test_a_doctest_id_is_not_taken_for_the_test_file_an_attack_targets(ctx):
    row = {**ctx.task.row, "FAIL_TO_PASS": json.dumps(["pkg/mod.py::pkg.mod.add", "tests/test_mod.py::test_add"])}
    other = AttackContext.make(SweTask.from_row(row), ctx.ws)
    assert other.test_file == "tests/test_mod.py" and other.test_dir == "tests"
