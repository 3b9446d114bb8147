"""The embedded tool is bounded before the work is done, and runs off the event loop.

Output size, memory and time are each judged before they are spent: a 140-character program
whose printed value is 10^10 characters, a modular power with 4096-bit operands and a CPU-heavy
program each come back as a one-line error within about twice the time limit, in a worker
process whose memory is limited and which is killed and replaced when it overruns.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from pathlib import Path

import pytest

from rollhub.envs.mathtool.backends import EmbeddedBackend
from rollhub.envs.mathtool.env import MathToolEnv
from rollhub.envs.mathtool.interpreter import MAX_PRINTED_CHARS, MAX_STRING_CHARS, run_code
from rollhub.envs.mathtool.tool_worker import MEMORY_LIMIT_MB, ToolWorker, ToolWorkerPool, kill_after_s

LEVELS = "".join(f"{new}=({','.join([old] * 10)})\n" for old, new in zip("abcdef", "bcdefg"))
# ten names of ten names...: 10^7 leaves in 168 characters, 30 MB of text if printed (one more line: 300 MB)
NESTED = "a=(0,1,2,3,4,5,6,7,8,9)\n" + LEVELS
NESTED_PRINTS = {
    "print": NESTED + "print(g)",
    "bare last expression": NESTED + "g",
    "str": NESTED + "s = str(g)",
    "f-string": NESTED + "s = f'{g}'",
    "list literal": NESTED + "print([g, g])",
    "the audit's list program": "a=[0]*1000\nfor i in range(6): a=[a]*10\nprint(a)",
    "string multiplication": "print('ab' * 10**9)",
    "big string repeated": "s = 'x' * 9000\nprint((s, s, s, s, s, s, s, s, s, s, s, s))",
    "many prints": "s = 'x' * 9000\n" + "print(s)\n" * 20,
    "one print of many values": "s = 'x' * 9000\nprint(" + ", ".join(["s"] * 20) + ")",
    "huge integer": "print(10**5000)",
}
# 1024-bit modular powers, about 3 ms each: far more of them than any time limit allows
HEAVY = "a=2**1023+1\nb=a+2\nx = " + "+".join(["pow(a,a,b)"] * 350)
HEAVY_PROGRAMS = {
    "modular power over 1024 bits": "a=2**4000+1\nprint(pow(a, a, a + 2))",
    "many modular powers": HEAVY,
    "an infinite loop": "while True: pass",
    "a memory bomb": "x = [0] * 10**9",
    "an exponent bomb": "x = 10**10**9",
}


@pytest.fixture
async def pool():
    pool = ToolWorkerPool(size=2)
    yield pool
    pool.close()


@pytest.mark.parametrize("code", NESTED_PRINTS.values(), ids=NESTED_PRINTS.keys())
def test_output_is_bounded_before_it_is_made(code):
    assert len(NESTED) < 200
    started = time.thread_time()
    result = run_code(code, max_output_chars=500)
    assert time.thread_time() - started < 0.05  # refused up front, not rendered and then cut
    assert result.error is not None and result.error.split(":")[0].endswith("Error"), result.error
    assert len(result.text()) < 700


def test_printing_within_the_bounds_still_prints_like_python():
    assert run_code("print((1,), [2, 'a'], (3, (4,)))").output == "(1,) [2, 'a'] (3, (4,))\n"
    assert run_code("a = (1, 2)\nb = (a, a)\nb").output == "((1, 2), (1, 2))\n"
    assert run_code(f"print('x' * {MAX_STRING_CHARS})").ok
    assert run_code("s = 'x' * 9000\n" + "print(s)\n" * (MAX_PRINTED_CHARS // 9001)).ok


@pytest.mark.parametrize("code", HEAVY_PROGRAMS.values(), ids=HEAVY_PROGRAMS.keys())
def test_cost_is_bounded_in_cpu_time(code):
    gc.collect()  # a full collection of this test process's heap is no cost of the program's
    started = time.thread_time()
    result = run_code(code, time_limit_s=0.2)
    assert time.thread_time() - started < 0.4  # within twice the limit (in a worker: the limit + ms)
    assert result.error is not None


def test_small_modular_powers_still_run():
    assert run_code("print(pow(7, 23, 13), pow(19, 40, 97))").output == f"{pow(7, 23, 13)} {pow(19, 40, 97)}\n"
    assert run_code("a = 2**1000\nprint(pow(a + 1, a, a + 7))").ok


@pytest.mark.parametrize(
    "code", [*NESTED_PRINTS.values(), *HEAVY_PROGRAMS.values()], ids=[*NESTED_PRINTS, *HEAVY_PROGRAMS]
)
async def test_every_hostile_program_returns_a_bounded_error_through_the_worker(pool, code):
    await pool.run("python", "print(1)", time_limit_s=0.2)  # the worker is started
    result, wall_s = await pool.run("python", code, time_limit_s=0.2, max_output_chars=500)
    assert wall_s < kill_after_s(0.2) + 0.5
    assert result.error is not None and len(result.text()) < 700
    for pid in pool.worker_pids():  # bounded memory: the worker's peak stays far under its limit
        status = Path(f"/proc/{pid}/status").read_text()
        peak_kb = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
        assert peak_kb < 100 * 1024, status


def test_a_worker_that_overruns_is_killed_and_replaced():
    worker = ToolWorker()
    try:
        request = {"op": "python", "source": HEAVY, "time_limit_s": 30.0, "max_output_chars": 500}
        started = time.perf_counter()
        result = worker.call(request, timeout_s=0.3)  # the backstop, shorter than the program
        assert time.perf_counter() - started < 1.5
        assert result.error is not None and result.error.startswith("TimeoutError")
        assert worker.process is None  # killed
        ok = worker.call({"op": "python", "source": "print(6 * 7)", "time_limit_s": 0.2, "max_output_chars": 500}, 5)
        assert ok.output == "42\n" and worker.started == 2
    finally:
        worker.close()


def test_a_worker_that_dies_is_replaced_and_limits_its_memory():
    worker = ToolWorker()
    try:
        request = {"op": "python", "source": "print(1)", "time_limit_s": 0.2, "max_output_chars": 500}
        assert worker.call(request, 5).output == "1\n"
        assert worker.process is not None
        limits = Path(f"/proc/{worker.process.pid}/limits").read_text()
        address_space = next(line for line in limits.splitlines() if line.startswith("Max address space"))
        assert address_space.split()[3] == str(MEMORY_LIMIT_MB * 1024 * 1024)
        os.kill(worker.process.pid, 9)
        worker.process.wait()
        assert worker.call(request, 5).output == "1\n" and worker.started == 2
    finally:
        worker.close()


async def test_the_calculator_runs_in_the_workers_too(pool):
    result, _ = await pool.run("calculator", "4821 * 377", time_limit_s=0.2)
    assert result.output == "1817517"
    result, _ = await pool.run("calculator", "pow(2**4000 + 1, 2**4000, 7)", time_limit_s=0.2)
    assert result.error.startswith("OverflowError")


def call(code: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


async def test_a_program_at_its_time_limit_stalls_no_other_episode():
    slow = MathToolEnv(tool_timeout_s=0.5, max_turns=5)
    quick = MathToolEnv(max_turns=5)
    await slow.reset(seed=0)
    await quick.reset(seed=1)
    await asyncio.gather(slow.step(call("print(1)")), quick.step(call("print(2)")))  # two workers are up
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    async def quick_episode() -> tuple[float, float]:
        await asyncio.sleep(0.05)  # the slow program is running by now
        started = time.perf_counter()
        obs, *_ = await quick.step(call(f"print({quick.problem.answer})"))
        assert obs[0]["content"] == quick.problem.answer
        _, reward, *_ = await quick.step(f"<answer>{quick.problem.answer}</answer>")
        assert reward == 1.0
        return time.perf_counter() - started, time.perf_counter()

    async def slow_episode() -> tuple[float, float]:
        started = time.perf_counter()
        obs, _, _, _, info = await slow.step(call(HEAVY))  # about 1 s of CPU: stopped at 0.5 s
        assert info["tool_timed_out"] and obs[0]["content"].startswith("TimeoutError"), obs
        return time.perf_counter() - started, time.perf_counter()

    tick_task = asyncio.create_task(ticker())
    (slow_s, slow_end), (quick_s, quick_end) = await asyncio.gather(slow_episode(), quick_episode())
    tick_task.cancel()
    assert slow_s > 0.45  # it did run for its whole limit
    assert quick_end < slow_end and quick_s < slow_s / 2  # the other episode went on meanwhile
    assert ticks > slow_s / 0.01 / 4  # and the loop kept turning


async def test_typical_calls_are_fast():
    backend = EmbeddedBackend(pool=ToolWorkerPool(size=1))
    try:
        await backend.run_python("print(1)")
        durations = []
        for _ in range(50):
            output = await backend.run_python("print(4821 * 377)")
            assert output.text == "1817517"
            durations.append(output.duration_s)
        assert sorted(durations)[len(durations) // 2] < 0.02  # a pipe round trip, not a process start
    finally:
        backend.pool.close()


async def test_a_worker_that_cannot_start_is_an_infra_failure_not_the_models(monkeypatch, tmp_path):
    from rollhub.envs.mathtool import tool_worker
    from rollhub.sandbox.base import SandboxError

    monkeypatch.setattr(tool_worker, "WORKER_SCRIPT", tmp_path / "missing_worker.py")  # a broken install
    with pytest.raises(SandboxError, match="did not start"):
        ToolWorker().call({"op": "python", "source": "print(1)", "time_limit_s": 0.2, "max_output_chars": 500}, 5)
    env = MathToolEnv()
    env.backend = EmbeddedBackend(pool=ToolWorkerPool(size=1))
    await env.reset(seed=0)
    try:
        _, reward, terminated, truncated, info = await env.step(call("print(1)"))
        assert info["infra_failure"].startswith("mathtool sandbox") and reward == 0 and truncated
    finally:
        env.backend.pool.close()


async def test_a_forked_child_gets_its_own_pool():
    from rollhub.envs.mathtool.tool_worker import shared_tool_pool

    parent_pool = shared_tool_pool()
    await parent_pool.run("python", "print(1)", time_limit_s=0.2)  # the parent's threads and workers exist
    pid = os.fork()
    if pid == 0:  # the child: its inherited executor has no threads; a call there would hang
        import signal

        signal.alarm(20)
        try:
            pool = shared_tool_pool()
            result, _ = asyncio.new_event_loop().run_until_complete(pool.run("python", "6 * 7", time_limit_s=0.2))
            code = 0 if pool is not parent_pool and result.output == "42\n" else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
