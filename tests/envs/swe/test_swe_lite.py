"""SWE-lite on the host: the generator is deterministic, the splits share no family, template or
fix, every task's bug is caught by its own tests, and a pack never holds a task's correct code."""

from __future__ import annotations

import ast
import difflib
import json
import random

import pytest

from rollhub.core.errors import UserError
from rollhub.envs.swe.lite.bugs import all_templates, find_bugs, kind_of
from rollhub.envs.swe.lite.families import all_families, body_key, compile_function, make_function
from rollhub.envs.swe.lite.generate import make_specs, split_parts

KINDS = {
    "comparison",
    "boundary",
    "arithmetic",
    "off_by_one",
    "wrong_constant",
    "swapped_args",
    "dropped_negation",
    "wrong_return",
    "logic",
}


@pytest.fixture(scope="module")
def train_packs():
    return make_specs("train", 60, seed=0, pack_size=40)


@pytest.fixture(scope="module")
def eval_packs():
    return make_specs("eval", 30, seed=0, pack_size=40)


def _files(packs):
    return [(s.folder, s.module_source(True), s.module_source(False), s.test_source()) for p in packs for s in p]


def test_the_generator_is_deterministic_in_its_seed(train_packs):
    again = make_specs("train", 60, seed=0, pack_size=40)
    assert _files(again) == _files(train_packs)
    other = make_specs("train", 60, seed=1, pack_size=40)
    assert _files(other) != _files(train_packs)
    assert [len(p) for p in train_packs] == [40, 20]


def test_there_are_hundreds_of_families_and_every_kind_of_bug():
    families = all_families()
    assert len({f.id for f in families}) == len(families) >= 300
    assert {kind_of(t) for t in all_templates()} == KINDS


def test_functions_of_one_family_vary_with_the_draw():
    family = all_families()[0]
    sources = {make_function(family, random.Random(i)).source for i in range(20)}
    assert len(sources) >= 10


def test_splits_share_no_family_and_no_template(train_packs, eval_packs):
    parts = split_parts(0)
    assert not {f.id for f in parts.families["train"]} & {f.id for f in parts.families["eval"]}
    assert not set(parts.templates["train"]) & set(parts.templates["eval"])
    for split, packs in (("train", train_packs), ("eval", eval_packs)):
        families = {f.id for f in parts.families[split]}
        for spec in (s for p in packs for s in p):
            assert {f.family.id for f in spec.functions} <= families, spec.folder
            assert spec.bug.template in parts.templates[split], spec.folder
    # the held-out set still draws several kinds and domains
    assert len({kind_of(s.bug.template) for p in eval_packs for s in p}) >= 4
    assert len({s.target_function.family.domain for p in eval_packs for s in p}) >= 3


def test_every_bug_is_one_line_caught_by_its_own_tests(train_packs):
    for spec in (s for p in train_packs for s in p):
        before = spec.module_source(False).splitlines()
        after = spec.module_source(True).splitlines()
        changed = [line for line in difflib.unified_diff(before, after, lineterm="", n=0) if line[:1] in "+-"]
        assert len(changed) == 4, (spec.folder, changed)  # ---/+++ headers, one line out, one line in
        assert 20 <= spec.lines <= 80
        assert spec.expected_failures
        assert all(spec.test_path in t for t in spec.expected_failures)
        # the tests the host expects to fail fail against the buggy function and pass against the gold
        namespace_good = {}
        exec(spec.module_source(False), namespace_good)  # noqa: S102 - generated code
        namespace_bad = {}
        exec(spec.module_source(True), namespace_bad)  # noqa: S102
        for name, (index, args, expected) in spec.tests.items():
            function = spec.functions[index].name
            assert repr(namespace_good[function](*args)) == expected
            failing = spec.test_id(name) in spec.expected_failures
            try:
                bad = repr(namespace_bad[function](*args))
            except Exception:  # noqa: BLE001
                bad = None
            assert (bad != expected) == failing, (spec.folder, name)


def test_the_test_file_imports_its_own_folder(train_packs):
    spec = train_packs[0][0]
    tree = ast.parse(spec.test_source())
    assert isinstance(tree.body[0], ast.ImportFrom) and tree.body[0].module == f"{spec.folder}.{spec.module}"
    assert len([n for n in tree.body if isinstance(n, ast.FunctionDef)]) == len(spec.tests)


def test_a_pack_never_holds_a_function_body_twice(train_packs):
    for pack in train_packs:
        keys = [body_key(f.source) for s in pack for f in s.functions]
        assert len(keys) == len(set(keys))
        # so no folder holds another task's target unmutated, whatever its name
        for spec in pack:
            correct = body_key(spec.target_function.source)
            buggy_everywhere = [
                body_key(ast.unparse(node))
                for other in pack
                for node in ast.parse(other.module_source(True)).body
                if isinstance(node, ast.FunctionDef)
            ]
            assert correct not in buggy_everywhere, spec.folder


@pytest.mark.parametrize(
    "template,needle",
    [
        ("comparison:Gt->LtE", "if score <= 3:"),
        ("boundary:Gt->GtE", "if score >= 3:"),
        ("arithmetic:Add->Sub", "count -= 1"),
        ("off_by_one:+1", "count = 1"),
        ("dropped_negation:not", "if score > 3:\n            count += min"),
        ("wrong_return:argument", "return scores"),
        ("swapped_args:call", "min(3, score)"),
    ],
)
def test_each_template_makes_the_edit_it_names(template, needle):
    source = (
        "def f(scores):\n    count = 0\n    for score in scores:\n        if not score > 3:\n"
        "            count += min(score, 3)\n        if score > 3:\n            count += 1\n    return count\n"
    )
    assert needle not in source
    bugs = find_bugs(source, [template])
    assert bugs, template
    assert any(needle in b.source for b in bugs), [b.source for b in bugs]
    for bug in bugs:
        compile_function(bug.source, "f")  # every mutant is valid Python


def _rows(tmp_path, packs, split, seed=0):
    """Rows as `build` writes them, with the statuses the host predicts (the container run that
    verifies them is the docker test's job); enough for what a task set lists."""
    from rollhub.envs.swe.lite.build import make_row

    rows = []
    for number, pack in enumerate(packs):
        for spec in pack:
            statuses = {spec.test_id(n): "PASSED" for n in spec.tests}
            statuses.update({t: "FAILED" for t in spec.expected_failures})
            row = make_row(
                spec, f"{split}-p{number:02d}", "img:latest", "0" * 40, "diff --git a/x b/x\n@@ x", statuses, ""
            )
            assert row is not None
            rows.append(row)
    return rows


def test_the_overlap_check_refuses_shared_content(tmp_path, train_packs, eval_packs):
    from rollhub.envs.swe.lite.env import SWELiteEnv

    path = tmp_path / "tasks.jsonl"
    rows = _rows(tmp_path, train_packs, "train") + _rows(tmp_path, eval_packs, "eval")
    for row, spec in zip(rows, [s for p in train_packs + eval_packs for s in p]):
        row["patch"] = f"diff --git a/{spec.module_path} b/{spec.module_path}\n@@ {spec.bug.source}"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "splits.json").write_text(
        json.dumps({"train": ["swe-lite-train-p00", "swe-lite-train-p01"], "eval": ["swe-lite-eval-p00"]})
    )
    train = SWELiteEnv(str(path), split="train").task_set()
    held_out = SWELiteEnv(str(path), split="test").task_set()
    assert len(SWELiteEnv(str(path), split="train").tasks) == 60
    assert not set(train) & set(held_out)
    assert any(k.startswith("swe-lite-family:") for k in held_out)
    assert any(k.startswith("swe-lite-template:") for k in held_out)
    # the same content under another id and pack is still refused: its family, template and fix
    copied = dict(rows[0], instance_id="copy", rollhub={**rows[0]["rollhub"], "package": "swe-lite-eval-p00"})
    copy_path = tmp_path / "copy" / "tasks.jsonl"
    copy_path.parent.mkdir()
    copy_path.write_text(json.dumps(copied) + "\n")
    shared = set(SWELiteEnv(str(copy_path), split="all").task_set()) & set(train)
    assert {k.split(":", 1)[0] for k in shared} == {"swe-lite-family", "swe-lite-template", "swe-lite-fix"}


def test_the_env_refuses_task_files_that_are_not_swe_lite(tmp_path):
    from rollhub.envs.swe.lite.env import SWELiteEnv
    from rollhub.envs.swe.tasks import SHIPPED_TASKS

    with pytest.raises(UserError, match="swe lite build"):
        SWELiteEnv(str(SHIPPED_TASKS), split="all")


def test_the_exploring_expert_edits_the_buggy_lines_in_context(train_packs, tmp_path):
    from rollhub.envs.swe.lite.build import bug_and_gold_patches, write_pack_repo
    from rollhub.envs.swe.lite.expert import hunk_texts

    pack = train_packs[0][:3]
    write_pack_repo(tmp_path / "repo", pack)
    _, golds = bug_and_gold_patches(tmp_path / "repo", pack)
    for spec in pack:
        old, new = hunk_texts(golds[spec.module_path])
        buggy, correct = spec.module_source(True), spec.module_source(False)
        assert buggy.count(old) == 1  # str_replace needs it unique
        assert buggy.replace(old, new) == correct
