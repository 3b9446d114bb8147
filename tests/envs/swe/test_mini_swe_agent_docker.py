"""mini-swe-agent (the registry package, unmodified) on a SWE task through the real gateway.

The agent program (examples/mini_swe_agent/agent.py) runs as a separate process, as `agent.program`
runs it: mini-swe-agent's DefaultAgent and litellm model talk to a gateway session whose engine
is scripted (it writes the gold fix in mini-swe-agent's own action format, then the submit
command), its commands run in the task's container, and its diff is graded by the SWE grading.
The gold fix scores 1, an immediate submit 0, and no container is left behind.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("swebench")
pytest.importorskip("minisweagent")

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[3]
PROGRAM = REPO / "examples" / "mini_swe_agent" / "agent.py"
sys.path.insert(0, str(REPO / "tests"))

from smollm2_testing import smollm2_tokenizer  # noqa: E402

from rollhub.inference.engines.base import Generation, InferenceEngine  # noqa: E402
from rollhub.rollout.gateway import Gateway, GatewayConfig, build_gateway_app  # noqa: E402
from rollhub.rollout.gateway.programs import command_program, run_program_group  # noqa: E402
from rollhub.rollout.types import TrajectoryStatus  # noqa: E402

SUBMIT = "THOUGHT: the fix is in; submitting.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


def gold_reply(patch: str) -> str:
    """mini-swe-agent's text action format: one fenced `mswea_bash_command` block."""
    patch = patch if patch.endswith("\n") else patch + "\n"
    return f"THOUGHT: apply the fix.\n\n```mswea_bash_command\ngit apply <<'GOLD_FIX'\n{patch}GOLD_FIX\n```"


class ScriptedEngine(InferenceEngine):
    """Answers each generation with the next scripted text (then its end-of-turn token)."""

    max_positions = 8192

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    async def generate(self, input_ids, sampling, request_id=None):
        self.prompts.append(list(input_ids))
        text = self.replies.pop(0) if self.replies else "I am out of script."
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = ids[: sampling.max_new_tokens]
        return Generation(ids, [-0.5] * len(ids), [self.weight_version] * len(ids), "stop", request_id or "")

    async def update_weights(self, source, version):
        self.weight_version = version

    async def pause(self):
        return None

    async def resume(self):
        return None

    async def abort(self, request_id):
        return None


@contextlib.asynccontextmanager
async def served(gateway: Gateway) -> AsyncIterator[str]:
    from aiohttp import web

    runner = web.AppRunner(build_gateway_app(gateway))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def containers_of(session_ids: list[str]) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        return [
            c.name
            for session in session_ids
            for c in client.containers.list(all=True, filters={"label": f"rollhub.gateway.session={session[:60]}"})
        ]
    finally:
        client.close()


async def play(tasks, replies: list[str], tmp_path: Path, *extra: str, context_tokens: int = 8192):
    """One session of the program against a scripted gateway: (trajectory, the program's summary)."""
    tokenizer = smollm2_tokenizer()
    engine = ScriptedEngine(tokenizer, replies)
    gateway = Gateway(engine, tokenizer, GatewayConfig(default_max_tokens=512, max_context_tokens=context_tokens))
    result = tmp_path / "result.jsonl"
    program = command_program([sys.executable, str(PROGRAM), "--step-limit", "4", "--result", str(result), *extra])
    async with served(gateway) as url:
        group = await run_program_group(
            gateway, url, program, env_id="rollhub/SWE-v0", seed=0, group_size=1, timeout_s=400
        )
    [trajectory] = group.trajectories
    assert trajectory.status is not TrajectoryStatus.INFRA_FAILED, trajectory.infra_error
    summary = json.loads(result.read_text().splitlines()[-1])
    assert summary["instance_id"] == tasks[0].instance_id  # seed 0 -> task 0, as SWEEnv picks
    assert gateway.metrics.snapshot()["bridge_break_rate"] == 0.0  # every call extended the last one
    session = trajectory.info["session_id"]
    assert not containers_of([session])  # the program removed every container it started
    return trajectory, summary


async def test_gold_fix_scores_one_through_mini_swe_agent(tasks, tmp_path):
    trajectory, summary = await play(tasks, [gold_reply(tasks[0].patch), SUBMIT], tmp_path)
    assert summary["outcome"] == "graded" and summary["exit_status"] == "Submitted", summary
    assert summary["reward"] == 1.0 and summary["success"] and summary["resolution"] == "RESOLVED_FULL", summary
    assert summary["commands_run"] == 2 and summary["patch_chars"] > 0
    assert trajectory.total_reward == 1.0 and trajectory.success
    assert len(trajectory.turns) == 2  # one turn per model call, each prompt extending the last
    first, second = trajectory.turns
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == first.prompt_ids + first.response_ids
    assert "GOLD_FIX" in smollm2_tokenizer().decode(first.response_ids)


async def test_immediate_submit_scores_zero(tasks, tmp_path):
    trajectory, summary = await play(tasks, [SUBMIT], tmp_path)
    assert summary["outcome"] == "graded" and summary["exit_status"] == "Submitted", summary
    assert summary["reward"] == 0.0 and not summary["success"] and summary["resolution"] != "RESOLVED_FULL", summary
    assert trajectory.total_reward == 0.0 and not trajectory.success and len(trajectory.turns) == 1


@pytest.mark.slow  # a full program episode in a container; the gold and no-op cases stay in the default suite
async def test_no_submission_scores_zero_without_grading(tasks, tmp_path):
    # the gold fix applied but never submitted: fails closed, as SWEEnv's step limit does
    _, summary = await play(tasks, [gold_reply(tasks[0].patch)], tmp_path, "--step-limit", "1")
    assert summary["outcome"] == "not_submitted" and summary["exit_status"] == "LimitsExceeded", summary
    assert summary["reward"] == 0.0 and "resolution" not in summary


@pytest.mark.slow  # a full program episode in a container; the gold and no-op cases stay in the default suite
async def test_a_context_overflow_ends_the_episode_as_the_models_not_as_infra(tasks, tmp_path):
    # the first command's output (~10k characters) leaves the second prompt past the context
    flood = "THOUGHT: list numbers.\n\n```mswea_bash_command\nseq 1 5000\n```"
    trajectory, summary = await play(tasks, [flood, SUBMIT], tmp_path, context_tokens=3000)
    assert summary["outcome"] == "not_submitted" and summary["exit_status"] == "ContextWindowExceeded", summary
    assert summary["reward"] == 0.0 and summary["commands_run"] == 1
    assert len(trajectory.turns) == 1 and trajectory.total_reward == 0.0  # scored: the model's doing
