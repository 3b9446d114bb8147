"""OpenEnv environments through the adapter, against the real `openenv-core`: the sample class
in-process, and the same class served by openenv's own FastAPI app over its WebSocket."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("openenv.core")
uvicorn = pytest.importorskip("uvicorn")

from rollhub.envs import make  # noqa: E402
from rollhub.envs.checker import check_env  # noqa: E402
from rollhub.envs.registry import source_of  # noqa: E402

IN_PROCESS = "openenv:rollhub.envs.adapters.samples_openenv:CountdownEnvironment"


class Server:
    """openenv's app for the sample env, served by uvicorn on a free local port."""

    def __init__(self) -> None:
        from rollhub.envs.adapters.samples_openenv import app

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app(), host="127.0.0.1", port=self.port, log_level="critical"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the OpenEnv server did not start"
            time.sleep(0.05)
        self.url = f"ws://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def server():
    running = Server()
    yield running
    running.stop()


async def test_in_process_class_passes_check_env():
    assert await check_env(IN_PROCESS) == []
    assert source_of(IN_PROCESS) == "openenv"


async def test_server_over_websocket_passes_check_env(server):
    assert await check_env(f"openenv:{server.url}") == []


async def _play_to_target(env) -> tuple[float, bool, bool, dict]:
    obs, _ = await env.reset(seed=4)
    while True:
        text = obs[-1]["content"]
        value = int(text.split("Counter: ")[1].split(",")[0])
        target = int(text.split("target: ")[1].rstrip("."))
        gap = target - value
        move = f"{'+' if gap > 0 else '-'}{min(abs(gap), 2)}"
        obs, reward, terminated, truncated, info = await env.step(f"<action>{move}</action>")
        if terminated or truncated:
            return reward, terminated, truncated, info


@pytest.mark.parametrize("where", ["in-process", "server"])
async def test_scripted_policy_reaches_the_target_in_both_modes(where, request):
    target = IN_PROCESS if where == "in-process" else f"openenv:{request.getfixturevalue('server').url}"
    env = make(target)
    reward, terminated, truncated, info = await _play_to_target(env)
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    await env.close()
    await env.close()


async def test_no_truncation_flag_means_the_adapter_cuts_at_max_steps(server):
    env = make(f"openenv:{server.url}", max_steps=3)
    _, info = await env.reset(seed=4)
    results = [await env.step("<action>+1</action>" if i % 2 else "<action>-1</action>") for i in range(3)]
    assert [(r[2], r[3]) for r in results] == [(False, False), (False, False), (False, True)]
    await env.close()


async def test_refused_actions_keep_the_state(server):
    for target in (IN_PROCESS, f"openenv:{server.url}"):
        env = make(target)
        _, info = await env.reset(seed=4)
        # not in the action's enum: refused by pydantic (in-process) or by the server (VALIDATION_ERROR)
        obs, reward, terminated, truncated, bad = await env.step("<action>+100</action>")
        assert (reward, terminated, bad["action_valid"], bad["format_ok"]) == (0.0, False, False, True)
        assert bad["anchor"] == info["anchor"] and "Invalid action" in obs[-1]["content"]
        await env.close()


async def test_a_dead_server_is_machinery_not_a_model_failure():
    from rollhub.rollout.types import MACHINERY_ERRORS

    running = Server()
    env = make(f"openenv:{running.url}")
    await env.reset(seed=1)
    running.stop()
    with pytest.raises(MACHINERY_ERRORS):
        await env.step("<action>+1</action>")
    await env.close()


async def test_anchor_ignores_step_count_and_episode_id():
    env = make(IN_PROCESS)
    _, first = await env.reset(seed=4)
    await env.step("<action>+1</action>")
    _, _, _, _, back = await env.step("<action>-1</action>")
    assert back["anchor"] == first["anchor"]  # same counter value after two steps: same state
    await env.close()
