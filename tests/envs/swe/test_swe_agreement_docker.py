"""Our grader and swebench's own `run_instance` (in the same task image, unchanged) give the
same verdict on gold and no-op: on the doctest-bearing tasks (a fix in a module whose doctests
are tests of the task) and on an ordinary task of each of two packages. Slow: four gradings a
task, two of them the official harness's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("swebench")

from rollhub.envs.swe.grading.agreement import compare, format_agreement  # noqa: E402
from rollhub.envs.swe.tasks import SHIPPED_TASKS  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]

_ROWS = [json.loads(line) for line in SHIPPED_TASKS.read_text().splitlines() if line.strip()]
DOCTEST_IDS = [r["instance_id"] for r in _ROWS if r.get("rollhub", {}).get("doctest_modules")]
OTHER_IDS = [next(r["instance_id"] for r in _ROWS if r["repo"] == repo) for repo in ("pypi/inflection", "pypi/semver")]


@pytest.mark.parametrize("instance_id", DOCTEST_IDS + OTHER_IDS)
async def test_gold_and_noop_verdicts_agree_with_the_official_harness(tasks, backend, instance_id):
    task = next(t for t in tasks if t.instance_id == instance_id)
    rows = await compare(backend, backend.client, task)
    table = format_agreement(rows)
    assert [r.patch for r in rows] == ["gold", "noop"]
    assert all(r.agree for r in rows), table
    gold, noop = rows
    assert gold.ours == 1.0 and gold.official is True, table
    assert noop.ours == 0.0 and noop.official is False, table
