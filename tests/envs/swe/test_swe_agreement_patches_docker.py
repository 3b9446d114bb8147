"""`rollhub swe agree --patches`: given patches are graded by our grader and by swebench's own
`run_instance`, and the verdicts agree on a correct patch and on a non-empty honest but wrong
one (the kind a policy submits most). Slow: four gradings, two of them the official harness's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("swebench")

from rollhub.envs.swe.tasks import SHIPPED_TASKS  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASK = "inflection__inflection-0.5.1-ff48be79"  # ordinal(): the bug maps 4 (not 3) to "rd"


def test_agree_grades_given_patches_with_both_graders(tasks, tmp_path, capsys):
    from rollhub.cli import main

    gold = next(t for t in tasks if t.instance_id == TASK).patch
    wrong = gold.replace('+            3: "rd",', '+            5: "rd",')  # edits the right line, wrongly
    assert wrong != gold
    patches = tmp_path / "patches.jsonl"
    rows = [
        {"instance_id": TASK, "patch": wrong, "source": "wrong-fix"},
        {"instance_id": TASK, "patch": gold, "source": "gold-copy"},
    ]
    patches.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out_file = tmp_path / "agreement.json"
    code = main(["swe", "agree", str(SHIPPED_TASKS), "--patches", str(patches), "--json", str(out_file)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2/2 verdicts agree" in out, out
    record = json.loads(out_file.read_text())
    verdicts = {v["patch"]: v for v in record["verdicts"]}
    assert verdicts["wrong-fix"]["ours"] == 0.0 and verdicts["wrong-fix"]["official"] is False, out
    assert verdicts["wrong-fix"]["patch_chars"] == len(wrong)
    assert verdicts["gold-copy"]["ours"] == 1.0 and verdicts["gold-copy"]["official"] is True, out
    assert record["by_source"]["wrong-fix"]["agree"] == 1 and record["by_source"]["gold-copy"]["agree"] == 1
