"""`rollhub bench envs` runs end to end on a small budget and writes sane numbers."""

import json

from rollhub.cli import main


def test_bench_envs_quick(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "envs",
            "--quick",
            "--out",
            str(out),
            "--set",
            "envs=[rollhub/Sokoban-v0, rollhub/Math-v0]",
            "--set",
            "rooms=50",
            "--set",
            "steps=50",
        ]
    )
    assert code == 0
    result = json.loads((out / "env_throughput.json").read_text())
    rows = {row["env"]: row for row in result["envs"]}
    assert set(rows) == {"rollhub/Sokoban-v0", "rollhub/Math-v0"}
    for row in rows.values():
        assert 0 < row["reset_p50_ms"] <= row["reset_p95_ms"]
        assert row["steps_per_s"] > 0 and row["steps"] == 50
        assert row["rss_kib_per_env"] >= 0 and row["traced_kib_per_env"] > 0
    generation = result["sokoban_generation"]
    assert generation["rooms"] == 50 and generation["rooms_per_s"] > 0
    printed = capsys.readouterr().out
    assert "rooms/s" in printed and "rollhub/Sokoban-v0" in printed


def test_bench_envs_rejects_unknown_ids(tmp_path, capsys):
    assert main(["bench", "envs", "--quick", "--out", str(tmp_path), "--set", "envs=[rollhub/Nope-v0]"]) == 2
    assert "unknown env ids" in capsys.readouterr().err


def test_bench_envs_skips_envs_it_cannot_run(tmp_path, capsys, monkeypatch):
    from rollhub.envs import checker
    from rollhub.envs.registry import register

    register("test/NeedsDocker-v0", "rollhub.envs.sokoban.env:SokobanEnv", requires=("docker",), gymnasium_compat=False)
    monkeypatch.setattr(checker, "_docker_status", False)
    try:
        code = main(
            [
                "bench",
                "envs",
                "--quick",
                "--out",
                str(tmp_path),
                "--set",
                "envs=[test/NeedsDocker-v0]",
                "--set",
                "rooms=10",
            ]
        )
        assert code == 0
        result = json.loads((tmp_path / "env_throughput.json").read_text())
        assert result["envs"] == [] and "Docker" in result["skipped"]["test/NeedsDocker-v0"]
        assert "skip test/NeedsDocker-v0" in capsys.readouterr().out
    finally:
        from rollhub.envs.registry import _REGISTRY

        _REGISTRY.pop("test/NeedsDocker-v0", None)
