"""verifiers environments through the adapter, against the real `verifiers` package: the sample
env built from its own classes, and a single-turn env built in the test."""

from __future__ import annotations

import pytest

vf = pytest.importorskip("verifiers")
datasets = pytest.importorskip("datasets")

from rollhub.envs import make  # noqa: E402
from rollhub.envs.checker import check_env  # noqa: E402
from rollhub.envs.registry import source_of  # noqa: E402

SAMPLE = "verifiers:rollhub.envs.adapters.samples_verifiers"


async def test_sample_passes_check_env():
    warnings = await check_env(SAMPLE)  # raises on any contract problem
    assert warnings == ["no random_action(); played an unparseable action instead"]
    assert source_of(SAMPLE) == "verifiers"


async def test_scripted_bisection_wins_and_the_rubric_pays_at_the_end():
    env = make(SAMPLE)
    obs, info = await env.reset(seed=2)
    low, high, rewards = 1, 16, []
    while True:
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = await env.step(f"<guess>{guess}</guess>")
        rewards.append(reward)
        if terminated or truncated:
            break
        low, high = (guess + 1, high) if obs[-1]["content"] == "Higher." else (low, guess - 1)
    assert terminated and not truncated and info["success"] and obs[-1]["content"] == "Correct!"
    assert rewards[-1] == 1.0 and sum(rewards[:-1]) == 0.0
    await env.close()


async def test_unparseable_reply_keeps_state_and_max_turns_truncates():
    env = make(SAMPLE, max_turns=3)
    _, info = await env.reset(seed=2)
    obs, reward, terminated, truncated, bad = await env.step("no tags here")
    assert (reward, terminated, truncated, bad["format_ok"], bad["anchor"]) == (
        0.0,
        False,
        False,
        False,
        info["anchor"],
    )
    # the refused reply counts as a step too: the adapter cuts at max_steps (= max_turns) = 3
    results = [await env.step("<guess>16</guess>") for _ in range(2)]
    assert [r[3] for r in results] == [False, True] and not any(r[2] for r in results)
    assert results[-1][1] == 0.0 and results[-1][4]["success"] is False
    await env.close()


@pytest.mark.parametrize("error, infra", [("ToolError", False), ("SandboxError", True)])
async def test_errors_in_env_response_map_by_kind(error, infra):
    """A tool broken by the reply is the model's failure; verifiers' InfraError family is machinery."""

    class Crashing(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            raise getattr(vf, error)("broken")

    rows = [{"question": "say something", "answer": "x"}]

    def paid(**kwargs) -> float:
        return 1.0  # a rubric that would pay: an error must still score 0

    env_obj = Crashing(dataset=datasets.Dataset.from_list(rows), rubric=vf.Rubric(funcs=[paid]), max_turns=4)
    from rollhub.envs.adapters.verifiers import VerifiersEnv

    env = VerifiersEnv(env_obj)
    await env.reset(seed=0)
    ended = await env.step("first")  # the env's reply to it raises: verifiers stops the rollout
    assert "error" in ended[0][-1]["content"]
    assert ended[1] == 0.0 and ended[2] is True and ("infra_failure" in ended[4]) is infra
    await env.close()


async def test_single_turn_env_built_from_the_package():
    rows = [{"question": f"{a}+{a}=?", "answer": str(2 * a)} for a in range(1, 5)]
    parser = vf.Parser()

    def exact(completion, answer, **kwargs) -> float:
        return 1.0 if parser.parse_answer(completion).strip() == answer else 0.0

    env_obj = vf.SingleTurnEnv(dataset=datasets.Dataset.from_list(rows), rubric=vf.Rubric(funcs=[exact]), parser=parser)
    from rollhub.envs.adapters.verifiers import VerifiersEnv

    env = VerifiersEnv(env_obj)
    assert env.max_steps == 1
    obs, _ = await env.reset(seed=1)
    assert obs[-1]["content"] == "2+2=?"
    _, reward, terminated, truncated, info = await env.step("4")
    assert reward == 1.0 and info["success"] and (terminated or truncated)
    await env.close()
