"""Source-prefixed ids in the registry and `rollhub envs list`, and `rollhub bench env` cards
(none of these need the other standards' packages)."""

from __future__ import annotations

import json

import pytest

from rollhub.bench.env_card import predicted_speedups, write_table
from rollhub.cli import main
from rollhub.core.errors import UserError
from rollhub.envs.registry import SOURCES, source_of, source_spec, spec
from rollhub.envs.run_checks import check_env_registered


def test_source_ids_resolve_without_registration():
    assert source_of("rollhub/Sokoban-v0") == "rollhub"
    assert source_of("bench/LatencySWE-v0") == "plugin:bench"
    for prefix, target in [("gem", "game:Sokoban-v0-easy"), ("openenv", "ws://h:1"), ("harbor", "/t")]:
        built = spec(f"{prefix}:{target}")
        assert built.kwargs == {"target": target} and built.extra == SOURCES[prefix][1]
        assert source_of(built.id) == prefix
        check_env_registered(built.id)  # a run accepts it before any model loads
    assert source_spec("gem:") is None and source_spec("nosuch:thing") is None
    with pytest.raises(UserError):
        spec("nosuch:thing")


def test_envs_list_shows_each_source(capsys):
    assert main(["envs", "list", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    sources = {row["source"] for row in rows}
    assert {"rollhub", "gem", "openenv", "verifiers"} <= sources
    assert all(row["id"].startswith(row["source"] + ":") for row in rows if row["source"] in SOURCES)
    assert main(["envs", "list"]) == 0
    text = capsys.readouterr().out
    assert "SOURCE" in text and "harbor:<" in text


def test_predicted_speedup_grows_with_the_latency_spread():
    even = [[0.1] * 10 for _ in range(8)]
    spread = [[0.1] * 10 for _ in range(7)] + [[0.1] * 9 + [5.0]]
    calm, wild = predicted_speedups(even, batch=8), predicted_speedups(spread, batch=8)
    assert calm["lockstep_over_env_async"] == pytest.approx(1.0)
    assert calm["prop2_bound_inf"] == pytest.approx(2.0)  # rho = longest / mean = 1 for equal episodes
    assert wild["prop2_bound_inf"] > calm["prop2_bound_inf"]
    # one slow step per turn in different episodes: lockstep pays every one of them
    staggered = [[0.1] * t + [1.0] + [0.1] * (9 - t) for t in range(10)]
    assert predicted_speedups(staggered, batch=10)["lockstep_over_env_async"] > 2.0


def test_bench_env_writes_a_card_and_the_table(tmp_path, capsys):
    out = tmp_path / "cards" / "sokoban.json"
    assert main(["bench", "env", "rollhub/Sokoban-v0", "--set", "episodes=2", "--out", str(out)]) == 0
    card = json.loads(out.read_text())
    for key in (
        "reset_p50_s",
        "step_p99_s",
        "failure_rate",
        "rss_mb",
        "containers_per_episode",
        "container_s_per_episode",
        "tokens_per_episode",
        "lockstep_over_env_async",
        "prop2_bound_inf",
    ):
        assert isinstance(card[key], float | int), key
    assert card["source"] == "rollhub" and card["tokens_per_episode"] > 0 and card["failure_rate"] == 0.0
    table = write_table(out.parent)
    assert table.count("\n") == 2 and "`rollhub/Sokoban-v0`" in table
    assert main(["bench", "env"]) == 2  # no id: a one-line error
