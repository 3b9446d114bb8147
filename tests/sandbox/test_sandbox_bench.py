"""The sandbox benchmark runs end to end on the real engine and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.docker


def test_bench_sandbox_smoke(docker_client, tmp_path):
    argv = [
        sys.executable,
        "-m",
        "rollhub.cli",
        "bench",
        "sandbox",
        "--out",
        str(tmp_path),
        "--set",
        "starts=2",
        "--set",
        "execs=5",
        "--set",
        "concurrency=[2]",
        "--set",
        "idle=2",
    ]
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads((tmp_path / "sandbox.json").read_text())
    assert results["leaked_containers"] == 0
    assert results["latency"]["start_p50_ms"] > 0 and results["latency"]["exec_p50_ms"] > 0
    assert [row["exec_mode"] for row in results["exec"]] == ["persistent-shell", "docker-exec"]
    assert all(row["exec_p50_ms"] > 0 and not row["fell_back_to_docker_exec"] for row in results["exec"])
    assert [(row["exec_mode"], row["concurrency"], row["failures"]) for row in results["throughput"]] == [
        ("persistent-shell", 2, 0),
        ("docker-exec", 2, 0),
    ]
    assert results["memory"]["idle_containers"] == 2


@pytest.mark.slow
def test_bench_sandbox_measures_the_non_root_user_and_the_disk_budget(docker_client, tmp_path):
    from rollhub.sandbox import images

    source = tmp_path / "work"
    source.mkdir()
    (source / "code.py").write_text("x = 1\n")
    image = images.build_layered_image(
        docker_client,
        "rollhub/base:bookworm",
        {"/work": str(source)},
        [],
        "rollhub/pytest-bench-user",
        workdir="/work",
        sandbox_user="agent",
    )
    argv = [sys.executable, "-m", "rollhub.cli", "bench", "sandbox", "--out", str(tmp_path)]
    for setting in (
        "starts=1",
        "execs=2",
        "concurrency=[1]",
        "idle=1",
        "exec_modes=[persistent-shell]",
        f"hardening_image={image}",
        "hardening_rounds=2",
        "hardening_execs=3",
        "hardening_disk_mb=32",
        "hardening_writable_dirs=[/tmp,/home]",
    ):
        argv += ["--set", setting]
    try:
        completed = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    finally:
        docker_client.api.remove_image(image, force=True)
    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads((tmp_path / "sandbox.json").read_text())
    rows = {(row["user"], row["disk_budget_mb"]): row for row in results["hardening"]}
    assert set(rows) == {("root", "none"), ("root", 32), ("agent", "none"), ("agent", 32)}
    assert all(row["start_p50_ms"] > 0 and row["exec_p99_ms"] >= row["exec_p50_ms"] > 0 for row in rows.values())
    assert rows[("agent", 32)]["disk_mode"] in ("tmpfs", "storage-opt") and results["leaked_containers"] == 0
