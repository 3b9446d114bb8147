"""The patch file of `rollhub swe agree --patches`: rows are checked with the fix in the
message, identical rows are graded once and counted, and the agreement is told per source
(a source whose patches all agree must not hide one that does not)."""

from __future__ import annotations

import json

import pytest

from rollhub.core.errors import UserError
from rollhub.envs.swe.grading.agreement import Verdicts, agreement_by_source, format_agreement, load_patch_rows


def _write(tmp_path, lines):
    path = tmp_path / "patches.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_identical_rows_are_graded_once_and_counted(tmp_path):
    row = {"instance_id": "t1", "patch": "", "source": "model", "seed": 3}
    other = {"instance_id": "t1", "patch": "diff --git a/x b/x\n", "source": "model"}
    rows = load_patch_rows(_write(tmp_path, [row, {**row, "seed": 4}, other, "", {**row, "source": "wrong"}]))
    assert [(r.instance_id, r.source, r.patch, r.count) for r in rows] == [
        ("t1", "model", "", 2),
        ("t1", "model", other["patch"], 1),
        ("t1", "wrong", "", 1),
    ]
    assert rows[0].patch_id != rows[1].patch_id and len(rows[0].patch_id) == 12


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ('["t1", "", "model"]', "must be an object"),
        ({"instance_id": "t1", "patch": "", "source": ""}, "source missing"),
        ({"instance_id": "t1", "source": "model"}, "patch missing"),
        ({"instance_id": 7, "patch": "", "source": "model"}, "instance_id missing"),
        ({"instance_id": "t1", "patch": None, "source": "model"}, "patch missing"),
    ],
)
def test_a_bad_row_is_refused_with_its_line(tmp_path, line, message):
    good = {"instance_id": "t0", "patch": "", "source": "model"}
    with pytest.raises(UserError, match=rf"patches.jsonl:2: .*{message}"):
        load_patch_rows(_write(tmp_path, [good, line]))


def test_missing_or_empty_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_patch_rows(tmp_path / "absent.jsonl")
    with pytest.raises(UserError, match="holds no rows"):
        load_patch_rows(_write(tmp_path, [""]))


def test_agreement_is_reported_per_source():
    rows = [
        Verdicts("t1", "model", 0.0, None, "the official run raised: patch apply failed", patch_id="a", count=5),
        Verdicts("t3", "model", 0.0, None, "the official run raised: docker died", patch_id="e", patch_chars=9),
        Verdicts("t2", "model", 0.0, False, patch_id="b", patch_chars=120),
        Verdicts("t1", "wrong", 1.0, False, patch_id="c", patch_chars=80),  # a disagreement
        Verdicts("t2", "wrong", 1.0, True, patch_id="d", patch_chars=90),
    ]
    by_source = agreement_by_source(rows)
    assert by_source["model"] == {
        "patches": 3,
        "rows": 7,
        "agree": 3,
        "agree_rows": 7,
        "nonempty": 2,
        "ours_resolved": 0,
        "official_resolved": 0,
        "official_apply_failed": 1,
        "official_error": 1,
    }
    assert by_source["wrong"]["agree"] == 1 and by_source["wrong"]["ours_resolved"] == 2
    table = format_agreement(rows)
    assert "4/5 verdicts agree" in table
    assert "wrong: 1/2 distinct patches agree" in table and "model: 3/3 distinct patches agree (7 rows" in table
    assert table.splitlines()[4].endswith("NO")


def test_agree_refuses_a_row_for_an_unknown_task_before_any_container(tmp_path, capsys):
    from rollhub.cli import main
    from rollhub.envs.swe.tasks import SHIPPED_TASKS

    patches = _write(tmp_path, [{"instance_id": "no-such-task", "patch": "", "source": "model"}])
    assert main(["swe", "agree", str(SHIPPED_TASKS), "--patches", str(patches)]) == 2
    assert "instance ids not in" in capsys.readouterr().err
