"""`rollhub gateway` as a user starts it: a process serving a tiny model; one session through
the `openai` client ends up as a line of the trajectory log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from rollhub.rollout.trajectory_log import read_trajectories


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_gateway_command_serves_sessions_and_logs_their_trajectories(tiny_model_dir: Path, tmp_path: Path):
    port = _free_port()
    out = tmp_path / "trajectories.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rollhub", "gateway", "--model", str(tiny_model_dir), "--port", str(port)]
    process = subprocess.Popen([*command, "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway did not come up in 120 s"
            time.sleep(0.3)
        session = httpx.post(f"{url}/rl/sessions", json={"env_id": "test/Chat-v0", "seed": 4}).json()
        client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="rollhub-policy", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert httpx.post(f"{url}/sessions/{session['session_id']}/reward", json={"reward": 0.5}).status_code == 200
        assert httpx.post(f"{url}/sessions/{session['session_id']}/end", json={}).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
    (trajectory,) = list(read_trajectories(out))
    assert trajectory.env_id == "test/Chat-v0" and trajectory.seed == 4 and trajectory.total_reward == 0.5
    assert trajectory.turns[0].response_ids == reply.choices[0].model_extra["rollhub"]["token_ids"]
