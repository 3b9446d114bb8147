"""Agent layer: incremental prompts equal what the model saw, guards, format errors, resubmits."""

from __future__ import annotations

import asyncio

import pytest
from rollout_testing import CountdownEnv, RecordingEngine

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams
from rollhub.rollout.agent import AgentConfig, EpisodeRunner, run_episode
from rollhub.rollout.types import TrajectoryStatus


async def test_full_history_prompt_ids_are_incremental_and_match_the_model_input(engine):
    tokenizer = engine.tokenizer
    recorder = RecordingEngine(engine)
    env = CountdownEnv(max_steps=4)
    trajectory = await run_episode(env, recorder, tokenizer, AgentConfig(max_new_tokens=6, temperature=1.0), seed=2)
    assert trajectory.status == TrajectoryStatus.TRUNCATED and len(trajectory.turns) == 4
    assert [t.prompt_ids for t in trajectory.turns] == recorder.prompts  # exactly what the engine got
    for previous, turn in zip(trajectory.turns, trajectory.turns[1:]):
        assert (
            turn.prompt_ids[: len(previous.prompt_ids) + len(previous.response_ids)]
            == previous.prompt_ids + previous.response_ids
        )
    sequences = trajectory.packed_sequences()
    assert len(sequences) == 1
    last = trajectory.turns[-1]
    assert sequences[0].input_ids == last.prompt_ids + last.response_ids
    assert sum(sequences[0].response_mask) == trajectory.num_response_tokens
    # the text form of the ids is the chat template's rendering of the same conversation
    # whenever responses end with the end-of-turn token; here we check the opening and the tail
    rendered_head = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Count down. Answer with <action>N</action>."},
            {"role": "user", "content": "Start at 12."},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert tokenizer.decode(trajectory.turns[0].prompt_ids) == rendered_head
    assert tokenizer.decode(last.prompt_ids).endswith(
        "<|im_start|>user\nStep 3: say a number.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert trajectory.info["format_errors"] == sum(not t.format_ok for t in trajectory.turns)
    assert trajectory.info["format_errors"] > 0  # a random model rarely writes the tag


async def test_ids_equal_template_rendering_when_turns_end_with_eos(engine):
    """Force the end-of-turn token so the whole conversation text is comparable."""
    tokenizer = engine.tokenizer
    eos = tokenizer.eos_token_id

    class EosEngine(RecordingEngine):
        async def generate(self, input_ids, sampling, request_id=None):
            self.prompts.append(list(input_ids))
            tokens = tokenizer.encode("<action>7</action>", add_special_tokens=False) + [eos]
            return Generation(tokens, [-1.0] * len(tokens), [0] * len(tokens), "stop")

    env = CountdownEnv(max_steps=3)
    runner = EpisodeRunner(env, tokenizer, AgentConfig(), env_id="test/Countdown-v0", seed=1)
    await runner.reset()
    eos_engine = EosEngine(engine)
    while (request := runner.next_request()) is not None:
        generation = await runner.generate(eos_engine, *request)
        await runner.step_env(request[0], generation)
    trajectory = runner.trajectory
    assert all(t.format_ok and t.action_valid for t in trajectory.turns)
    last = trajectory.turns[-1]
    before_last = runner.messages[:-2]  # the last assistant answer and the env's final reply come after
    assert tokenizer.decode(last.prompt_ids) == tokenizer.apply_chat_template(
        before_last, tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.decode(last.prompt_ids + last.response_ids) + "\n" == tokenizer.apply_chat_template(
        runner.messages[:-1], tokenize=False
    )


async def test_history_window_keeps_head_and_last_k_turns(engine):
    config = AgentConfig(max_new_tokens=4, history_window=1)
    trajectory = await run_episode(CountdownEnv(max_steps=4), engine, engine.tokenizer, config, seed=0)
    turns = trajectory.turns
    head = turns[0].prompt_ids  # opening messages + generation prompt
    assert all(t.prompt_ids[: len(head) - 3] == head[:-3] for t in turns)  # opening kept
    assert len(turns[3].prompt_ids) < len(turns[2].prompt_ids) + len(turns[2].response_ids) + 20
    assert len(trajectory.packed_sequences()) == 3  # turn 1 still extends turn 0; from turn 2 on the prefix breaks


async def test_observation_only_prompt_is_system_plus_latest_observation(engine):
    tokenizer = engine.tokenizer
    config = AgentConfig(max_new_tokens=4, observation_only=True, system_prompt="Count.")
    runner = EpisodeRunner(CountdownEnv(max_steps=4), tokenizer, config, env_id="test/Countdown-v0", seed=0)
    trajectory = await run_episode(CountdownEnv(max_steps=4), engine, tokenizer, config, seed=0)
    assert len(trajectory.turns) == 4
    await runner.reset()
    opening = runner.messages
    assert tokenizer.decode(trajectory.turns[0].prompt_ids) == tokenizer.apply_chat_template(
        opening, tokenize=False, add_generation_prompt=True
    )
    # every later prompt renders exactly [system, latest observation] + generation prompt
    history = [{"role": "system", "content": "Count."}]
    previous = trajectory.turns
    for before, turn in zip(previous, previous[1:]):
        expected = tokenizer.apply_chat_template(
            history + list(before.observation), tokenize=False, add_generation_prompt=True
        )
        assert tokenizer.decode(turn.prompt_ids) == expected
    assert len({len(t.prompt_ids) for t in trajectory.turns[1:]}) <= 2  # no growth with the turn count
    assert len(trajectory.packed_sequences()) == 4  # each turn is its own training row
    with pytest.raises(ValueError, match="observation_only"):
        AgentConfig(observation_only=True, history_window=1).validate()


async def test_empty_system_prompt_drops_the_system_message(engine):
    tokenizer = engine.tokenizer
    config = AgentConfig(max_new_tokens=4, observation_only=True, system_prompt="")
    trajectory = await run_episode(CountdownEnv(max_steps=3), engine, tokenizer, config, seed=0)
    runner = EpisodeRunner(CountdownEnv(max_steps=3), tokenizer, config, env_id="test/Countdown-v0", seed=0)
    await runner.reset()
    assert [m["role"] for m in runner.messages] == ["user"]
    for before, turn in zip(trajectory.turns, trajectory.turns[1:]):
        expected = tokenizer.apply_chat_template(list(before.observation), tokenize=False, add_generation_prompt=True)
        assert tokenizer.decode(turn.prompt_ids) == expected
        assert "system" not in tokenizer.decode(turn.prompt_ids)


async def test_context_guard_truncates_and_reports(engine):
    config = AgentConfig(max_new_tokens=16, min_new_tokens=8, max_context_tokens=90)
    trajectory = await run_episode(CountdownEnv(max_steps=50), engine, engine.tokenizer, config, seed=0)
    assert trajectory.status == TrajectoryStatus.TRUNCATED
    assert trajectory.info["truncated_reason"] == "context"
    assert all(len(t.prompt_ids) + len(t.response_ids) <= 90 for t in trajectory.turns)
    assert len(trajectory.turns) < 50


async def test_format_penalty_and_infra_failure(engine):
    config = AgentConfig(max_new_tokens=4, format_penalty=-0.5)
    trajectory = await run_episode(CountdownEnv(max_steps=2), engine, engine.tokenizer, config, seed=0)
    for turn in trajectory.turns:
        assert turn.reward == pytest.approx((0.1 if turn.action_valid else -0.1) + (0.0 if turn.format_ok else -0.5))
    failed = await run_episode(CountdownEnv(max_steps=5, fail_on_step=2), engine, engine.tokenizer, config, seed=0)
    assert failed.status == TrajectoryStatus.INFRA_FAILED and "crashed" in failed.infra_error
    failed_reset = await run_episode(CountdownEnv(fail_reset=True), engine, engine.tokenizer, config, seed=0)
    assert failed_reset.status == TrajectoryStatus.INFRA_FAILED and not failed_reset.turns


@pytest.mark.parametrize("mode", ["partial", "regenerate"])
async def test_weight_update_mid_turn_versions_per_segment(engine, tiny_model_and_tokenizer, mode):
    model, tokenizer = tiny_model_and_tokenizer
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    config = AgentConfig(max_new_tokens=120, max_context_tokens=1024, resume_mode=mode)
    runner = EpisodeRunner(CountdownEnv(max_steps=1), tokenizer, config, env_id="test/Countdown-v0", seed=0)
    await runner.reset()
    prompt, sampling = runner.next_request()
    sampling = SamplingParams(max_new_tokens=120, stop_token_ids=(10**9,))
    task = asyncio.create_task(runner.generate(engine, prompt, sampling))
    while engine.stats.generated_tokens < 10:
        await asyncio.sleep(0.005)
    await engine.pause()
    await engine.update_weights(weights, version=1)
    await engine.resume()
    generation = await task
    assert len(generation.token_ids) == 120 and generation.finish_reason == "length"
    assert runner.trajectory.info["aborts"] == 1 and runner.trajectory.info["resubmits"] == 1
    if mode == "partial":
        assert generation.token_versions[0] == 0 and generation.token_versions[-1] == 1
        assert generation.token_versions == sorted(generation.token_versions)
        assert runner.trajectory.info["discarded_tokens"] == 0
    else:
        assert generation.token_versions == [1] * 120
        assert runner.trajectory.info["discarded_tokens"] >= 1
    await engine.update_weights(weights, version=0)


def test_agent_config_validation():
    with pytest.raises(ValueError, match="resume_mode"):
        AgentConfig(resume_mode="sometimes").validate()
    with pytest.raises(ValueError, match="max_context_tokens"):
        AgentConfig(max_context_tokens=4, min_new_tokens=8).validate()


async def test_per_turn_mode_renders_the_window_and_keeps_generated_ids(engine):
    """multi_turn=per_turn: each prompt is the template's rendering of the visible messages."""
    tokenizer = engine.tokenizer
    recorder = RecordingEngine(engine)
    config = AgentConfig(max_new_tokens=5, multi_turn="per_turn", history_window=1)
    trajectory = await run_episode(CountdownEnv(max_steps=4), recorder, tokenizer, config, seed=1)
    assert [t.prompt_ids for t in trajectory.turns] == recorder.prompts
    opening = [
        {"role": "system", "content": "Count down. Answer with <action>N</action>."},
        {"role": "user", "content": "Start at 11."},
    ]
    turns = trajectory.turns
    for k, turn in enumerate(turns):
        window = (
            [] if k == 0 else [{"role": "assistant", "content": turns[k - 1].response_text}, *turns[k - 1].observation]
        )
        rendered = tokenizer.apply_chat_template(opening + window, tokenize=False, add_generation_prompt=True)
        assert turn.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
    for sequence in trajectory.packed_sequences():  # masks cover exactly the generated ids
        trained = [i for i, m in zip(sequence.input_ids, sequence.response_mask) if m]
        indices = sorted({t for t in sequence.turn_index if t >= 0})
        assert trained == [i for k in indices for i in turns[k].response_ids]


def test_multi_turn_knob_is_validated():
    AgentConfig(multi_turn="per_turn").validate()
    with pytest.raises(ValueError, match="multi_turn"):
        AgentConfig(multi_turn="rerender").validate()


async def test_evaluation_reports_accuracy_among_well_formed_answers(engine):
    """Math-v0 grades an untagged reply too (format error): well_formed_accuracy leaves those out."""
    from rollhub.envs.registry import make
    from rollhub.trainer.evaluate import evaluate_policy

    tokenizer = engine.tokenizer
    replies = {0: "<answer>{}</answer>", 1: "<answer>{}</answer>", 2: "<answer>{}1</answer>", 3: "it is {}"}

    class Answerer(InferenceEngine):
        """Answers "Compute a + b." problems in the form chosen by the problem's position."""

        async def generate(self, input_ids, sampling, request_id=None):
            prompt = tokenizer.decode(input_ids)
            expression = prompt.rsplit("Compute ", 1)[1].split(".", 1)[0]
            first, op, second = expression.split()
            value = int(first) + int(second) if op == "+" else int(first) - int(second)
            seed = int(request_id.split("-")[1])
            ids = tokenizer.encode(replies[seed].format(value), add_special_tokens=False) + [tokenizer.eos_token_id]
            return Generation(ids, [-1.0] * len(ids), [0] * len(ids), "stop")

        async def update_weights(self, source, version): ...
        async def pause(self): ...
        async def resume(self): ...
        async def abort(self, request_id): ...

    def make_env():
        return make("rollhub/Math-v0", kinds=["arithmetic"], difficulty=1)

    result = await evaluate_policy(
        Answerer(), tokenizer, make_env, AgentConfig(), [0, 1, 2, 3], env_id="rollhub/Math-v0"
    )
    assert result.success_rate == 0.75  # the untagged reply is graded correct
    assert result.format_error_rate == 0.25
    assert result.well_formed_episodes == 3 and result.well_formed_accuracy == pytest.approx(2 / 3)
    assert result.metrics()["eval/well_formed_accuracy"] == pytest.approx(2 / 3)
