"""benchmarks/gpu_check.sh on a bare GPU machine: the wheels it asks for leave the machine's torch
and numpy alone, and it installs nothing from an index. (The GPU run itself: test_gpu_check.py.)"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"

RECORDING_PYTHON = """#!/usr/bin/env bash
# pip calls are recorded, not run (no network in tests); everything else is the real python
if [[ "$1" == "-m" && "$2" == "pip" ]]; then echo "$*" >> "{log}"; exit 0; fi
exec "{python}" "$@"
"""


def test_wheel_list_pins_every_runtime_dependency_but_the_machines_torch_and_numpy():
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check" / "wheels.py")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    names = {line.split("==")[0] for line in lines}
    assert all(re.fullmatch(r"[a-z0-9._-]+==[^=\s]+", line) for line in lines), lines
    assert {"aiohttp", "transformers", "pyyaml", "gymnasium"} <= names
    assert not names & {"torch", "numpy", "triton"} and not any(n.startswith("nvidia-") for n in names)


def test_prepare_wheels_downloads_pinned_binaries_without_dependencies(tmp_path):
    log = tmp_path / "pip.log"
    python = tmp_path / "python"
    python.write_text(RECORDING_PYTHON.format(log=log, python=sys.executable))
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    result = subprocess.run(
        ["bash", str(SCRIPT), "--prepare-wheels", str(tmp_path / "wheels")],
        cwd=REPO,
        env={**os.environ, "PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert any("download --no-deps --only-binary=:all:" in c and "requirements.txt" in c for c in calls), calls
    assert any(c.startswith("-m pip wheel --no-deps") for c in calls), calls
    assert "torch==" not in (tmp_path / "wheels" / "requirements.txt").read_text()


def test_the_script_never_installs_from_an_index_or_with_dependencies():
    text = SCRIPT.read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs and all("--no-index" in line and "--no-deps" in line for line in installs), installs
    for flag in ("--wheels", "--prepare-wheels"):
        result = subprocess.run(["bash", str(SCRIPT), flag], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and "usage:" in result.stderr


def test_the_pack_for_the_bare_box_carries_only_what_it_lacks_and_fits_the_carry_limit(tmp_path):
    """The real download, for the py312-cu130 box: cp312-tagged wheels of what it does not ship
    (it has torch, CUDA and transformers with everything transformers needs), under 64 MiB with
    the repository."""
    result = subprocess.run(
        ["bash", str(SCRIPT), "--prepare-wheels", str(tmp_path / "wheels"), "--target", "py312-cu130"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    match = re.search(r"pack for py312-cu130: (\d+) wheels .* = (\d+) MiB of 64 MiB", result.stdout)
    assert match and int(match.group(2)) <= 64, result.stdout
    wheels = sorted(p.name for p in (tmp_path / "wheels").glob("*.whl"))
    assert int(match.group(1)) == len(wheels) and any(w.startswith("gymnasium-") for w in wheels)
    assert not [w for w in wheels if re.match(r"(torch|numpy|transformers|tokenizers|matplotlib|tensorboard)-", w)]
    binary = [w for w in wheels if "-none-any" not in w]
    assert binary and all("-cp312-" in w for w in binary), binary


def test_an_unknown_target_is_a_usage_error(tmp_path):
    result = subprocess.run(
        ["bash", str(SCRIPT), "--prepare-wheels", str(tmp_path), "--target", "py39-rocm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "unknown target py39-rocm" in result.stderr
