"""eval.in_trainer: the trainer's process plays a share of the held-out episodes beside the servers."""

import asyncio
import json

import pytest
from trainer_testing import tiny_recipe

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.envs.registry import make
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.agent import AgentConfig
from rollhub.trainer.config import RunConfig
from rollhub.trainer.evaluate import evaluate_model_dir, evaluate_policy

SOKOBAN = {"dim": 6, "num_boxes": 1, "max_steps": 3}


async def test_helpers_share_the_episodes_and_change_no_reading(tiny_model_dir):
    agent = AgentConfig(system_prompt="Sokoban.", history_window=1, max_new_tokens=6)
    seeds = list(range(500, 512))

    async def read(helpers: int):
        engines = [HFEngine(tiny_model_dir, max_batch_size=4) for _ in range(1 + helpers)]
        try:
            result = await evaluate_policy(
                engines[0],
                engines[0].tokenizer,
                lambda: make("rollhub/Sokoban-v0", **SOKOBAN),
                agent,
                seeds,
                max_concurrent=4,
                helpers=engines[1:],
            )
            return result, [engine.stats.requests_finished for engine in engines]
        finally:
            for engine in engines:
                await engine.close()

    alone, _ = await read(0)
    shared, finished = await read(1)
    assert all(count > 0 for count in finished), finished  # both engines played
    # greedy, the same weights: the same episodes, in seed order, whoever played them
    assert [t.seed for t in shared.trajectories] == seeds
    assert [t.turns[0].response_ids for t in shared.trajectories] == [
        t.turns[0].response_ids for t in alone.trajectories
    ]
    assert shared.success_rate == alone.success_rate and shared.mean_turns == alone.mean_turns


def test_in_trainer_needs_a_server_engine_and_one_rank(tiny_model_dir, tmp_path):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, eval={"episodes": 2, "in_trainer": True})
    with pytest.raises(UserError, match="eval.in_trainer needs engine.backend=server"):
        load_config(RunConfig, recipe)
    with pytest.raises(UserError, match="eval.in_trainer"):
        load_config(RunConfig, recipe, ["engine.backend=server", "trainer.world_size=2"])
    assert load_config(RunConfig, recipe, ["engine.backend=server", "engine.launch=rollhub"]).eval.in_trainer


def test_a_server_run_with_in_trainer_reads_what_its_final_model_reads_alone(tiny_model_dir, tmp_path, capsys):
    engine = {"backend": "server", "launch": "rollhub", "replicas": 1}
    recipe = tiny_recipe(tmp_path, tiny_model_dir, engine=engine, eval={"episodes": 6, "in_trainer": True})
    assert main(["train", str(recipe), "--no-progress"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # the final reading (server + the trainer's own engine) equals final_model/ read alone, in-process
    config = load_config(RunConfig, recipe, ["engine.backend=inprocess", "eval.in_trainer=false"])
    alone = asyncio.run(evaluate_model_dir(config, tmp_path / "run" / "final_model"))
    assert summary["final_success_rate"] == alone.success_rate
    assert summary["final_eval"]["mean_turns"] == alone.mean_turns
