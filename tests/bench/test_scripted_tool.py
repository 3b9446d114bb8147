"""The scripted MathTool policy of `bench async --set agent=mathtool-script` (rollhub/bench/scripted_tool.py).

It must play MathTool as a trained policy would (one valid `python` call, then the tool's output
as the answer), through the real agent loop, and at the real engine's pace: the wrapped engine
decodes exactly as many tokens as each scripted reply has.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollhub.bench.scripted_tool import SCRIPTED_KINDS, ScriptedReplyEngine, mathtool_reply
from rollhub.cli import main
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.agent import AgentConfig
from rollhub.rollout.config import EnvConfig, RolloutConfig
from rollhub.rollout.manager import EnvManager

KINDS_ARG = json.dumps({"kinds": list(SCRIPTED_KINDS)})


async def _play(engine: ScriptedReplyEngine, groups: int, env_kwargs: dict) -> list:
    manager = EnvManager(
        engine,
        engine.tokenizer,
        env=EnvConfig(id="rollhub/MathTool-v0", kwargs=env_kwargs, max_concurrent=64),
        rollout=RolloutConfig(group_size=1, async_ratio=0),
        agent=AgentConfig(max_new_tokens=64, max_turns=4, max_context_tokens=4096, temperature=1.0),
        seeds=iter(range(groups)),
    )
    try:
        batch = await manager.collect_batch(groups)
    finally:
        await manager.close()
    return [t for group in batch for t in group.trajectories]


async def test_the_script_calls_the_tool_once_then_answers_its_output_on_every_kind(tiny_model_dir: Path):
    inner = HFEngine(tiny_model_dir, threads=1, max_batch_size=16, seed=0)
    engine = ScriptedReplyEngine(inner, inner.tokenizer)
    try:
        trajectories = await _play(engine, 8, {"kinds": list(SCRIPTED_KINDS)})
    finally:
        await engine.close()
    assert len(trajectories) == 8
    for trajectory in trajectories:
        call, answer = trajectory.turns  # exactly two turns: the call, then the answer
        assert call.response_text.startswith('<tool_call>{"name": "python"') and trajectory.info["tool_calls"] == 1
        assert answer.response_text.startswith("<answer>") and trajectory.success, trajectory.info
        for turn in trajectory.turns:
            # timed on the real engine: it sampled one logprob per scripted token, and the reply ends the turn
            assert len(turn.behaviour_logprobs) == len(turn.response_ids) > 1
            assert turn.response_ids[-1] == inner.tokenizer.eos_token_id and turn.finish_reason == "stop"
    assert engine.replies == 16


def test_an_output_without_an_integer_is_called_again_and_the_last_question_is_the_episodes():
    prompt = "user\nCompute 12 * 345.\nassistant\n<tool_call>{}</tool_call>\ntool\n4140\nuser\nCompute 7 + 8 + 9."
    call = mathtool_reply(prompt)
    assert json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]["code"] == (
        "print(7 + 8 + 9)"
    )
    assert mathtool_reply(prompt + "\nassistant\n" + call + "\ntool\n24") == "<answer>24</answer>"
    assert mathtool_reply(prompt + "\nassistant\n" + call + "\ntool\nTimeoutError") == call
    power = "What is the remainder when 17 to the power of 45 is divided by 97?"
    assert "pow(17, 45, 97)" in mathtool_reply(power)
    with pytest.raises(ValueError, match="no arithmetic question"):
        mathtool_reply("A farm packs 30 eggs a day for 4 days and sells 7 of them. How many eggs are still there?")


def test_a_reply_longer_than_the_token_budget_is_counted_as_cut():
    from rollhub.inference.models import build_tokenizer

    tokenizer = build_tokenizer()
    engine = ScriptedReplyEngine(None, tokenizer)  # reply_ids needs no model
    ids = engine.reply_ids(tokenizer.encode("user\nCompute 4821 * 377.", add_special_tokens=False), 64)
    assert engine.cut == 0 and ids[-1] == tokenizer.eos_token_id and engine.longest == len(ids)
    assert len(engine.reply_ids(tokenizer.encode("Compute 4821 * 377."), 8)) == 8 and engine.cut == 1


def test_the_scripted_agent_refuses_other_envs_and_word_problems_in_one_line(capsys):
    assert main(["bench", "async", "rollhub/Sokoban-v0", "--set", "agent=mathtool-script"]) == 2
    err = capsys.readouterr().err
    assert "plays MathTool only" in err and len(err.strip().splitlines()) == 1
    assert main(["bench", "async", "rollhub/MathTool-v0", "--set", "agent=mathtool-script"]) == 2
    err = capsys.readouterr().err
    assert "kinds among" in err and "'word'" in err and len(err.strip().splitlines()) == 1
    argv = ["bench", "async", "rollhub/MathTool-v0", "--set", "agent=mathtool-script", "--set", "engine=latency-model"]
    assert main(argv) == 2
    assert "use engine=tiny" in capsys.readouterr().err


@pytest.mark.docker
@pytest.mark.slow
def test_bench_async_on_the_sandbox_backend_starts_containers_and_solves(tmp_path):
    """The whole benchmark on real containers: every episode calls the tool once in a container."""
    from rollhub.envs.checker import docker_available

    if not docker_available():
        pytest.skip("no Docker engine")
    out = tmp_path / "mathtool-sandbox.json"
    kwargs = json.dumps({"backend": "sandbox", "kinds": list(SCRIPTED_KINDS)})
    argv = ["bench", "async", "rollhub/MathTool-v0", "--quick", "--set", "agent=mathtool-script"]
    argv += ["--set", "max_new_tokens=64", "--set", f"env_kwargs={kwargs}", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["tool_calls_per_episode"] == 1.0 and result["success_rate"] == 1.0
    assert result["turns_per_episode"] == 2.0
    # a container's python3 takes tens of milliseconds at least; the embedded interpreter ~0.03 ms
    assert result["env_step_max_s"] > 0.02
