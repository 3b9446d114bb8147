"""Hostile programs against both tool backends: each gets an error or a timeout as its output, the
host is untouched, the event loop stays free and the episode goes on (a good call still works)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import pytest

from rollhub.envs.mathtool.env import MathToolEnv
from rollhub.envs.mathtool.interpreter import MAX_INT_BITS, evaluate_expression, run_code


def call(code: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


# what an RL policy might try, in the spellings it might try them
HOSTILE = {
    "infinite loop": [
        "while True: pass",
        "while 1:\n    x = 1",
        "for i in iter(int, 1): pass",
        "x = [1]\nfor i in x: x.append(i)",
    ],
    "fork bomb": [
        "import os\nwhile True: os.fork()",
        "__import__('os').fork()",
        "import subprocess; subprocess.run(':(){ :|:& };:', shell=True)",
    ],
    "huge output": [
        "print('x' * 10**8)",
        "print(10**1200)",
        "print('ab' * 5000 * 5000)",
        "s = 'x'\ns = s + s\n" * 40 + "print(s)",
    ],
    "host file": [
        "print(open('/etc/shadow').read())",
        "import pathlib; print(pathlib.Path('/etc/passwd').read_text())",
        "print(().__class__.__base__.__subclasses__())",
        "print(__builtins__)",
    ],
    "network": [
        "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)",
        "import urllib.request; urllib.request.urlopen('http://example.com', timeout=2)",
    ],
    "huge exponent": [
        "x = 9**9**9",
        "print(pow(10, 10**12))",
        "print(2**(2**40))",
        "print(1.5 ** 10**10)",
        "import math\nprint(math.factorial(10**7))",
    ],
}
ALL_HOSTILE = [pytest.param(code, id=f"{kind}-{i}") for kind, codes in HOSTILE.items() for i, code in enumerate(codes)]


@pytest.mark.parametrize("code", ALL_HOSTILE)
def test_the_embedded_interpreter_refuses_or_bounds_every_hostile_program(code):
    started = time.perf_counter()
    result = run_code(code, time_limit_s=0.2, max_output_chars=500)
    assert time.perf_counter() - started < 2.0
    assert len(result.text()) < 700  # head and tail of the output, never megabytes
    if result.ok:  # only output bounded by the caps may get through, nothing of the host
        assert "truncated" in result.output or len(result.output) < 600
    else:
        assert result.error.split(":")[0].endswith("Error"), result.error
    assert "root:" not in result.text() and "subclasses" not in result.output


def test_the_interpreter_never_evals_and_caps_sizes_before_computing():
    assert run_code("print(2**4000)").ok and not run_code(f"print(2**{MAX_INT_BITS + 10})").ok
    assert run_code("a = 10**1000\nb = a * a * a * a * a").error.startswith("OverflowError")
    assert run_code("print(pow(7, 10**100, 13))").output.strip() == str(pow(7, 10**100, 13))
    assert run_code("__import__('os').system('touch /tmp/x')").error.startswith("NotImplementedError")
    assert run_code("__import__('os')").error.startswith("NameError")
    assert evaluate_expression("(1).__class__").error.startswith("NotImplementedError")


@pytest.mark.parametrize(
    "code, output",
    [
        ("print(4821 * 377)", "1817517"),
        ("4821 * 377", "1817517"),
        ("a = 4821\nb = 377\nresult = a * b\nprint(result)", "1817517"),
        ("x = 7 ** 23 % 13\nprint(x)", str(7**23 % 13)),
        ("print(pow(7, 23, 13))", str(pow(7, 23, 13))),
        ("import math\nprint(math.gcd(12, 18), math.sqrt(16))", "6 4.0"),
        ("total = 0\ntotal += 5\ntotal -= 2\ntotal", "3"),
        ("print(f'The answer is {12 * 3}')", "The answer is 36"),
        ("print(sum([1, 2, 3]), max(4, 9), abs(-2), round(2.5), 17 // 5, 17 % 5, divmod(17, 5))", "6 9 2 2 3 2 (3, 2)"),
        ("print(48 * 317 - 1245)", str(48 * 317 - 1245)),
    ],
)
def test_typical_model_code_runs(code, output):
    result = run_code(code)
    assert result.ok, result.error
    assert result.output.strip() == output


async def test_the_event_loop_stays_free_during_a_hostile_embedded_call():
    env = MathToolEnv(split="test", max_turns=10)
    await env.reset(seed=0)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    started = time.perf_counter()
    for kind in ("infinite loop", "huge exponent", "huge output"):
        for code in HOSTILE[kind]:
            obs, reward, terminated, truncated, info = await env.step(call(code))
            assert info["action_valid"] and not (terminated or truncated) and reward == 0
            await asyncio.sleep(0)
            if env._turns >= 8:
                break
        await env.reset(seed=0)
    task.cancel()
    assert time.perf_counter() - started < 5
    assert ticks > 0


# --- the container backend -----------------------------------------------------------------


@pytest.fixture
async def sandbox_pool():
    try:
        from rollhub.sandbox.docker_backend import DockerBackend, connect
        from rollhub.sandbox.images import image_exists
        from rollhub.sandbox.pool import SandboxPool

        client = connect(api_timeout_s=30)
    except Exception as exc:  # no engine, or no docker SDK
        pytest.skip(f"no Docker engine: {exc}")
    if not image_exists(client, "rollhub/base:bookworm"):
        pytest.skip("rollhub/base:bookworm missing: run `rollhub sandbox build-base`")
    from rollhub.sandbox.reaper import list_rollhub_containers

    backend = DockerBackend(run_id=f"pytest-{uuid.uuid4().hex[:12]}", max_threads=16)
    pool = SandboxPool(backend, max_concurrent=4)
    try:
        yield pool
    finally:
        await pool.close()
        await backend.close()
    assert list_rollhub_containers(client.api, backend.run_id) == [], "mathtool leaked containers"
    client.api.close()


@pytest.mark.docker
@pytest.mark.slow
async def test_the_sandbox_backend_survives_every_kind_of_hostile_program(sandbox_pool, tmp_path):
    """One container, one hostile program of each kind, each followed by a call that must work."""
    secret = tmp_path / f"host-secret-{uuid.uuid4().hex[:6]}"
    secret.write_text("HOST SECRET")
    host_pids = len(os.listdir("/proc"))
    env = MathToolEnv(
        split="test", backend="sandbox", max_turns=20, tool_timeout_s=2, max_output_chars=400, sandbox_pool=sandbox_pool
    )
    try:
        await env.reset(seed=0)
        obs, _, _, _, info = await env.step(call("print(4821 * 377)"))
        assert obs[0]["content"] == "1817517", obs
        programs = {
            "infinite loop": ("while True: pass", "TimeoutError"),
            "fork bomb": ("import os\nwhile True:\n    os.fork()", "Error"),
            "huge output": ("print('x' * 10**7)", "characters truncated"),
            "host file": (f"print(open({str(secret)!r}).read())", "FileNotFoundError"),
            "network": ("import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)", "OSError"),
            "huge exponent": ("x = 9**9**9", "TimeoutError"),
            "daemon": ("import os; os.system('sleep 300 &'); print('left behind')", "left behind"),
        }
        for kind, (code, expected) in programs.items():
            started = time.perf_counter()
            obs, reward, terminated, truncated, info = await env.step(call(code))
            text = obs[0]["content"]
            assert expected in text or (kind == "network" and "unreachable" in text), (kind, text)
            assert len(text) <= 500 and "HOST SECRET" not in text
            assert info["action_valid"] and not (terminated or truncated) and reward == 0
            assert time.perf_counter() - started < 30, kind
            obs, _, _, _, _ = await env.step(call("print(6 * 7)"))
            assert obs[0]["content"] == "42", (kind, obs)
        # the daemon was swept after its command: no `sleep 300` left (the idle `sleep infinity` stays)
        obs, _, _, _, _ = await env.step(
            call(
                "import os\nprint(sum(b'sleep\\x00300' in open(f'/proc/{p}/cmdline', 'rb').read() "
                "for p in os.listdir('/proc') if p.isdigit()))"
            )
        )
        assert obs[0]["content"] == "0", obs
        _, reward, terminated, _, info = await env.step(f"<answer>{env.problem.answer}</answer>")
        assert reward == 1 and terminated and info["metrics"]["sandbox_execs"] >= 16
        assert sandbox_pool.metrics.alive == 0  # the episode's container is gone at its end
    finally:
        await env.close()
    assert abs(len(os.listdir("/proc")) - host_pids) < 50  # nothing forked on the host


@pytest.mark.docker
@pytest.mark.slow
async def test_a_sandbox_episode_answers_like_the_embedded_one(sandbox_pool):
    sandboxed = MathToolEnv(split="test", backend="sandbox", max_turns=4, sandbox_pool=sandbox_pool)
    embedded = MathToolEnv(split="test", max_turns=4)
    for env in (sandboxed, embedded):
        await env.reset(seed=7)
    try:
        for code in ("print(4821 * 377)", "a = 12\nb = 30\na * b", "print(1/0)"):
            one, _, _, _, _ = await sandboxed.step(call(code))
            two, _, _, _, _ = await embedded.step(call(code))
            assert one[0]["content"].splitlines()[-1] == two[0]["content"].splitlines()[-1], (one, two)
        assert sandboxed._metrics()["sandbox_execs"] == 3  # one container served the episode
    finally:
        await sandboxed.close()
    assert sandbox_pool.metrics.alive == 0


@pytest.mark.docker
async def test_a_sigkilled_process_leaves_containers_the_next_pool_removes(sandbox_pool, tmp_path):
    """A training process killed with SIGKILL runs no exit hook: its episode's container stays. The
    next process that opens the shared pool (a resumed run) removes it before starting its own."""
    import signal
    import subprocess
    import sys

    from rollhub.envs.mathtool.backends import close_shared_pool, shared_pool
    from rollhub.sandbox.docker_backend import connect

    script = tmp_path / "killed.py"
    script.write_text(
        "import asyncio, json, os, signal\n"
        "from rollhub.envs.mathtool.env import MathToolEnv\n"
        "async def main():\n"
        "    env = MathToolEnv(split='test', backend='sandbox')\n"
        "    await env.reset(seed=0)\n"
        "    call = json.dumps({'name': 'python', 'arguments': {'code': 'print(6 * 7)'}})\n"
        "    obs = (await env.step(f'<tool_call>{call}</tool_call>'))[0]\n"
        "    print(obs[0]['content'], flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert done.returncode == -signal.SIGKILL and done.stdout.strip() == "42", done.stderr[-2000:]
    client = connect(api_timeout_s=30)
    label = {"label": "rollhub.role=mathtool"}
    try:
        assert client.containers.list(all=True, filters=label), "the killed process left no container"
        shared_pool()  # what a resumed run's first episode does
        assert client.containers.list(all=True, filters=label) == []
        await close_shared_pool()
    finally:
        client.api.close()
