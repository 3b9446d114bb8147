"""Hostile agent programs: each one costs its own episode, never the run or another session.

Both forms of a program are driven against the real gateway over the real HFEngine (a tiny
Qwen3): an async function, and a command (a separate Python process that knows only its
OpenAI environment variables). Programs that hang, ignore cancellation, crash, call in a loop,
flood with 1,000 parallel calls, send garbage, huge or deeply nested JSON, print without end,
leave processes behind or never end their session: each must end as a failed (INFRA_FAILED,
with a reason) or a bounded episode, while a well-behaved member of the same group completes,
every session ends and no process it started survives.
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import openai
import pytest
from gateway_testing import scripted_tool_model, served

from rollhub.inference.chat_templates import build_reasoning_tokenizer
from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.gateway import Gateway, GatewayConfig
from rollhub.rollout.gateway.programs import ProgramTask, command_program, run_program_group
from rollhub.rollout.types import TrajectoryStatus

MODEL = "rollhub-policy"
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer():
    return build_reasoning_tokenizer()


@pytest.fixture
async def engine(tokenizer):
    engine = HFEngine(scripted_tool_model(tokenizer), tokenizer, threads=1, max_batch_size=16)
    await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))  # warm: timeouts below time programs only
    yield engine
    await engine.close()


def make_gateway(engine, tokenizer, **config) -> Gateway:
    return Gateway(engine, tokenizer, GatewayConfig(**config))


async def polite(task: ProgramTask) -> None:
    """The well-behaved member of each group: one call, a reward."""
    client = openai.AsyncOpenAI(base_url=task.base_url, api_key=task.api_key or "x", max_retries=0, timeout=60)
    await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)
    await client.close()
    task.set_reward(1.0)


def one_hostile_member(hostile):
    """A program whose member 0 is `hostile` and member 1 `polite`."""

    async def program(task: ProgramTask) -> None:
        await (hostile(task) if task.member == 0 else polite(task))

    return program


def assert_group_survives(gateway: Gateway, group, reason: str) -> None:
    """The hostile member failed with `reason` (if it left any episode); the polite one completed; all ended."""
    polite_ones = [t for t in group.trajectories if t.status is TrajectoryStatus.COMPLETED]
    failed = [t for t in group.trajectories if t.status is TrajectoryStatus.INFRA_FAILED]
    assert len(polite_ones) == 1 and polite_ones[0].total_reward == 1.0
    assert all(reason in t.infra_error for t in failed), [t.infra_error for t in failed]
    assert gateway.sessions == {} and gateway.in_flight == 0


# --- async-function programs --------------------------------------------------------------


async def test_function_programs_that_hang_ignore_cancel_or_crash_fail_alone(engine, tokenizer):
    gateway = make_gateway(engine, tokenizer)

    async def call_then(task: ProgramTask, then) -> None:
        client = openai.AsyncOpenAI(base_url=task.base_url, api_key="x", max_retries=0, timeout=60)
        await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        await then()

    async def hang(task):
        await call_then(task, lambda: asyncio.sleep(1e9))

    released = asyncio.Event()  # set at the end, so the event loop can close (a real one would run on)

    async def ignore_cancel(task):
        async def forever():
            while not released.is_set():
                try:
                    await released.wait()
                except asyncio.CancelledError:
                    continue

        await call_then(task, forever)

    async def crash(task):
        async def boom():
            raise KeyError("the agent's own bug")

        await call_then(task, boom)

    async with served(gateway) as url:
        for hostile, reason, timeout in (
            (hang, "timed out", 6),
            (ignore_cancel, "timed out", 6),
            (crash, "KeyError", 60),
        ):
            began = time.monotonic()
            group = await run_program_group(
                gateway, url, one_hostile_member(hostile), env_id="t/H-v0", seed=0, group_size=2,
                timeout_s=timeout, grace_s=0.5,
            )  # fmt: skip
            assert time.monotonic() - began < timeout + 10
            assert_group_survives(gateway, group, reason)
            assert len(group.trajectories) == 2  # the hostile one's call is kept, unscored
        # the abandoned program calls again later: its session has ended, it is told so
        late = openai.AsyncOpenAI(base_url=f"{url}/sessions/{group.trajectories[0].info['session_id']}/v1",
                                  api_key="x", max_retries=0)  # fmt: skip
        with pytest.raises(openai.ConflictError):
            await late.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
        await late.close()
        released.set()


async def test_a_program_calling_in_a_loop_is_stopped_by_the_session_call_cap(engine, tokenizer):
    gateway = make_gateway(engine, tokenizer, max_calls_per_session=8)
    refused = []

    async def loop_forever(task):
        client = openai.AsyncOpenAI(base_url=task.base_url, api_key="x", max_retries=0, timeout=60)
        while True:  # a program that never stops calling, whatever it is told
            try:
                await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
            except openai.BadRequestError as exc:
                refused.append(exc.body["code"])
                await asyncio.sleep(0.01)

    async with served(gateway) as url:
        group = await run_program_group(
            gateway, url, one_hostile_member(loop_forever), env_id="t/L-v0", seed=0, group_size=2, timeout_s=8
        )
    assert_group_survives(gateway, group, "timed out")
    looped = [t for t in group.trajectories if t.status is TrajectoryStatus.INFRA_FAILED]
    assert len({t.info["session_id"] for t in looped}) == 1  # each call a leaf of the one session
    assert looped[0].info["calls"] == 8 and refused and set(refused) == {"session_call_limit"}


async def test_a_flood_of_1000_parallel_calls_gets_429_with_retry_after_and_the_group_completes(engine, tokenizer):
    gateway = make_gateway(engine, tokenizer, max_in_flight_per_session=4)
    statuses: list[int] = []
    retry_after: set[str | None] = set()

    async def flood(task):
        body = {"model": MODEL, "messages": HELLO, "max_tokens": 1}
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def one():
                async with http.post(f"{task.base_url}/chat/completions", json=body) as response:
                    statuses.append(response.status)
                    if response.status == 429:
                        retry_after.add(response.headers.get("Retry-After"))
                        assert (await response.json())["error"]["code"] == "too_many_requests"

            await asyncio.gather(*(one() for _ in range(1000)))

    async with served(gateway) as url:
        group = await run_program_group(
            gateway, url, one_hostile_member(flood), env_id="t/F-v0", seed=0, group_size=2, timeout_s=120
        )
    assert len(statuses) == 1000 and set(statuses) <= {200, 429}
    assert statuses.count(429) > 500 and statuses.count(200) >= 4  # the session's own slots, never more
    assert retry_after == {"1"}
    assert len(group.trajectories) == 1 + statuses.count(200)  # each answered call is one leaf, none lost
    assert all(t.status is TrajectoryStatus.COMPLETED for t in group.trajectories)
    assert gateway.sessions == {} and gateway.in_flight == 0


async def test_a_session_never_ended_is_ended_as_failed_by_the_idle_timeout(engine, tokenizer):
    gateway = make_gateway(engine, tokenizer, session_idle_timeout_s=0.3, max_open_sessions=2)
    async with served(gateway) as url, aiohttp.ClientSession() as http:
        async with http.post(f"{url}/rl/sessions", json={"env_id": "t/I-v0"}) as response:
            session = await response.json()
        client = openai.AsyncOpenAI(base_url=session["base_url"], api_key="x", max_retries=0, timeout=60)
        await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        async with http.post(f"{url}/rl/sessions", json={}) as response:
            assert response.status == 200
        async with http.post(f"{url}/rl/sessions", json={}) as response:  # the cap on open sessions
            assert response.status == 429 and response.headers["Retry-After"] == "1"
            assert (await response.json())["error"]["code"] == "too_many_sessions"
        for _ in range(100):  # the program walked away: the gateway ends its session itself
            if not gateway.sessions:
                break
            await asyncio.sleep(0.05)
        assert gateway.sessions == {} and gateway.metrics.sessions_timed_out == 2
        with pytest.raises(openai.ConflictError):
            await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        await client.close()
        async with http.get(f"{url}/rl/metrics") as response:
            assert (await response.json())["sessions_timed_out"] == 2
    (trajectory,) = gateway.take_trajectories()  # the session that called; the empty one has no leaf
    assert trajectory.status is TrajectoryStatus.INFRA_FAILED and "idle" in trajectory.infra_error


# --- command programs ---------------------------------------------------------------------

HOSTILE_COMMAND = textwrap.dedent(
    """
    import asyncio, json, os, signal, subprocess, sys, time
    import httpx
    behaviour, out = sys.argv[1], sys.argv[2]
    base = os.environ["OPENAI_BASE_URL"]
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    body = {"model": "rollhub-policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    def call():
        return httpx.post(base + "/chat/completions", json=body, headers=headers, timeout=60)

    if behaviour != "polite":
        call().raise_for_status()
    if behaviour == "hang_with_child":  # a child of its own, then hangs
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
        open(out, "w").write(str(child.pid))
        time.sleep(1000)
    elif behaviour == "leave_child":  # a grandchild left running when it exits "successfully"
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
        open(out, "w").write(str(child.pid))
    elif behaviour == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif behaviour == "stderr_flood":
        for _ in range(2000):
            sys.stderr.write("x" * 10000 + "\\n")
        sys.stderr.write("LAST WORDS")
        sys.exit(1)
    elif behaviour == "loop":
        while True:
            call()
    elif behaviour == "garbage":
        codes = []
        raw = {"headers": {**headers, "Content-Type": "application/json"}, "timeout": 60}
        for data in (b"\\xff\\xfe not json", b'{"model": ', b"[" * 200000 + b"]" * 200000,
                     json.dumps({**body, "messages": [{"role": "user", "content": "x" * (9 << 20)}]}).encode(),
                     json.dumps({**body, "messages": [{"role": "user", "content": [[[[["deep"]]]]]}]}).encode(),
                     json.dumps({**body, "tools": [{"type": "function", "function": {"name": "f",
                                 "parameters": json.loads("[" * 900 + "]" * 900)}}]}).encode(),
                     json.dumps({**body, "messages": "x"}).encode(), json.dumps([1, 2]).encode(), b"null"):
            codes.append(httpx.post(base + "/chat/completions", content=data, **raw).status_code)
        for reward in ("NaN", "Infinity", "1e308", '"high"', "[]", "null"):
            url = os.environ["ROLLHUB_GATEWAY_URL"] + "/sessions/" + os.environ["ROLLHUB_SESSION_ID"] + "/reward"
            codes.append(httpx.post(url, content=('{"reward": ' + reward + "}").encode(), **raw).status_code)
        open(out, "w").write(json.dumps(codes))
    if behaviour == "polite":
        call().raise_for_status()
        url = os.environ["ROLLHUB_GATEWAY_URL"] + "/sessions/" + os.environ["ROLLHUB_SESSION_ID"] + "/reward"
        httpx.post(url, json={"reward": 1.0}, headers=headers).raise_for_status()
    """
)


def pid_is_dead(pid: int) -> bool:
    """Gone, or a zombie waiting for init to reap it (it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] in "ZX"
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.fixture
def command_group(tmp_path):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_COMMAND)

    def program(behaviour: str, out: Path):
        hostile = command_program([sys.executable, str(script), behaviour, str(out)])
        nice = command_program([sys.executable, str(script), "polite", str(out)])

        async def run(task: ProgramTask) -> None:
            await (hostile(task) if task.member == 0 else nice(task))

        return run

    return program


@pytest.mark.parametrize(
    ("behaviour", "reason", "timeout"),
    [
        ("hang_with_child", "timed out", 8),
        ("leave_child", None, 60),
        ("segfault", "exited with -11", 60),
        ("stderr_flood", "LAST WORDS", 60),
        ("loop", "timed out", 8),
    ],
)
async def test_command_programs_fail_alone_and_leave_no_process(
    engine, tokenizer, command_group, tmp_path, behaviour, reason, timeout
):
    import psutil

    gateway = make_gateway(engine, tokenizer, max_calls_per_session=5)
    out = tmp_path / "out.txt"
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    async with served(gateway) as url:
        began = time.monotonic()
        group = await run_program_group(
            gateway, url, command_group(behaviour, out), env_id="t/C-v0", seed=1, group_size=2, timeout_s=timeout
        )
        elapsed = time.monotonic() - began
    assert elapsed < timeout + 15
    failed = [t for t in group.trajectories if t.status is TrajectoryStatus.INFRA_FAILED]
    if reason is None:
        assert not failed and len(group.trajectories) == 2
    else:
        assert_group_survives(gateway, group, reason)
        assert len({t.info["session_id"] for t in failed}) == 1
        assert len(failed[0].infra_error) < 600  # a tail of stderr, not all of it
    if behaviour == "loop":
        assert failed[0].info["calls"] == 5
    if out.exists() and behaviour in ("hang_with_child", "leave_child"):
        grandchild = int(out.read_text())
        for _ in range(50):
            if pid_is_dead(grandchild):
                break
            await asyncio.sleep(0.05)
        assert pid_is_dead(grandchild), "a process the program started outlived its session"
    left = {p.pid for p in psutil.Process().children(recursive=True)} - children_before
    assert not left, f"processes left behind: {left}"


async def test_a_command_sending_garbage_huge_or_deep_json_gets_400s_and_its_episode_stays_unpaid(
    engine, tokenizer, command_group, tmp_path
):
    gateway = make_gateway(engine, tokenizer, max_body_bytes=1 << 20)
    out = tmp_path / "codes.json"
    async with served(gateway) as url:
        group = await run_program_group(
            gateway, url, command_group("garbage", out), env_id="t/G-v0", seed=2, group_size=2, timeout_s=120
        )
    import json

    codes = json.loads(out.read_text())
    # bad bytes, cut JSON, nesting past the parser, a 9 MB body (413), nested content, nested tool schema,
    # wrong types; then rewards NaN, Infinity, 1e308, a string, a list, null
    assert codes == [400, 400, 400, 413, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400]
    assert all(t.status is TrajectoryStatus.COMPLETED for t in group.trajectories)
    rewards = sorted(t.total_reward for t in group.trajectories)
    assert rewards == [0.0, 1.0]  # the garbage sender's rewards were all refused: it is paid nothing
    assert gateway.sessions == {}


async def test_a_deep_tool_schema_is_refused_whatever_the_recursion_limit(engine, tokenizer):
    """The depth check is explicit: with a raised recursion limit (libraries raise it) the chat template
    would render a 900-deep schema and the call would be served."""
    gateway = make_gateway(engine, tokenizer)
    deep = {"type": "function", "function": {"name": "f", "parameters": [[[]]]}}
    for _ in range(900):
        deep["function"]["parameters"] = [deep["function"]["parameters"]]
    body = {
        "model": "rollhub-policy",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "tools": [deep],
    }
    shallow = {**body, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        async with served(gateway) as url, aiohttp.ClientSession() as http:
            import json

            async with http.post(f"{url}/v1/chat/completions", data=json.dumps(body)) as response:
                refused = (response.status, (await response.json())["error"]["code"])
            async with http.post(f"{url}/v1/chat/completions", data=json.dumps(shallow)) as response:
                served_status = response.status
    finally:
        sys.setrecursionlimit(limit)
    assert refused == (400, "invalid_json")
    assert served_status == 200


async def test_set_reward_refuses_absurd_values_and_keeps_the_last_good_one(engine, tokenizer):
    gateway = make_gateway(engine, tokenizer)
    session = gateway.start_session("t/R-v0", 0)
    task = ProgramTask(gateway, session.session_id, "http://unused", "t/R-v0", 0, 0)
    task.set_reward(-3)
    for bad in (float("nan"), float("inf"), -1e308, 1e7, "1.0", None, True, 10**400):
        with pytest.raises(ValueError, match="reward"):
            task.set_reward(bad)  # type: ignore[arg-type]
    assert session.rewards == {None: -3.0}


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_kill_group_is_safe_on_a_process_group_already_gone():
    from rollhub.rollout.gateway.programs import _kill_group

    _kill_group(2**22 + 12345)  # no such group: nothing raised
