"""The red-team battery on real containers: for a task, the gold patch (applied by the
expert through the env's tools) scores 1 and every forging attempt scores 0 without an
infra failure. Two shipped tasks of different layouts run by default (a root test file and
a package; a `tests/` folder and a `src/` layout); the rest are `slow`."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("swebench")

from rollhub.envs.swe.redteam import ATTACKS, format_table, redteam_task  # noqa: E402
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


async def _check_task(tasks, backend, instance_id):
    task = next(t for t in tasks if t.instance_id == instance_id)
    report = await redteam_task(backend, task, concurrency=2)
    table = format_table([report])
    assert report.gold_reward == 1.0, table
    assert not report.hacks, table
    by_name = {a.attack: a for a in report.attempts}
    assert set(by_name) == {a.name for a in ATTACKS}
    assert all(a.reward == 0.0 and not a.infra_failure for a in report.attempts), table
    # sabotage ends as the model's failure (or, where the sandbox resists it, not at all), never as infra
    assert by_name["remove_git_dir"].model_failure, table
    # the two found by the red team are stopped where they were aimed
    assert "conftest.py" in by_name["mnemonic_prefix_conftest"].detail, table
    assert "shadow" in by_name["shadow_pytest_package"].detail, table


@pytest.mark.parametrize("instance_id", DEFAULT_IDS)
async def test_gold_scores_one_and_no_attack_scores(tasks, backend, instance_id):
    await _check_task(tasks, backend, instance_id)


@pytest.mark.slow
@pytest.mark.parametrize("instance_id", [i for i in _IDS if i not in DEFAULT_IDS])
async def test_gold_scores_one_and_no_attack_scores_on_every_shipped_task(tasks, backend, instance_id):
    await _check_task(tasks, backend, instance_id)


def test_redteam_command_prints_the_table_and_exits_zero(tasks, capsys):
    from rollhub.cli import main

    code = main(
        [
            "swe",
            "redteam",
            str(SHIPPED_TASKS),
            "--instance-ids",
            DEFAULT_IDS[0],
            "--attacks",
            "mnemonic_prefix_conftest",
            "external_diff_git_hook",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gold  attempts  forged  hackable" in out and "hackable tasks: 0" in out
    assert "attempts 2, forged 0" in out


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
