"""`python -m experiments.sokoban.sokoban_failures`: where a Sokoban policy fails, measured episode by episode.

RL on the main recipe stalls near the imitation (SFT) ceiling (LOG.md). To know which
failures RL would have to remove, this bench plays a checkpoint on the recipe's held-out
evaluation seeds (`seed_offset` 1,000,000 = `eval.seed_offset`, never trained or SFT'd on)
through the real agent loop and in-process engine, then replays every episode's answers on a
fresh env of the same seed, so every board is known, and sorts each episode into one outcome:

  solved        the boxes reached the targets;
  dead_corner   a push left a box on a dead cell (no push sequence reaches a target) with
                walls on two perpendicular sides; dead_wall: against one wall, away from
                corners; dead_other: any other dead position (no wall next to the box, or
                boxes that block each other);
  format_error  not solved, never dead, at least one answer that was no move;
  horizon_live  cut off at max_steps with the box still live and well-formed answers;
  other         ended by a model failure of the agent loop (context, env error).

Per episode it also counts wasted moves up to the first dead board (invalid: a wall or blocked
push; format; away: a valid move after which the optimal plan is longer; equal: one after which
it is as long) and finds the first non-optimal move. A board is "on path" when the solver's
distance-to-go is d0 - (steps taken so far): a state on some shortest plan, reached without
a wasted step, i.e. what solver demos can show. The first error is on path by construction
(every earlier move was optimal), so the bench also says whether it was on the solver's own
plan (the exact boards a demo of that seed shows), and gives P(optimal move) per move on on-path vs
off-path boards, off-path split into after a rejected answer (the prompt then starts with
"Invalid: ...", never in clean demos) and after a valid wasted move.

  python -m experiments.sokoban.sokoban_failures --set models=RUN/sft_model,RUN/final_model [--set temperature=0]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.sokoban.cli import main as tool_main
from rollhub.bench.report import print_table, save_json, save_plot
from rollhub.core.errors import UserError

#: every episode gets exactly one of these (their shares sum to 1)
OUTCOMES = ("solved", "dead_corner", "dead_wall", "dead_other", "horizon_live", "format_error", "other")
#: kinds of a non-optimal move, each a wasted step
WASTE_KINDS = ("invalid", "format", "away", "equal")
#: d0 (optimal plan length at reset) buckets for success by difficulty
D0_BUCKETS = ((1, 3), (4, 6), (7, 10))


@dataclass
class FailuresConfig:
    models: str = ""  # comma-separated HF checkpoint folders
    recipe: str = "configs/sokoban_tiny.yaml"  # env kwargs (eval env), agent, engine, model.device
    seeds: int = 100
    seed_offset: int = 1_000_000  # the recipe's held-out evaluation seeds (eval.seed_offset)
    samples_per_seed: int = 4  # at temperature 0 one sample per seed is played (greedy samples are identical)
    temperature: float = 1.0  # 0 = greedy
    # the JSON, the PNG next to it; empty: OUT_DIR/result.json (`--out`)
    out: str = ""
    progress: bool = True  # a tqdm bar per model on stderr

    def validate(self) -> None:
        if self.seeds < 1 or self.samples_per_seed < 1:
            raise ValueError("seeds and samples_per_seed must be >= 1")
        if self.seed_offset < 0:
            raise ValueError(f"seed_offset must be >= 0, got {self.seed_offset}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.out and not self.out.endswith(".json"):
            raise ValueError(f"out is the JSON file to write (ending in .json), got {self.out!r}")


QUICK = ["seeds=3", "samples_per_seed=1"]


# --- classifying one episode ------------------------------------------------------------------


@dataclass
class Move:
    """One answer of an episode, on a board before the episode went dead."""

    step: int  # env steps taken before it
    kind: str  # "optimal" or one of WASTE_KINDS
    on_path: bool  # distance-to-go of the board == d0 - step
    on_solver_plan: bool  # the board the solver's own plan reaches after `step` moves (an SFT demo's)
    after_rejected: bool  # the previous answer was rejected, so the prompt showed "Invalid: ..."


@dataclass
class EpisodeAnalysis:
    seed: int
    outcome: str  # one of OUTCOMES
    d0: int  # optimal plan length at reset
    steps: int  # answers played (replayed)
    wasted: dict[str, int]  # per WASTE_KINDS, counted up to and including the push that went dead
    moves: list[Move] = field(default_factory=list, repr=False)
    dead_step: int | None = None  # index of the push that left the position dead

    @property
    def first_error(self) -> Move | None:
        return next((m for m in self.moves if m.kind != "optimal"), None)

    def record(self) -> dict[str, Any]:
        first = self.first_error
        return {
            "seed": self.seed,
            "outcome": self.outcome,
            "d0": self.d0,
            "steps": self.steps,
            "wasted": dict(self.wasted),
            "dead_step": self.dead_step,
            "first_error": dataclasses.asdict(first) if first else None,
        }


def dead_kind(board: Any, box: int | None, live_cells: dict[int, int]) -> str:
    """corner / wall / other for a dead position, from the walls around the box just pushed."""
    if box is None or box in live_cells:  # no single box on a dead cell: boxes block each other
        return "other"
    w = board.width
    vertical = not board.floor[box - w] or not board.floor[box + w]
    horizontal = not board.floor[box - 1] or not board.floor[box + 1]
    if vertical and horizontal:
        return "corner"
    return "wall" if vertical or horizontal else "other"


async def analyse_episode(
    env: Any, seed: int, actions: Sequence[str], *, options: dict[str, Any] | None = None, ended_early: bool = False
) -> EpisodeAnalysis:
    """Replay `actions` (the model's answer texts) on `env` reset with `seed` and classify the episode.

    The env is the real SokobanEnv, so answers are parsed and moves applied exactly as in the
    episode. Distance-to-go comes from the solver directly (None = dead) rather than from
    `env.distance_to_go`, which caps live plans at max_steps (the env's shaping needs that, this
    table wants the true lengths).
    `ended_early`: the agent loop stopped the episode for a model failure (not the env).
    """
    from rollhub.envs.sokoban.solver import push_distances, solve

    await env.reset(seed=seed, options=options)
    start = env.board
    cache: dict[bytes, int | None] = {}

    def distance(board: Any) -> int | None:
        key = board.anchor()
        if key not in cache:
            plan = solve(board)
            cache[key] = None if plan is None else len(plan)
        return cache[key]

    d0 = distance(start)
    if d0 is None:
        raise ValueError(f"seed {seed}: the solver finds no plan from the start")
    plan_boards = [start.anchor()]
    board = start
    for move in solve(start) or []:
        board = board.after([move])
        plan_boards.append(board.anchor())
    live = push_distances(start)  # walls and targets only: the same for every board of the episode
    wasted = dict.fromkeys(WASTE_KINDS, 0)
    moves: list[Move] = []
    outcome, dead_step, rejected, format_errors, truncated = "", None, False, 0, False
    for step, action in enumerate(actions):
        before = env.board
        d_before = distance(before)
        _, _, terminated, truncated, info = await env.step(action)
        after = env.board
        if not info.get("format_ok", True):
            kind = "format"
            format_errors += 1
        elif not info.get("action_valid", True):
            kind = "invalid"
        else:
            d_after = distance(after)
            if d_after is not None and d_after == d_before - 1:
                kind = "optimal"
            elif d_after is not None and d_after == d_before:
                kind = "equal"
            else:
                kind = "away"
        on_path = d_before == d0 - step
        on_plan = step < len(plan_boards) and before.anchor() == plan_boards[step]
        moves.append(Move(step, kind, on_path, on_plan, rejected))
        if kind != "optimal":
            wasted[kind] += 1
        rejected = kind in ("format", "invalid")
        if after.solved:
            outcome = "solved"
        elif kind == "away" and distance(after) is None:
            pushed = next(iter(after.boxes - before.boxes), None)
            outcome, dead_step = f"dead_{dead_kind(after, pushed, live)}", step
        if outcome:
            break
        if terminated or truncated:
            if step + 1 < len(actions):
                raise ValueError(f"seed {seed}: the episode ended after {step + 1} of {len(actions)} answers")
            break
    if not outcome:
        if format_errors:
            outcome = "format_error"
        elif truncated and not ended_early:
            outcome = "horizon_live"
        else:
            outcome = "other"
    return EpisodeAnalysis(seed, outcome, d0, len(moves), wasted, moves, dead_step)


# --- summarising ----------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _bucket(d0: int) -> str:
    for lo, hi in D0_BUCKETS:
        if lo <= d0 <= hi:
            return f"{lo}-{hi}"
    return f"{D0_BUCKETS[-1][1] + 1}+"


def room_outcomes(episodes: list[EpisodeAnalysis]) -> dict[str, Any]:
    """Each room (seed) by its samples: all solved, mixed or all failed, which is what a training
    group of that room would carry (only a mixed room gives GiGPO an outcome signal), and where
    the all-failed rooms first go wrong. RL removes mixed rooms first; the all-failed ones are
    rooms the policy gets wrong every time, so their first error says what RL has to change."""
    by_seed: dict[int, list[EpisodeAnalysis]] = {}
    for e in episodes:
        by_seed.setdefault(e.seed, []).append(e)
    solved = {seed: [e.outcome == "solved" for e in group] for seed, group in by_seed.items()}
    all_failed = [seed for seed, wins in solved.items() if not any(wins)]
    firsts = [f for seed in all_failed for e in by_seed[seed] if (f := e.first_error) is not None]
    rooms = len(by_seed)
    return {
        "rooms": rooms,
        "samples_per_room": max((len(g) for g in by_seed.values()), default=0),
        "all_solved": sum(all(w) for w in solved.values()) / rooms if rooms else float("nan"),
        "mixed": sum(any(w) and not all(w) for w in solved.values()) / rooms if rooms else float("nan"),
        "all_failed": len(all_failed) / rooms if rooms else float("nan"),
        "all_failed_rooms": {
            "n": len(all_failed),
            "mean_d0": _mean([by_seed[seed][0].d0 for seed in all_failed]),
            "first_error_mean_step": _mean([f.step for f in firsts]),
            "first_error_kind_shares": {k: _mean([f.kind == k for f in firsts]) for k in WASTE_KINDS},
        },
    }


def summarise(episodes: list[EpisodeAnalysis]) -> dict[str, Any]:
    """Success, outcome shares, wasted moves, first errors and P(optimal) by board kind."""
    n = len(episodes)
    failed = [e for e in episodes if e.outcome != "solved"]
    by_bucket: dict[str, dict[str, float]] = {}
    for label in [f"{lo}-{hi}" for lo, hi in D0_BUCKETS] + sorted({_bucket(e.d0) for e in episodes}):
        group = [e for e in episodes if _bucket(e.d0) == label]
        if group or "+" not in label:
            by_bucket[label] = {"n": len(group), "success": _mean([e.outcome == "solved" for e in group])}
    wasted_failed = {k: _mean([e.wasted[k] for e in failed]) for k in WASTE_KINDS}
    wasted_failed["total"] = _mean([sum(e.wasted.values()) for e in failed])
    firsts = [f for e in episodes if (f := e.first_error) is not None]
    failed_firsts = [f for e in failed if (f := e.first_error) is not None]
    moves = [m for e in episodes for m in e.moves]

    def p_optimal(selected: list[Move]) -> dict[str, float]:
        return {"n": len(selected), "p_optimal": _mean([m.kind == "optimal" for m in selected])}

    off = [m for m in moves if not m.on_path]
    return {
        "episodes": n,
        "success": _mean([e.outcome == "solved" for e in episodes]),
        "success_by_d0": by_bucket,
        "rooms": room_outcomes(episodes),
        "outcome_shares": {o: (sum(e.outcome == o for e in episodes) / n if n else 0.0) for o in OUTCOMES},
        "outcome_counts": {o: sum(e.outcome == o for e in episodes) for o in OUTCOMES},
        "wasted_per_failed_episode": wasted_failed,
        "wasted_per_episode_by_outcome": {
            o: _mean([sum(e.wasted.values()) for e in episodes if e.outcome == o])
            for o in OUTCOMES
            if any(e.outcome == o for e in episodes)
        },
        "first_error": {
            "episodes_with_error": len(firsts),
            "on_path": _mean([f.on_path for f in firsts]),
            "on_solver_plan": _mean([f.on_solver_plan for f in firsts]),
            "mean_step": _mean([f.step for f in firsts]),
            "kind_shares": {k: _mean([f.kind == k for f in firsts]) for k in WASTE_KINDS},
            "failed_episodes_on_solver_plan": _mean([f.on_solver_plan for f in failed_firsts]),
        },
        "p_optimal_by_board": {
            "on_path": p_optimal([m for m in moves if m.on_path]),
            "on_solver_plan": p_optimal([m for m in moves if m.on_solver_plan]),
            "on_path_other_plan": p_optimal([m for m in moves if m.on_path and not m.on_solver_plan]),
            "off_path": p_optimal(off),
            "off_path_after_rejected": p_optimal([m for m in off if m.after_rejected]),
            "off_path_after_valid": p_optimal([m for m in off if not m.after_rejected]),
        },
    }


def _table_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"metric": "success", "value": summary["success"], "n": summary["episodes"]}]
    for label, entry in summary["success_by_d0"].items():
        rows.append({"metric": f"success d0 {label}", "value": entry["success"], "n": entry["n"]})
    rooms = summary["rooms"]
    for key in ("all_solved", "mixed", "all_failed"):
        rows.append({"metric": f"rooms {key.replace('_', ' ')}", "value": rooms[key], "n": rooms["rooms"]})
    hard = rooms["all_failed_rooms"]
    rows.append({"metric": "all-failed rooms: d0", "value": hard["mean_d0"], "n": hard["n"]})
    rows.append(
        {"metric": "all-failed rooms: first error step", "value": hard["first_error_mean_step"], "n": hard["n"]}
    )
    for kind in ("invalid", "away"):
        share = hard["first_error_kind_shares"][kind]
        rows.append({"metric": f"all-failed rooms: first error {kind}", "value": share, "n": hard["n"]})
    for outcome, share in summary["outcome_shares"].items():
        rows.append({"metric": f"share {outcome}", "value": share, "n": summary["outcome_counts"][outcome]})
    failed = summary["episodes"] - summary["outcome_counts"]["solved"]
    for kind, value in summary["wasted_per_failed_episode"].items():
        rows.append({"metric": f"wasted/failed ep. {kind}", "value": value, "n": failed})
    first = summary["first_error"]
    for key in ("on_path", "on_solver_plan", "failed_episodes_on_solver_plan", "mean_step"):
        rows.append({"metric": f"first error {key}", "value": first[key], "n": first["episodes_with_error"]})
    for board, entry in summary["p_optimal_by_board"].items():
        rows.append({"metric": f"P(optimal) {board}", "value": entry["p_optimal"], "n": entry["n"]})
    return rows


# --- playing --------------------------------------------------------------------------------


async def play_and_classify(
    model: str, recipe: Any, cfg: FailuresConfig, env_id: str, env_kwargs: dict[str, Any]
) -> tuple[list[EpisodeAnalysis], dict[str, int]]:
    """Play the held-out episodes with the in-process engine, then classify each by replay."""
    from tqdm import tqdm

    from rollhub.envs.registry import make
    from rollhub.inference.engines.build import build_engine
    from rollhub.trainer.build import model_device
    from rollhub.trainer.evaluate import evaluate_policy

    samples = 1 if cfg.temperature == 0 else cfg.samples_per_seed
    seeds = list(range(cfg.seed_offset, cfg.seed_offset + cfg.seeds))
    engine_config = dataclasses.replace(recipe.engine, backend="inprocess")
    engine = build_engine(engine_config, model, device=model_device(recipe))
    bar = tqdm(total=len(seeds) * samples, desc=Path(model).name or model, unit="ep", disable=not cfg.progress)
    try:
        result = await evaluate_policy(
            engine,
            engine.tokenizer,
            lambda: make(env_id, **env_kwargs),
            recipe.agent,
            seeds,
            temperature=cfg.temperature,
            max_concurrent=recipe.env.max_concurrent,
            env_id=env_id,
            on_done=bar.update,
            samples_per_seed=samples,
        )
    finally:
        bar.close()
        await engine.close()
    episodes: list[EpisodeAnalysis] = []
    checks = {"infra_failures": 0, "replay_mismatches": 0}
    env = make(env_id, **env_kwargs)
    try:
        for trajectory in result.trajectories:
            if not trajectory.scored:  # the machinery's failure says nothing about the policy
                checks["infra_failures"] += 1
                continue
            actions = [turn.response_text for turn in trajectory.turns]
            analysis = await analyse_episode(
                env, int(trajectory.seed), actions, ended_early=trajectory.model_failure is not None
            )
            checks["replay_mismatches"] += (analysis.outcome == "solved") != bool(trajectory.success)
            episodes.append(analysis)
    finally:
        await env.close()
    return episodes, checks


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rollhub.core.config import load_config
    from rollhub.envs.run_checks import check_env_kwargs
    from rollhub.trainer.config import RunConfig

    overrides = [*QUICK, *args.overrides] if args.quick else list(args.overrides)
    cfg = load_config(FailuresConfig, None, overrides)
    models = [m.strip() for m in cfg.models.split(",") if m.strip()]
    if not models:
        raise UserError("say which checkpoints to play: --set models=RUN/sft_model,RUN/final_model")
    missing = [m for m in models if not (Path(m) / "config.json").is_file()]
    if missing:
        raise UserError(f"not a model folder (no config.json): {', '.join(missing)}")
    recipe = load_config(RunConfig, cfg.recipe, [])
    env_id = recipe.eval_env_id
    if not env_id.startswith("rollhub/Sokoban"):
        raise UserError(f"sokoban-failures knows Sokoban only; the recipe's evaluation env is {env_id}")
    env_kwargs = check_env_kwargs(env_id, recipe.eval_env_kwargs)
    held_out = recipe.eval.seed_range
    if cfg.seed_offset == held_out.start and cfg.seeds <= len(held_out):
        split = f"held-out evaluation seeds [{cfg.seed_offset}, {cfg.seed_offset + cfg.seeds}) of {cfg.recipe}"
    else:
        split = f"seeds [{cfg.seed_offset}, {cfg.seed_offset + cfg.seeds}) (not the recipe's evaluation range)"
    samples = 1 if cfg.temperature == 0 else cfg.samples_per_seed
    plays = f"{samples} sample(s) per seed at T={cfg.temperature:g}" + (
        " (greedy: one sample, repeats would be identical)" if cfg.temperature == 0 and cfg.samples_per_seed > 1 else ""
    )
    print(f"sokoban-failures: {split}; {plays}; env {env_id} {env_kwargs}")
    summaries: dict[str, Any] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    for model in models:
        episodes, checks = asyncio.run(play_and_classify(model, recipe, cfg, env_id, env_kwargs))
        summaries[model] = {**summarise(episodes), **checks}
        records[model] = [e.record() for e in episodes]
        print_table(f"{model}: failures on {split}, {plays}", _table_rows(summaries[model]))
        if checks["infra_failures"] or checks["replay_mismatches"]:
            infra, mismatches = checks["infra_failures"], checks["replay_mismatches"]
            print(f"  infra failures left out: {infra}, replay mismatches: {mismatches}")
    result = {
        "benchmark": "sokoban-failures",
        "config": vars(cfg),
        "split": split,
        "plays": plays,
        "env": {"id": env_id, "kwargs": env_kwargs},
        "outcomes": list(OUTCOMES),
        "models": summaries,
        "episodes": records,
    }
    out = _json_path(cfg, args)
    save_json(out, result)
    save_plot(out.with_suffix(".png"), _draw, summaries)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return result


def _json_path(cfg: FailuresConfig, args: argparse.Namespace) -> Path:
    """`--set out=FILE.json`, else OUT_DIR/result.json as the other tools write."""
    return Path(cfg.out) if cfg.out else Path(args.out) / "result.json"


def _draw(ax: Any, summaries: dict[str, dict[str, Any]]) -> None:
    width = 0.8 / max(1, len(summaries))
    for i, (model, summary) in enumerate(summaries.items()):
        values = [summary["outcome_shares"][o] for o in OUTCOMES]
        ax.bar(
            [j + i * width for j in range(len(OUTCOMES))],
            values,
            width,
            label="/".join(Path(model).parts[-2:]) or model,
        )
    ax.set_xticks([j + width * (len(summaries) - 1) / 2 for j in range(len(OUTCOMES))], OUTCOMES, rotation=30)
    ax.set_ylabel("share of episodes")
    ax.set_ylim(0, 1)
    ax.set_title("Sokoban episode outcomes")
    ax.legend()


def main(argv: list[str] | None = None) -> int:
    return tool_main(run, "sokoban-failures", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
