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
