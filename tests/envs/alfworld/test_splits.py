"""ALFWorld train/eval splits: generated train games, valid_unseen untouched, overlap refused."""

import json
import shutil

import pytest

from rollhub.core.errors import UserError
from tests.envs.alfworld.conftest import needs_engine

pytestmark = needs_engine


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two games made in two runs (1, then resumed to 2) and two made in one run."""
    from rollhub.envs.alfworld.generate import generate_games

    root = tmp_path_factory.mktemp("alfworld_splits")
    resumed, direct = root / "resumed", root / "direct"
    first = generate_games(1, resumed, seed=3, progress=False)
    second = generate_games(2, resumed, seed=3, progress=False)
    generate_games(2, direct, seed=3, progress=False)
    return resumed, direct, first, second


def _config(env_kwargs, eval_kwargs=None):
    from rollhub.trainer.config import EvalEnvConfig, RunConfig

    config = RunConfig()
    config.env.id = "rollhub/ALFWorld-v0"
    config.env.kwargs = dict(env_kwargs)
    config.eval.env = EvalEnvConfig(kwargs=dict(eval_kwargs or {}))
    return config


def test_generation_resumes_and_equals_one_uninterrupted_run(made):
    resumed, direct, first, second = made
    assert len(first.written) == 1 and second.resumed == 1 and len(second.written) == 2
    manifest = json.loads((resumed / "make-games.json").read_text())
    assert manifest == json.loads((direct / "make-games.json").read_text())
    for game in manifest["games"]:
        assert (resumed / game / "game.tw-pddl").read_bytes() == (direct / game / "game.tw-pddl").read_bytes()


def test_generated_rooms_are_alfreds_training_rooms_never_the_unseen_ones(made):
    from alfworld.gen.constants import TRAIN_SCENE_NUMBERS

    from rollhub.envs.alfworld.games import list_games
    from rollhub.envs.alfworld.generate import UNSEEN_FLOORPLANS, floorplans

    unseen_rooms = {int(g.name.split("/")[0].rsplit("-", 1)[1]) for g in list_games("valid_unseen")}
    assert unseen_rooms == set(UNSEEN_FLOORPLANS)
    for kind in ("kitchen", "livingroom", "bedroom", "bathroom"):
        assert floorplans(kind) and not set(floorplans(kind)) & unseen_rooms
    resumed = made[0]
    for traj in resumed.rglob("traj_data.json"):
        room = json.loads(traj.read_text())["scene"]["floor_plan"]
        assert room in TRAIN_SCENE_NUMBERS and room not in unseen_rooms


def test_resuming_with_another_seed_or_into_a_foreign_folder_is_refused(made, tmp_path):
    from rollhub.envs.alfworld.generate import generate_games

    with pytest.raises(UserError, match="seed 3"):
        generate_games(4, made[0], seed=4, progress=False)
    foreign = tmp_path / "foreign" / "x" / "trial"
    foreign.mkdir(parents=True)
    (foreign / "game.tw-pddl").write_text("{}")
    with pytest.raises(UserError, match="not made by this command"):
        generate_games(1, tmp_path / "foreign", progress=False)


def test_training_on_the_evaluation_games_is_refused_in_one_line():
    from rollhub.trainer.build import check_run_envs

    with pytest.raises(UserError) as caught:
        check_run_envs(_config({"split": "valid_unseen"}))  # eval.env defaults to the training env
    assert "evaluation overlaps training: 134 of the" in str(caught.value) and "\n" not in str(caught.value)


def test_a_copied_evaluation_game_is_caught_by_content(made, tmp_path):
    from rollhub.envs.alfworld.games import list_games
    from rollhub.trainer.build import check_run_envs

    train_dir = tmp_path / "train"
    shutil.copytree(made[0], train_dir)
    leaked = list_games("valid_unseen")[7]
    shutil.copytree(leaked.path.parent, train_dir / "renamed-task" / "trial_x")
    with pytest.raises(UserError, match="1 of the 134"):
        check_run_envs(_config({"game_dir": str(train_dir)}, {"split": "valid_unseen", "game_dir": None}))
    with pytest.raises(UserError, match="split .* or game_dir .* not both"):  # eval inherited game_dir
        check_run_envs(_config({"game_dir": str(train_dir)}, {"split": "valid_unseen"}))


def test_generated_train_games_against_valid_unseen_pass(made):
    from rollhub.trainer.build import check_run_envs, make_eval_env_factory

    config = _config({"game_dir": str(made[0]), "max_steps": 9}, {"split": "valid_unseen", "game_dir": None})
    check_run_envs(config)
    env = make_eval_env_factory(config)()
    assert len(env.games) == 134 and env.max_steps == 9
    assert config.eval_env_id == "rollhub/ALFWorld-v0"


def test_missing_train_split_names_the_command_that_makes_it(tmp_path, monkeypatch):
    from rollhub.envs.alfworld.games import list_games

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(UserError, match="rollhub alfworld make-games"):
        list_games("train")
