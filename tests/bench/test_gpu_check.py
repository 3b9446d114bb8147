"""benchmarks/gpu_check.sh: its CPU mode (--dry-run) runs every step end to end on a tiny shape.

The GPU mode is the same script with the Qwen3-0.6B shape and model.device=cuda; only the
`gpu`-marked test runs it, on a machine with a CUDA device.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def run_check(tmp_path: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "gpu_check"), "STEPS": "2", "PYTHON": sys.executable}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def test_unknown_argument_is_a_usage_error(tmp_path):
    result = run_check(tmp_path, "--fast", timeout_s=30)
    assert result.returncode == 2 and "usage:" in result.stderr


@pytest.mark.slow
def test_dry_run_builds_trains_and_prints_the_split(tmp_path):
    result = run_check(tmp_path, "--dry-run", "--target", "py312-cu130", timeout_s=1200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "gpu_check: OK (cpu), 2 step(s) SKIPPED" in result.stdout  # SGLang and the allocator probe
    assert "5. SGLang server: SKIPPED (SGLang needs a GPU)" in result.stdout
    assert "probe gloo_push_into_device: OK" in result.stdout
    assert "probe memory_plan_vs_allocator: SKIPPED" in result.stdout
    assert "probe logprob_gap_engine_vs_trainer: OK" in result.stdout
    assert re.search(r"pack for py312-cu130: \d+ wheels .* MiB of 64 MiB", result.stdout)
    assert "inprocess: 2 steps" in result.stdout  # the split table of the in-process run
    assert "serve: 2 steps" in result.stdout  # a launched rollhub serve, weights pushed between processes
    assert "fsdp step: 2 rank(s) on cpu (gloo), bf16 compute, fp32 master" in result.stdout
    assert "gen_tok/s" in result.stdout and "phases_s" in result.stdout
    assert (tmp_path / "gpu_check" / "model-tiny" / "config.json").is_file()


@pytest.mark.gpu
def test_gpu_check_on_a_gpu(tmp_path):
    result = run_check(tmp_path, timeout_s=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "gpu_check: OK (cuda)" in result.stdout
