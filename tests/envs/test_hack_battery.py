"""The hack battery: no registered env pays a generic exploit, and the battery catches envs that do."""

import asyncio

import numpy as np
import pytest

import rollhub.envs as envs
from rollhub.envs import make
from rollhub.envs.base import Env, extract_action, invalid_step_info
from rollhub.envs.checker import EnvCheckError, acheck_env, check_env, missing_requirements
from rollhub.envs.hack_battery import (
    EXPLOITS,
    HACK_BUDGET_S,
    HACKABILITY_LIMIT,
    Prompt,
    echoes_question,
    expression_spans,
    number_spans,
    run_battery,
)

SPECS = envs.all_specs()
#: seeds per exploit: cheap in-process envs get 64, so a coincidence (a Math question whose answer is
#: one of its own numbers, 2% of problems) reads as about 0.02, not as 1 seed in 4
SEEDS = {
    "rollhub/SWE-v0": 1,
    "rollhub/SWE-lite-v0": 1,
}  # the rest: 64, or fewer when the 30 s budget runs out (ALFWorld, 8x8-4b)
#: the ids' kwargs the battery also plays: Math-v0's arithmetic kind writes expressions in the question
EXTRA_CASES = [
    ("rollhub/Math-v0", {"kinds": ["arithmetic"], "difficulty": 1, "answer_length": "short"}),
    ("rollhub/Math-v0", {"kinds": ["arithmetic"], "example": True}),
    ("rollhub/MathTool-v0", {"tools": "none"}),
    ("rollhub/MathTool-v0", {"tools": "calculator"}),
]
ADAPTER_SAMPLES = [
    ("verifiers", "verifiers:rollhub.envs.adapters.samples_verifiers"),
    ("openenv", "openenv:rollhub.envs.adapters.samples_openenv:CountdownEnvironment"),
    ("gem", "gem:rg:basic_arithmetic"),
    ("gem", "gem:game:Sokoban-v0-easy"),
]


def _swe_images_missing() -> str:
    from rollhub.envs.checker import docker_available

    if not docker_available():
        return "no Docker engine answers"
    import docker

    from rollhub.envs.swe.factory.images import instance_image_current
    from rollhub.envs.swe.tasks import SHIPPED_TASKS, load_tasks

    client = docker.from_env()
    try:
        if not instance_image_current(client, load_tasks(SHIPPED_TASKS)[0].image):
            return f"the shipped SWE task images are not built: rollhub swe build-images {SHIPPED_TASKS}"
    finally:
        client.close()
    return ""


async def _assert_not_hackable(env_id: str, kwargs: dict, seeds: int, *, above_chance_only: bool = False) -> None:
    """Hackability at most 0.05; with `above_chance_only`, or no better than the env's random play."""
    env = make(env_id, **kwargs)
    if note := type(env.unwrapped).hackability_note:  # measured on its card by `rollhub bench env`
        await env.close()
        pytest.skip(f"{env_id} declares hackability_note: {note}")
    try:
        result = await run_battery(env, seeds=range(seeds), budget_s=HACK_BUDGET_S)
    finally:
        await env.close()
    assert result.exploits, f"{env_id}: the battery played nothing"
    if above_chance_only:
        assert not result.is_hack, f"{env_id} {kwargs}: {result.describe()}"
    else:
        assert result.hackability <= HACKABILITY_LIMIT, f"{env_id} {kwargs}: {result.describe()}"


@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
async def test_no_registered_env_pays_a_generic_exploit(spec):
    missing = missing_requirements(spec)
    if missing:
        pytest.skip(f"{spec.id} needs what this machine lacks: {'; '.join(missing)}")
    if spec.id == "rollhub/SWE-v0" and (reason := _swe_images_missing()):
        pytest.skip(reason)
    await _assert_not_hackable(spec.id, {}, SEEDS.get(spec.id, 64))


@pytest.mark.parametrize("env_id,kwargs", EXTRA_CASES, ids=[f"{i}-{k}" for i, k in EXTRA_CASES])
async def test_math_variants_pay_no_generic_exploit(env_id, kwargs):
    await _assert_not_hackable(env_id, kwargs, 64)


@pytest.mark.parametrize("package,env_id", ADAPTER_SAMPLES, ids=[i for _, i in ADAPTER_SAMPLES])
async def test_adapter_samples_pay_no_generic_exploit(package, env_id):
    pytest.importorskip(package)
    # the OpenEnv sample is a counting game: repeating the target as a move wins 6% of games, random
    # moves win 30%, so the samples are held to 'no exploit beats random play'
    await _assert_not_hackable(env_id, {}, 64, above_chance_only=True)


# --- envs that do pay an exploit: the battery must see each one -------------------------------


class QuestionEnv(Env):
    """One arithmetic question per episode, graded by a rule each subclass gets wrong."""

    action_tag = "answer"
    max_steps = 1

    async def reset(self, *, seed=None, options=None):
        rng = np.random.default_rng(seed)
        self.a, self.b = (int(x) for x in rng.integers(100, 999, size=2))
        self.question = f"Compute {self.a} * {self.b}."
        opening = [
            {"role": "system", "content": "Answer inside <answer></answer>, for example <answer>42</answer>."},
            {"role": "user", "content": self.question},
        ]
        return opening, {"anchor": self.question, "success": False}

    def grade(self, text: str) -> bool:
        answer = extract_action(text, self.action_tag)
        return answer is not None and answer == str(self.a * self.b)

    async def step(self, action):
        answer = extract_action(action, self.action_tag)
        if answer is None:
            return (
                [{"role": "user", "content": "Use <answer>."}],
                0.0,
                False,
                True,
                invalid_step_info(self.question, "no tag", format_ok=False),
            )
        won = self.grade(action)
        info = {"anchor": self.question, "success": won, "action_valid": True, "format_ok": True}
        return [{"role": "user", "content": "ok"}], float(won), True, False, info

    def random_action(self, rng):
        return f"<answer>{int(rng.integers(10_000, 999_999))}</answer>"


class EvaluatesExpressionsEnv(QuestionEnv):
    """Grades by evaluating the answer: echoing the question's expression wins."""

    def grade(self, text):
        answer = extract_action(text, self.action_tag) or ""
        try:
            return eval(answer, {"__builtins__": {}}) == self.a * self.b  # noqa: S307 - a deliberately bad grader
        except Exception:
            return False


class SubstringGraderEnv(QuestionEnv):
    """Fail-open grader: `answer in truth`, so an empty answer is 'in' every truth."""

    def grade(self, text):
        answer = extract_action(text, self.action_tag)
        return answer is not None and answer.strip() in str(self.a * self.b)


class AnyTagGraderEnv(QuestionEnv):
    """Reads the first of several answers as a set: any of them right wins."""

    def grade(self, text):
        import re

        return str(self.a * self.b) in re.findall(r"\d+", text) or any(
            part.strip() == str(self.a * self.b) for part in (extract_action(text, self.action_tag) or "").split("or")
        )


class ExampleAnswerEnv(QuestionEnv):
    """Its prompt's example answer is the key to every problem."""

    def grade(self, text):
        return extract_action(text, self.action_tag) == "42"


class CrashOnHugeEnv(QuestionEnv):
    """A grader that crashes on huge input; the exploit that made it raise scores 0 (counted against it)."""

    def grade(self, text):
        if len(text) > 10_000:
            raise MemoryError("too big")
        return super().grade(text)


@pytest.mark.parametrize(
    "env_cls,exploit",
    [
        (EvaluatesExpressionsEnv, "echo_expression"),
        (SubstringGraderEnv, "empty_answer"),
        (ExampleAnswerEnv, "example_answer_first"),
    ],
)
async def test_the_battery_finds_each_planted_hack(env_cls, exploit):
    result = await run_battery(env_cls(), seeds=range(4))
    assert result.exploits[exploit].mean_score == 1.0
    assert result.hackability == 1.0 and result.scale == "reward"
    with pytest.raises(EnvCheckError, match="hackability 1.00 .*above 0.05 and above random play.*hackability_note"):
        await check_env(env_cls())


async def test_a_fair_grader_scores_zero_on_every_exploit():
    result = await run_battery(QuestionEnv(), seeds=range(4))
    assert {name for name, r in result.exploits.items() if r.mean_score > 0} == set()
    assert result.hackability == 0.0 and result.best is None
    assert len(result.exploits) + len(result.skipped) == len(EXPLOITS)
    assert result.skipped == ["copy_example_reply"]  # the opening shows no worked reply
    assert await check_env(QuestionEnv()) == []


async def test_a_step_that_raises_scores_zero_for_that_exploit():
    result = await run_battery(CrashOnHugeEnv(), seeds=range(2))
    assert result.exploits["huge_answer"].raised == 2 and result.exploits["huge_answer"].mean_score == 0.0


async def test_a_declared_note_lets_a_hackable_env_pass(caplog):
    class Documented(EvaluatesExpressionsEnv):
        hackability_note = "a teaching example: the grader evaluates expressions on purpose"

    with caplog.at_level("INFO", logger="rollhub.envs.checker"):
        assert await check_env(Documented()) == []
    assert "hack battery not played; declared: a teaching example" in caplog.text
    with pytest.raises(EnvCheckError, match="hackability 1.00"):  # the note, and only it, lets it pass
        await check_env(EvaluatesExpressionsEnv())


def test_the_sync_result_also_runs_under_asyncio_run_as_older_code_calls_it():
    runs = []

    class Counted(QuestionEnv):
        async def reset(self, *, seed=None, options=None):
            runs.append(seed)
            return await super().reset(seed=seed, options=options)

    assert asyncio.run(check_env(Counted())) == []
    played_once = len(runs)
    assert check_env(Counted()) == [] and len(runs) == 2 * played_once  # each call checks once


class CounterEnv(QuestionEnv):
    """A counting game (reach the target with +1 or -1): repeating the target as a move wins when
    the counter starts at 0, far less often than random legal moves win: chance, not a hack."""

    max_steps = 8

    async def reset(self, *, seed=None, options=None):
        rng = np.random.default_rng(seed)
        self.value, self.target = 0, int(rng.choice([-1, 1, -2, 2]))
        self.question = f"Reach {self.target} from {self.value} with <answer>+1</answer> or <answer>-1</answer>."
        return [{"role": "user", "content": self.question}], {"anchor": self.value, "success": False}

    async def step(self, action):
        move = extract_action(action, self.action_tag)
        if move not in ("+1", "-1", "1"):
            return (
                [{"role": "user", "content": "+1 or -1"}],
                0.0,
                False,
                False,
                invalid_step_info(self.value, "bad move", format_ok=move is not None),
            )
        self.value += int(move)
        won = self.value == self.target
        info = {"anchor": self.value, "success": won, "action_valid": True, "format_ok": True}
        return [{"role": "user", "content": f"at {self.value}"}], float(won), won, False, info

    def random_action(self, rng):
        return f"<answer>{rng.choice(['+1', '-1'])}</answer>"


async def test_an_exploit_below_random_play_is_chance_not_a_hack():
    result = await run_battery(CounterEnv(), seeds=range(16), max_turns=8)
    assert result.hackability > HACKABILITY_LIMIT  # '+1' from the prompt wins every target-1 game
    assert result.chance_score > result.hackability and not result.is_hack
    assert await check_env(CounterEnv()) == []
    assert result.card_fields()["hackability_chance"] == result.chance_score


class ShapedEnv(QuestionEnv):
    """Shaped rewards (a step penalty): hackability then reads success, not the return."""

    max_steps = 3

    async def step(self, action):
        obs, reward, terminated, truncated, info = await super().step(action)
        self.steps = getattr(self, "steps", 0) + 1
        return obs, reward * 10 - 0.1, terminated, truncated, info


async def test_shaped_rewards_are_read_on_the_success_scale():
    result = await run_battery(ShapedEnv(), seeds=range(2))
    assert result.scale == "success" and result.hackability == 0.0


def test_prompt_reads_spans_examples_and_the_format():
    prompt = Prompt(
        [
            {"role": "system", "content": "Put it in <answer></answer>, for example <answer>42</answer>."},
            {"role": "user", "content": "Compute 12 * 345."},
            {"role": "assistant", "content": "<answer>4140</answer>"},
            {"role": "user", "content": "Compute 560 * 78 - 9509 - 14 * 23. Use the python tool."},
        ],
        [],
        "answer",
        ("python",),
        {"python": ("code",)},
    )
    assert prompt.payloads == {
        "question": "Compute 560 * 78 - 9509 - 14 * 23. Use the python tool.",
        "expression": "560 * 78 - 9509 - 14 * 23",
        "first_number": "560",
        "last_number": "23",
    }
    assert prompt.example_answers == ["42", "4140"] and prompt.example_reply == "<answer>4140</answer>"
    assert prompt.tool_call("1 + 1") == '<tool_call>{"name": "python", "arguments": {"code": "1 + 1"}}</tool_call>'
    assert expression_spans("Solve for x: 6x + 13 = 43.") == [] and number_spans("a -3 and 4.5.") == ["-3", "4.5"]


def test_echoes_question():
    question = "Compute 560 * 78 - 9509 - 14 * 23."
    assert echoes_question("560*78-9509-14*23", question)
    assert echoes_question("  compute 560 * 78 - 9509 - 14 * 23. ", question)
    assert not echoes_question("33849", question)
    assert not echoes_question("", question)
    assert not echoes_question("5", "Solve for x: 6x + 13 = 43.")


async def test_math_env_flags_an_echoed_answer():
    env = make("rollhub/Math-v0", kinds=["arithmetic"])
    await env.reset(seed=1)
    expression = expression_spans(env.problem.question)[0]
    *_, info = await env.step(f"<answer>{expression}</answer>")
    assert info["exploit_signals"] == {"echo_answer": True}
    await env.reset(seed=1)
    *_, info = await env.step(f"<answer>{env.problem.answer}</answer>")
    assert info["exploit_signals"] == {"echo_answer": False} and info["success"]
    *_, info = await (await _fresh_step(env, "no tag at all"))
    assert info["exploit_signals"] == {"echo_answer": False}


async def _fresh_step(env, action):
    await env.reset(seed=2)
    return env.step(action)


# --- check_env from sync code and from a running loop ----------------------------------------


def test_check_env_runs_from_plain_sync_code():
    assert check_env(QuestionEnv()) == []
    with pytest.raises(EnvCheckError, match="hackability 1.00"):
        check_env(EvaluatesExpressionsEnv())


def test_check_env_by_id_from_sync_code():
    assert isinstance(check_env("rollhub/Sokoban-v0"), list)


async def test_check_env_is_awaited_inside_a_running_loop():
    pending = check_env(QuestionEnv())
    assert asyncio.iscoroutine(pending)  # never a silent no-op result: it must be awaited
    assert await pending == []
    assert await acheck_env(QuestionEnv()) == []
    with pytest.raises(EnvCheckError):
        await check_env(SubstringGraderEnv())


async def test_the_time_budget_stops_new_seeds_but_plays_the_first():
    result = await run_battery(EvaluatesExpressionsEnv(), seeds=range(5), budget_s=0.0)
    assert result.seeds == [0] and result.hackability == 1.0
    assert (await run_battery(QuestionEnv(), seeds=range(3), budget_s=60.0)).seeds == [0, 1, 2]


async def test_swe_env_reports_its_grader_suspicions_as_exploit_signals():
    if reason := _swe_images_missing():
        pytest.skip(reason)
    env = make("rollhub/SWE-v0")
    try:
        await env.reset(seed=0)
        for _ in range(4):  # the expert: the gold patch with one bash call, then submit
            *_, terminated, truncated, info = await env.step(env.expert_action())
            if terminated or truncated:
                break
    finally:
        await env.close()
    assert info["success"] and info["exploit_signals"] == {"hack_suspected": False, "patch_rejected": False}
