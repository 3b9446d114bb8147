"""SandboxEnvironment: mini-swe-agent's environment protocol on a rollhub sandbox (the process
backend here, so no Docker is needed), driven by mini-swe-agent's own DefaultAgent."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("minisweagent")

from minisweagent.exceptions import Submitted  # noqa: E402

from rollhub.envs.swe.agent.mini_swe_agent import SandboxEnvironment, SandboxEnvironmentConfig  # noqa: E402
from rollhub.sandbox.process_backend import ProcessBackend  # noqa: E402


@pytest.fixture
async def box():
    backend = ProcessBackend()
    sandbox = await backend.start("unused")
    await sandbox.write_file("/testbed/README", "a repository\n")
    yield sandbox
    await backend.close()


def environment(box, **config) -> SandboxEnvironment:
    return SandboxEnvironment(box, asyncio.get_running_loop(), SandboxEnvironmentConfig(**config))


async def test_a_command_runs_in_the_sandbox_with_its_exit_code(box):
    env = environment(box, env={"GREETING": "hi"})
    out = await asyncio.to_thread(env.execute, {"command": "cat README; echo $GREETING; exit 3"})
    assert out == {"output": "a repository\nhi\n", "returncode": 3, "exception_info": ""}
    assert env.commands_run == 1


async def test_a_slow_command_is_killed_at_its_timeout(box):
    env = environment(box, timeout_s=30)
    started = time.monotonic()
    out = await asyncio.to_thread(env.execute, {"command": "echo before; sleep 20"}, timeout=1)
    assert time.monotonic() - started < 15
    assert out["returncode"] == -1 and "timed out after 1 s" in out["exception_info"]


async def test_long_output_keeps_head_and_tail(box):
    env = environment(box, output_limit_chars=200)
    out = await asyncio.to_thread(env.execute, {"command": "echo START; head -c 5000 /dev/zero | tr '\\0' x; echo END"})
    assert out["output"].startswith("START") and out["output"].rstrip().endswith("END")
    assert len(out["output"]) < 300 and "truncated" in out["output"]


@pytest.mark.parametrize(
    ("command", "why"),
    [("", "no command"), ("echo a\0b", "NUL"), ("echo " + "x" * 100_001, "longer than")],
)
async def test_commands_the_swe_tools_refuse_are_refused_without_running(box, command, why):
    env = environment(box)
    out = await asyncio.to_thread(env.execute, {"command": command})
    assert out["returncode"] == -1 and why in out["exception_info"] and env.commands_run == 0


async def test_the_submission_marker_ends_the_run_only_as_the_first_line_of_a_success(box):
    env = environment(box)
    with pytest.raises(Submitted) as caught:
        await asyncio.to_thread(env.execute, {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo notes"})
    [message] = caught.value.messages
    assert message["extra"] == {"exit_status": "Submitted", "submission": "notes\n"}
    for not_a_submission in (
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 1",  # the command failed
        "echo first; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",  # not the first line
    ):
        out = await asyncio.to_thread(env.execute, {"command": not_a_submission})
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in out["output"]


async def test_execute_from_the_sandbox_loop_is_refused_not_deadlocked(box):
    env = environment(box)
    with pytest.raises(RuntimeError, match="thread other than"):
        env.execute({"command": "true"})


def test_config_values_are_checked():
    for bad in ({"timeout_s": 0}, {"timeout_s": float("nan")}, {"max_timeout_s": 1}, {"cwd": "testbed"}):
        with pytest.raises(ValueError):
            SandboxEnvironmentConfig(**bad)


async def test_mini_swe_agents_default_agent_edits_the_sandbox_and_submits(box):
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.test_models import DeterministicModel, make_output

    outputs = [
        make_output("edit", [{"command": "echo fixed >> README && cat README"}], cost=0.0),
        make_output("submit", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}], cost=0.0),
    ]
    env = environment(box)
    agent = DefaultAgent(
        DeterministicModel(outputs=outputs, cost_per_call=0.0),
        env,
        system_template="You work in {{cwd}} on {{system}}.",
        instance_template="{{task}}",
        step_limit=5,
    )
    exit_info = await asyncio.to_thread(agent.run, "Fix the README.")
    assert exit_info["exit_status"] == "Submitted"
    assert agent.messages[0]["content"] == "You work in /testbed on Linux."
    observation = agent.messages[3]["content"]  # system, task, the model's edit, its observation
    assert "<returncode>0</returncode>" in observation and "a repository\nfixed" in observation
    assert (await box.read_file("/testbed/README")) == b"a repository\nfixed\n"
