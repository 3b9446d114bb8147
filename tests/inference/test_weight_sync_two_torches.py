"""Weight pushes across two torch releases over gloo (rollhub/inference/weight_sync.py).

An SGLang server runs in a venv of its own whose torch is pinned apart from the trainer's, and
`choose_update_backend` sends pushes over gloo whenever NCCL cannot form (NCCL refuses peers of
another version). That only works if gloo's wire format holds across torch releases, which a
test within one environment never shows. Here the receiver is a real `rollhub serve` started
with the interpreter of `.cache/peer-torch-venv` (another torch release, built by
`bash .ci/peer_torch_venv.sh`), the trainer side is this environment's torch with the real
`DistributedWeightSync.push`, and correctness is what the server computes after each push.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from rollhub.inference.engines.sglang import SGLangEngine
from rollhub.inference.weight_sync import (
    DistributedWeightSync,
    choose_update_backend,
    local_nccl_version,
    nccl_version_of,
)
from tests.inference.test_weight_sync import KEY, SERVER_TIMEOUT_S, _assert_serves, _free_port, _perturbed

ROOT = Path(__file__).resolve().parents[2]
PEER_VENV = Path(os.environ.get("ROLLHUB_PEER_VENV", ROOT / ".cache" / "peer-torch-venv"))
PEER_PYTHON = PEER_VENV / "bin" / "python"

# slow: the peer's CUDA-build torch takes tens of seconds to import on a loaded machine, twice
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (PEER_VENV / ".rollhub-complete").is_file(),
        reason=f"no second torch venv at {PEER_VENV}: build it with `bash .ci/peer_torch_venv.sh` (3-12 min, 5.7 GB)",
    ),
]


def _peer_torch_version() -> str:
    """From the installed wheel's metadata folder: an import of a CUDA build costs seconds."""
    (info,) = PEER_VENV.glob("lib/python*/site-packages/torch-*.dist-info")
    return info.name.removeprefix("torch-").removesuffix(".dist-info")


@pytest.fixture(scope="module")
def peer_serve(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """`rollhub serve` on the peer venv's interpreter (rollhub from this checkout); yields its URL."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("peer-serve") / "serve.log"
    command = [str(PEER_PYTHON), "-m", "rollhub.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port)]
    command += ["--weight-sync-timeout-s", str(SERVER_TIMEOUT_S)]
    env = {**os.environ, "ROLLHUB_API_KEY": KEY, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"peer rollhub serve exited with {process.returncode}: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"peer rollhub serve not healthy after 180 s: {log_path.read_text()[-2000:]}")
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_peer_venv_runs_another_torch_release_and_auto_picks_gloo_for_it():
    ours, peer = torch.__version__.split("+")[0], _peer_torch_version().split("+")[0]
    assert peer != ours, f"the peer venv holds torch {peer}, the same release as ours: rebuild it"
    # the real probe of another interpreter: a CUDA build links NCCL, our CPU wheel none
    server_nccl = nccl_version_of(str(PEER_PYTHON), timeout_s=120)
    trainer_nccl = local_nccl_version()
    backend, why = choose_update_backend("auto", shared_gpu=False, trainer_nccl=trainer_nccl, server_nccl=server_nccl)
    if trainer_nccl is None:
        assert backend == "gloo" and why is not None and "no NCCL" in why
    elif server_nccl is not None and server_nccl != trainer_nccl:
        assert backend == "gloo" and why is not None and "differ" in why


async def test_gloo_push_from_this_torch_reaches_a_server_on_another_torch(peer_serve, tiny_model_dir):
    client = SGLangEngine(peer_serve, api_key=KEY)
    bucketed = DistributedWeightSync(backend="gloo", timeout_s=60)
    per_tensor = DistributedWeightSync(backend="gloo", timeout_s=60, load_format="per_tensor")
    try:
        first = _perturbed(tiny_model_dir, seed=11)
        timings = await bucketed.push([client], first, 1)  # one flattened broadcast per bucket
        assert timings["backend"] == "gloo" and timings["group_s"] > 0 and timings["tensors"] == len(first) - 1
        await _assert_serves(client, tiny_model_dir, first, 1)

        second = _perturbed(tiny_model_dir, seed=12)
        timings = await bucketed.push([client], second, 2)
        assert timings["group_s"] == 0.0  # the cross-release group is kept between pushes
        await _assert_serves(client, tiny_model_dir, second, 2)
        await bucketed.close([client])  # the server drops its group, so a fresh one can form

        third = _perturbed(tiny_model_dir, seed=13)
        timings = await per_tensor.push([client], third, 3)  # one broadcast per tensor
        assert timings["load_format"] == "per_tensor" and timings["group_s"] > 0
        await _assert_serves(client, tiny_model_dir, third, 3)
        assert not torch.distributed.is_initialized()
    finally:
        await bucketed.close([client])
        await per_tensor.close([client])
        await client.close()
