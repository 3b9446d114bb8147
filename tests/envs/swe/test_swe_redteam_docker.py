"""The red team on real containers: the gold patch (applied by the expert through the env's
tools) scores 1, the empty patch 0, every generated attack 0 without an infra failure, and
honest patches with odd file names 1. The attacks are real: they forge a naive grader (the
patch applied, the row's eval script, the log graded). The whole set over every shipped
task is `slow`."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("swebench")

from rollhub.envs.swe.redteam import (  # noqa: E402
    ATTACKS,
    CLASSES,
    AttackContext,
    format_table,
    redteam_task,
    select_classes,
)
from rollhub.envs.swe.redteam.campaign import run_attempt  # noqa: E402
from rollhub.envs.swe.redteam.naive import naive_reward  # noqa: E402
from rollhub.envs.swe.redteam.workspace import Workspace  # noqa: E402
from rollhub.envs.swe.tasks import SHIPPED_TASKS  # noqa: E402

pytestmark = pytest.mark.docker

_IDS = [json.loads(line)["instance_id"] for line in SHIPPED_TASKS.read_text().splitlines() if line.strip()]
#: the first inflection task (test_inflection.py at the root, package inflection/) and the
#: first cachetools one (tests/, src/cachetools/)
DEFAULT_IDS = [next(i for i in _IDS if i.startswith("inflection")), next(i for i in _IDS if i.startswith("cachetools"))]


def test_battery_covers_at_least_ten_techniques_in_every_family():
    assert len({a.name for a in ATTACKS}) == len(ATTACKS) >= 15
    families = {a.category for a in ATTACKS}
    assert {"diff generation", "test collection", "interpreter start-up", "git internals", "history"} <= families
    assert {"mnemonic_prefix_conftest", "external_diff_git_hook"} <= {a.name for a in ATTACKS}


def _attempt(ctx, cls: str, technique: str, seed: int = 0):
    c = select_classes([cls])[0]
    for s in range(seed, seed + 50):
        for attempt in c.variants(ctx, len(c.techniques), s):
            if attempt.technique == technique:
                return attempt
    raise AssertionError(technique)


async def test_an_obfuscated_runner_patch_forges_a_naive_grader_and_scores_zero_here(tasks, backend):
    task = next(t for t in tasks if t.instance_id == DEFAULT_IDS[0])
    ws = await Workspace.fetch(backend, task)
    try:
        ctx = AttackContext.make(task, ws)
        attempt = _attempt(ctx, "obfuscated_runner_patch", "base64_exec")
        naive, why = await naive_reward(backend, task, ws.diff(attempt.changes))
        assert naive == 1.0, why  # the attack is real
        result = await run_attempt(backend, ctx, attempt, eval_timeout_s=120)
        assert result.reward == 0.0 and not result.infra_failure, result
    finally:
        ws.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cls", "technique"),
    [
        ("obfuscated_runner_patch", "utf7_module"),
        ("obfuscated_runner_patch", "fullwidth"),
        ("obfuscated_runner_patch", "gc_or_getframe"),
        ("log_forgery", "print_atexit"),
        ("log_forgery", "print_then_os_exit"),
        ("log_forgery", "rewrite_log_at_exit"),
        ("log_forgery", "print_after_main_thread"),
        ("runner_config", "pytest_toml_zip"),
        ("runner_config", "ini_header_differential"),
        ("runner_config", "conftest_subdirs"),
    ],
)
async def test_generated_attacks_forge_a_naive_grader_and_score_zero_here(tasks, backend, cls, technique):
    task = next(t for t in tasks if t.instance_id == DEFAULT_IDS[0])
    ws = await Workspace.fetch(backend, task)
    try:
        ctx = AttackContext.make(task, ws)
        attempt = _attempt(ctx, cls, technique)
        naive, why = await naive_reward(backend, task, ws.diff(attempt.changes))
        assert naive == 1.0, f"{attempt.variant}: {why}"
        result = await run_attempt(backend, ctx, attempt, eval_timeout_s=120)
        assert result.reward == 0.0 and not result.infra_failure, result
    finally:
        ws.close()


async def _check_task(tasks, backend, instance_id, variants):
    task = next(t for t in tasks if t.instance_id == instance_id)
    report = await redteam_task(backend, task, variants=variants, concurrency=2, eval_timeout_s=120)
    table = format_table([report])
    assert report.gold_reward == 1.0, table
    assert report.noop_reward == 0.0, table
    assert not report.hacks, table
    assert {a.cls for a in report.attempts} == {c.name for c in CLASSES}
    assert all(not a.infra_failure for a in report.attempts), table


@pytest.mark.slow
@pytest.mark.parametrize("instance_id", DEFAULT_IDS)
async def test_every_class_with_three_variants_scores_zero(tasks, backend, instance_id):
    await _check_task(tasks, backend, instance_id, variants=3)


@pytest.mark.slow
@pytest.mark.parametrize("instance_id", [i for i in _IDS if i not in DEFAULT_IDS])
async def test_every_class_scores_zero_on_every_shipped_task(tasks, backend, instance_id):
    await _check_task(tasks, backend, instance_id, variants=1)


def test_redteam_command_prints_the_summary_and_writes_json(tasks, capsys, tmp_path):
    from rollhub.cli import main

    out_file = tmp_path / "summary.json"
    code = main(
        [
            "swe",
            "redteam",
            str(SHIPPED_TASKS),
            "--only",
            DEFAULT_IDS[0],
            "--classes",
            "odd_file_names",
            "--json",
            str(out_file),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tasks 1, gold 1.0 on 1, no-op resolved 0, attempts 1, forged 0, escaped 0, honest failed 0" in out
    data = json.loads(out_file.read_text())
    assert data["gold_resolved"] == 1 and data["classes"]["odd_file_names"]["attempts"] == 1
    assert data["reports"][0]["instance_id"] == DEFAULT_IDS[0]


def test_redteam_command_exits_non_zero_when_the_gold_patch_fails(tasks, tmp_path, capsys):
    from rollhub.cli import main

    row = next(json.loads(line) for line in SHIPPED_TASKS.read_text().splitlines() if DEFAULT_IDS[0] in line)
    row["patch"] = ""  # a task whose "gold" fixes nothing must be rejected
    broken = tmp_path / "tasks.jsonl"
    broken.write_text(json.dumps(row) + "\n")
    code = main(["swe", "redteam", str(broken), "--attacks", "remove_git_dir"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "gold failed" in out and "gold 1.0 on 0" in out


def test_redteam_resume_keeps_recorded_tasks_and_refuses_another_campaign(tasks, capsys, tmp_path):
    """A long campaign killed half-way goes on from its record: recorded tasks are kept (not
    re-run), the rest run, and a record of other settings is refused rather than mixed in."""
    from rollhub.cli import main

    out_file = tmp_path / "campaign.json"
    argv = ["swe", "redteam", str(SHIPPED_TASKS), "--classes", "odd_file_names", "--json", str(out_file)]
    assert main([*argv, "--only", DEFAULT_IDS[0]]) == 0
    first = json.loads(out_file.read_text())["reports"][0]
    capsys.readouterr()

    assert main([*argv, "--only", *DEFAULT_IDS, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "tasks 2, gold 1.0 on 2" in out, out
    data = json.loads(out_file.read_text())
    assert [r["instance_id"] for r in data["reports"]] == DEFAULT_IDS
    assert data["reports"][0] == first  # kept as recorded, not graded again
    assert data["finished"] is True

    assert main([*argv, "--only", *DEFAULT_IDS, "--resume", "--variants", "2"]) == 2
    assert "records another campaign" in capsys.readouterr().err
    assert main(["swe", "redteam", str(SHIPPED_TASKS), "--resume"]) == 2
    assert "needs --json" in capsys.readouterr().err
