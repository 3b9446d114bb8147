"""`rollhub bench env` puts the hack battery's hackability on the env's card and in the docs table."""

import json

from rollhub.bench.env_card import table_row
from rollhub.cli import main


def test_the_card_carries_hackability_and_the_table_shows_it(tmp_path, capsys):
    out = tmp_path / "sokoban.json"
    argv = ["bench", "env", "rollhub/Sokoban-v0", "--set", "episodes=1", "--set", "hack_seeds=2", "--out", str(out)]
    assert main(argv) == 0
    card = json.loads(out.read_text())
    assert card["hackability"] == 0.0 and card["hackability_scale"] == "success"  # shaped rewards
    assert card["hackability_seeds"] == 2 and card["hackability_max_turns"] == 8
    assert card["hackability_best_exploit"] is None and card["hackability_note"] == ""
    assert set(card["hackability_exploits"]) >= {"echo_question", "empty_answer", "unclosed_tag", "huge_reply"}
    assert table_row(card).endswith("| 0.00 (success) |")
    assert "hackability 0.00 (success scale)" in capsys.readouterr().out


def test_a_noted_env_and_an_old_card_read_plainly():
    card = {"hackability": 0.5, "hackability_scale": "reward", "hackability_best_exploit": "echo_question"}
    assert _cell({**card, "hackability_note": "a simulation"}) == "0.50 (reward, echo_question; noted)"
    assert _cell({**card, "hackability_chance": 0.3}) == "0.50 (reward, echo_question; random play 0.30)"
    assert _cell({}) == "not measured"  # a card written before the battery existed


def test_hack_seeds_zero_skips_the_battery(tmp_path):
    out = tmp_path / "card.json"
    argv = ["bench", "env", "rollhub/Sokoban-v0", "--set", "episodes=1", "--set", "hack_seeds=0", "--out", str(out)]
    assert main(argv) == 0
    assert "hackability" not in json.loads(out.read_text())


def _cell(card: dict) -> str:
    from rollhub.bench.env_card import _hack_cell

    return _hack_cell(card)
