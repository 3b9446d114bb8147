"""`python -m experiments.sokoban.policy_probe`: how good is a Sokoban policy move by move, measured exactly.

Held-out success at T = 1 on 100 seeds has a standard error of ~5 points, too coarse to tell
whether an RL run moved the policy. This probe computes, with no sampling, the probability
a checkpoint puts on an optimal move (and on a wall move) on fixed boards:

  solver    boards on the solver's own paths from held-out seeds;
  after-wall  the same boards as the env shows them after a move into a wall
            ("Invalid: ..." above the grid), where rollouts of a clean-SFT policy go wrong.

Optimal moves are those after which the solver's plan is shortest. The prompt is the
Markov agent's (`agent.observation_only`): system prompt + the board, so the numbers match
what the policy sees in the main recipe. Each model is scored on the same boards.

  python -m experiments.sokoban.policy_probe --set models=runs/sokoban_tiny/sft_model,runs/sokoban_tiny/final_model
"""

from __future__ import annotations

import argparse
import asyncio
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.sokoban.cli import main as tool_main
from rollhub.bench.report import bench_setup, print_table, save_json, save_plot
from rollhub.core.errors import UserError


@dataclass
class ProbeConfig:
    models: str = ""  # comma-separated HF checkpoint folders
    recipe: str = "configs/sokoban_tiny.yaml"  # env kwargs, system prompt, temperature
    seeds: int = 150  # held-out puzzles whose solver paths give the boards
    seed_offset: int = 5_000_000  # disjoint from training, SFT and evaluation seeds
    threads: int = 1

    def validate(self) -> None:
        if self.seeds < 1:
            raise ValueError("seeds must be >= 1")


QUICK = ["seeds=3"]


@dataclass
class Board:
    kind: str  # "solver" or "after-wall"
    observation: list[dict[str, str]]
    optimal: set[str]
    walls: set[str]


async def collect_boards(env_id: str, env_kwargs: dict[str, Any], seeds: range) -> list[Board]:
    """Solver-path boards, each also as shown after a wall move when it has one."""
    import rollhub.envs as envs
    from rollhub.envs.base import wrap_action
    from rollhub.envs.sokoban.grid import MOVES
    from rollhub.envs.sokoban.solver import solve

    kwargs = {**env_kwargs, "max_steps": 1000}  # wall moves must not end the probe episode
    boards: list[Board] = []
    for seed in seeds:
        env = envs.make(env_id, **kwargs)
        try:
            observation, _ = await env.reset(seed=seed)
            while True:
                board = env.board
                lengths = {}
                for move in MOVES:
                    after, _ = board.try_move(move)
                    plan = solve(after) if after is not None else None
                    if plan is not None:
                        lengths[move] = len(plan)
                walls = {m for m in MOVES if board.try_move(m)[0] is None}
                if lengths:
                    best = min(lengths.values())
                    optimal = {m for m, n in lengths.items() if n == best}
                    boards.append(Board("solver", [m for m in observation if m["role"] != "system"], optimal, walls))
                    if walls:
                        shown, *_ = await env.step(wrap_action(sorted(walls)[0], env.action_tag))
                        boards.append(Board("after-wall", list(shown), optimal, walls))
                observation, _, terminated, truncated, _ = await env.step(env.expert_action())
                if terminated or truncated:
                    break
        finally:
            await env.close()
    return boards


def score_model(
    path: str, boards: list[Board], system_prompt: str | None, temperature: float
) -> dict[str, dict[str, float]]:
    """P(optimal move) and P(wall move) per board kind, from whole-answer likelihoods."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollhub.envs.sokoban.grid import MOVES

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    answers = [
        tokenizer.encode(f"<action>{m}</action>", add_special_tokens=False) + [tokenizer.eos_token_id] for m in MOVES
    ]
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    sums: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for board in boards:
            text = tokenizer.apply_chat_template(system + board.observation, tokenize=False, add_generation_prompt=True)
            prompt = tokenizer.encode(text, add_special_tokens=False)
            rows = [prompt + a for a in answers]
            width = max(len(r) for r in rows)
            ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
            logp = torch.log_softmax(model(input_ids=ids).logits.float() / temperature, -1)
            scores = []
            for row, answer in enumerate(answers):
                positions = range(len(prompt) - 1, len(prompt) - 1 + len(answer))
                scores.append(sum(float(logp[row, p, answer[k]]) for k, p in enumerate(positions)))
            probs = {m: math.exp(s) for m, s in zip(MOVES, scores)}
            entry = sums.setdefault(board.kind, {"n": 0, "p_optimal": 0.0, "p_wall": 0.0, "p_any_move": 0.0})
            entry["n"] += 1
            entry["p_optimal"] += sum(probs[m] for m in board.optimal)
            entry["p_wall"] += sum(probs[m] for m in board.walls)
            entry["p_any_move"] += sum(probs.values())
    return {kind: {k: (v / e["n"] if k != "n" else v) for k, v in e.items()} for kind, e in sums.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rollhub.core.config import load_config
    from rollhub.trainer.config import RunConfig

    cfg, out = bench_setup(ProbeConfig, args, QUICK)
    models = [m.strip() for m in cfg.models.split(",") if m.strip()]
    if not models:
        raise UserError("say which checkpoints to probe: --set models=RUN/sft_model,RUN/final_model")
    missing = [m for m in models if not (Path(m) / "config.json").exists()]
    if missing:
        raise UserError(f"not a model folder (no config.json): {', '.join(missing)}")
    torch.set_num_threads(cfg.threads)
    recipe = load_config(RunConfig, cfg.recipe, [])
    if not recipe.env.id.startswith("rollhub/Sokoban"):
        raise UserError(f"policy-probe knows Sokoban only; the recipe's env is {recipe.env.id}")
    boards = asyncio.run(
        collect_boards(recipe.env.id, dict(recipe.env.kwargs), range(cfg.seed_offset, cfg.seed_offset + cfg.seeds))
    )
    rows = []
    for path in models:
        for kind, stats in score_model(path, boards, recipe.agent.system_prompt, recipe.agent.temperature).items():
            rows.append({"model": path, "boards": kind, **stats})  # n = number of boards
    print_table("exact move probabilities on fixed held-out boards", rows)
    result = {"benchmark": "policy-probe", "config": vars(cfg), "rows": rows}
    save_json(out / "result.json", result)
    save_plot(out / "policy_probe.png", _draw, rows, models)
    return result


def _draw(ax: Any, rows: list[dict[str, Any]], models: list[str]) -> None:
    kinds = sorted({r["boards"] for r in rows})
    width = 0.8 / max(1, len(models))
    for i, model in enumerate(models):
        values = [next((r["p_optimal"] for r in rows if r["model"] == model and r["boards"] == k), 0.0) for k in kinds]
        ax.bar([j + i * width for j in range(len(kinds))], values, width, label=Path(model).name or model)
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(kinds))], kinds)
    ax.set_ylabel("P(optimal move)")
    ax.set_ylim(0, 1)
    ax.legend()


def main(argv: list[str] | None = None) -> int:
    return tool_main(run, "policy-probe", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
