"""Gateway authentication: off by default (loopback), on with keys; a session's own key opens only that session.

The real gateway over the real HFEngine, the real `openai` client (401 -> AuthenticationError),
and `rollhub gateway` refusing a non-loopback address without a key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
from gateway_testing import random_model, served

from rollhub.inference.chat_templates import build_reasoning_tokenizer
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.gateway import Gateway, GatewayConfig
from rollhub.rollout.gateway.programs import ProgramTask, command_program, run_program_group
from rollhub.rollout.types import TrajectoryStatus

MODEL = "rollhub-policy"
HELLO = [{"role": "user", "content": "hi"}]
KEY = "gateway-key-0123456789"


@pytest.fixture
async def keyed_gateway():
    tokenizer = build_reasoning_tokenizer()
    engine = HFEngine(random_model(tokenizer), tokenizer, threads=1)
    yield Gateway(engine, tokenizer, GatewayConfig(api_keys=(KEY,)))
    await engine.close()


async def call(url: str, method: str, path: str, key: str | None, body=None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"{url}{path}", json=body, headers=headers) as response:
            return response.status, await response.json()


async def test_without_the_key_every_route_is_401_in_openai_shape(keyed_gateway):
    async with served(keyed_gateway) as url:
        status, session = await call(url, "POST", "/rl/sessions", KEY, {"env_id": "t/A-v0"})
        assert status == 200 and session["api_key"].startswith("rh-session-")
        sid = session["session_id"]
        routes = [
            ("POST", "/rl/sessions", {}),
            ("GET", "/rl/metrics", None),
            ("GET", "/v1/models", None),
            ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HELLO}),
            ("POST", f"/sessions/{sid}/v1/chat/completions", {"model": MODEL, "messages": HELLO}),
            ("POST", f"/sessions/{sid}/reward", {"reward": 1.0}),
            ("POST", f"/sessions/{sid}/end", {}),
            ("GET", f"/sessions/{sid}", None),
        ]
        for key in (None, "wrong-key-0123456789", f"{KEY}x", ""):
            for method, path, body in routes:
                status, error = await call(url, method, path, key, body)
                assert status == 401, (key, path)
                assert error["error"]["type"] == "authentication_error" and error["error"]["code"] == "invalid_api_key"
        assert keyed_gateway.metrics.calls == 0 and sid in keyed_gateway.sessions  # nothing ran, nothing ended
        client = openai.AsyncOpenAI(base_url=session["base_url"], api_key="not-the-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        await client.close()
        # the gateway key opens everything
        assert (await call(url, "GET", "/rl/metrics", KEY))[0] == 200
        assert (await call(url, "POST", "/v1/chat/completions", KEY, {"model": MODEL, "messages": HELLO,
                                                                      "max_tokens": 2}))[0] == 200  # fmt: skip


async def test_a_session_key_opens_its_own_session_only(keyed_gateway):
    async with served(keyed_gateway) as url:
        mine = (await call(url, "POST", "/rl/sessions", KEY, {}))[1]
        other = (await call(url, "POST", "/rl/sessions", KEY, {}))[1]
        client = openai.AsyncOpenAI(base_url=mine["base_url"], api_key=mine["api_key"], max_retries=0, timeout=60)
        reply = await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        assert reply.choices[0].model_extra["rollhub"]["token_ids"]
        await client.close()
        sid, key = mine["session_id"], mine["api_key"]
        assert (await call(url, "POST", f"/sessions/{sid}/reward", key, {"reward": 0.5}))[0] == 200
        # not another session's routes, nor the gateway's
        other_chat = f"/sessions/{other['session_id']}/v1/chat/completions"
        assert (await call(url, "POST", other_chat, key, {"model": MODEL, "messages": HELLO}))[0] == 401
        assert (await call(url, "POST", f"/sessions/{other['session_id']}/end", key, {}))[0] == 401
        assert (await call(url, "POST", "/rl/sessions", key, {}))[0] == 401
        assert (await call(url, "GET", "/rl/metrics", key))[0] == 401
        assert (await call(url, "POST", "/v1/chat/completions", key, {"model": MODEL, "messages": HELLO}))[0] == 401
        status, ended = await call(url, "POST", f"/sessions/{sid}/end", key, {})
        assert status == 200 and ended["trajectories"][0]["turns"][-1]["reward"] == 0.5
        assert (await call(url, "POST", f"/sessions/{sid}/end", key, {}))[0] == 401  # its key died with it


async def test_a_command_program_gets_its_session_key_as_openai_api_key(keyed_gateway, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(
        "import openai\n"
        "client = openai.OpenAI(max_retries=0, timeout=60)\n"  # OPENAI_BASE_URL and OPENAI_API_KEY
        "client.chat.completions.create(model='rollhub-policy', messages=[{'role': 'user', 'content': 'hi'}],"
        " max_tokens=2)\n"
    )
    async with served(keyed_gateway) as url:
        group = await run_program_group(
            keyed_gateway, url, command_program([sys.executable, str(script)]), env_id="t/A-v0", seed=0, group_size=2
        )

        async def no_key(task: ProgramTask) -> None:
            client = openai.AsyncOpenAI(base_url=task.base_url, api_key="guessed-0123456789", max_retries=0)
            await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)

        refused = await run_program_group(keyed_gateway, url, no_key, env_id="t/A-v0", seed=1, group_size=1)
    assert len(group.trajectories) == 2 and all(t.status is TrajectoryStatus.COMPLETED for t in group.trajectories)
    assert refused.trajectories == [] and keyed_gateway.sessions == {}


def test_keys_must_be_long_enough():
    with pytest.raises(ValueError, match="at least 8"):
        GatewayConfig(api_keys=("short",)).validate()


def test_the_cli_refuses_a_non_loopback_host_without_a_key(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    env.pop("ROLLHUB_GATEWAY_API_KEY", None)
    command = [sys.executable, "-m", "rollhub", "gateway", "--model", str(tmp_path), "--host", "0.0.0.0"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "--api-key" in output and "Traceback" not in output
