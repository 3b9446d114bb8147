"""Game discovery: the bundled valid_unseen split, filters, ALFWORLD_DATA (no engine needed)."""

import hashlib
import json
import shutil

import pytest

from rollhub.core.errors import UserError
from rollhub.envs.alfworld.games import BUNDLED_DATA, data_root, list_game_dir, list_games, normalise_task_types

README_SHA256 = "5032d23181f29c6fc48873961280b9b1145f57640ebfd9291517f29a44995cd0"
EXPECTED_COUNTS = {
    "pick_and_place_simple": 24,
    "look_at_obj_in_light": 18,
    "pick_clean_then_place_in_recep": 31,
    "pick_heat_then_place_in_recep": 23,
    "pick_cool_then_place_in_recep": 21,
    "pick_two_obj_and_place": 17,
}


def test_bundled_split_is_the_real_valid_unseen(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert data_root() == BUNDLED_DATA
    games = list_games("valid_unseen")
    assert len(games) == 134
    counts = {}
    for game in games:
        counts[game.task_type] = counts.get(game.task_type, 0) + 1
        assert (game.path.parent / "traj_data.json").is_file()
    assert counts == EXPECTED_COUNTS
    digest = hashlib.sha256(b"".join(g.path.read_bytes() for g in sorted(games, key=lambda g: str(g.path)))).hexdigest()
    assert digest == README_SHA256  # byte-exact copy of the files the data README describes


def test_every_bundled_game_has_a_walkthrough():
    for game in list_games():
        data = json.loads(game.path.read_text())
        assert data["walkthrough"] and data["solvable"] is True


def test_task_type_filters_accept_ids_and_names():
    assert normalise_task_types([2, "pick_two_obj_and_place", "2"]) == (
        "look_at_obj_in_light",
        "pick_two_obj_and_place",
    )
    assert len(normalise_task_types(None)) == 6
    looks = list_games(task_types=[2])
    assert len(looks) == 18 and {g.task_type for g in looks} == {"look_at_obj_in_light"}
    with pytest.raises(UserError, match="unknown ALFWorld task type"):
        normalise_task_types([7])


def test_missing_split_explains_how_to_get_it(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(UserError, match="ALFWORLD_DATA"):
        list_games("valid_seen")  # (a missing train split names make-games: test_splits.py)
    with pytest.raises(UserError, match="unknown ALFWorld split"):
        list_games("test")


def test_alfworld_data_points_at_another_download(monkeypatch, tmp_path):
    source = list_games(task_types=[6])[0]
    target = tmp_path / "json_2.1.1" / "valid_seen" / source.path.parent.parent.name / source.path.parent.name
    target.mkdir(parents=True)
    shutil.copy(source.path, target / "game.tw-pddl")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    games = list_games("valid_seen")
    assert [g.name for g in games] == [source.name]
    assert list_game_dir(tmp_path)[0].task_type == "pick_two_obj_and_place"


def test_missing_engine_is_a_one_line_user_error(monkeypatch, capsys):
    import importlib.util

    from rollhub.cli import main
    from rollhub.core.errors import MissingExtraError
    from rollhub.envs.alfworld import env as env_module

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "textworld" else real_find_spec(name, *a)
    )
    with pytest.raises(MissingExtraError, match=r"pip install -e '\.\[alfworld\]'"):
        env_module.ALFWorldEnv()
    assert main(["alfworld", "make-games", "--n", "1", "--out", "unused"]) == 2
    assert "alfworld" in capsys.readouterr().err
