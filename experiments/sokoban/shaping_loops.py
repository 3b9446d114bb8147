"""`python -m experiments.sokoban.shaping_loops`: can a policy farm a Sokoban recipe's shaped reward by walking loops?

An RL policy maximises return, so a reward that pays something on a loop of positions (a
lap that ends where it started) is paid again on every lap, without solving anything. This
bench builds each room's whole state graph (every position reachable from the start by valid
moves; invalid moves are self-loops priced at the preset's invalid reward), prices every move
with the env's own `SokobanEnv.move_reward` and looks for a loop with positive total reward,
exactly: Bellman-Ford for longest paths from a virtual source, which stops relaxing within
|V| rounds unless such a loop exists, and then returns one.

It searches on residual rewards r(s, s') - k (d(s) - d(s')), d the solver's distance-to-go:
the potential term telescopes around any loop, so a loop pays the same in both, and with
exact potential shaping every residual is 0 and the search ends after one round.

Pricings (all with the recipe's rooms and preset):
  recipe           the recipe's env as configured;
  potential        `progress_clip` off: k (d(s) - d(s')) on every valid move;
  dead-clip        `progress_clip` on: as potential, but a push into a dead position costs -k;
  clip-every-move  the first clip (LOG.md), every move's shaping clipped to [-k, k] (kept as
                   the counter-example: a push that adds j >= 2 moves costs only -k, and each
                   lap that undoes it pays (j - 1) k).

A loop longer than the recipe's max_steps still pays: a policy laps part of it every episode.

  python -m experiments.sokoban.shaping_loops [--set recipes=configs/sokoban_tiny.yaml,configs/sokoban_6x6_2b.yaml]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.sokoban.cli import main as tool_main
from rollhub.bench.report import bench_setup, print_table, save_json, save_plot
from rollhub.core.errors import UserError

PRICINGS = ("recipe", "potential", "dead-clip", "clip-every-move")
#: rewards are sums of a few multiples of 0.1; smaller differences are float noise
TOLERANCE = 1e-9


@dataclass
class ShapingLoopsConfig:
    recipes: str = "configs/sokoban_tiny.yaml,configs/sokoban_6x6_2b.yaml"  # their training env
    pricings: str = "recipe,potential,dead-clip,clip-every-move"
    rooms: int = 40  # per recipe: seeds seed_offset, seed_offset + 1, ...
    seed_offset: int = 0
    progress_reward: float | None = None  # k; None = the recipe's (0.3 when it has none)
    max_states: int = 50_000  # positions per room; a room with more is skipped and counted
    progress: bool = True  # a tqdm bar per recipe on stderr

    def validate(self) -> None:
        if self.rooms < 1:
            raise ValueError(f"rooms must be >= 1, got {self.rooms}")
        if self.seed_offset < 0:
            raise ValueError(f"seed_offset must be >= 0, got {self.seed_offset}")
        if self.max_states < 2:
            raise ValueError(f"max_states must be >= 2, got {self.max_states}")
        if self.progress_reward is not None and self.progress_reward <= 0:
            raise ValueError(f"progress_reward must be > 0, got {self.progress_reward}")
        unknown = [p for p in self.pricing_list if p not in PRICINGS]
        if unknown or not self.pricing_list:
            raise ValueError(
                f"pricings must be a comma-separated subset of {', '.join(PRICINGS)}, got {self.pricings!r}"
            )
        if not self.recipe_list:
            raise ValueError("recipes must name at least one recipe YAML")

    @property
    def pricing_list(self) -> list[str]:
        return [p.strip() for p in self.pricings.split(",") if p.strip()]

    @property
    def recipe_list(self) -> list[str]:
        return [r.strip() for r in self.recipes.split(",") if r.strip()]


QUICK = ["rooms=3", "recipes=configs/sokoban_tiny.yaml"]


# --- the state graph and the loop search ------------------------------------------------------


@dataclass
class StateGraph:
    """Every position reachable from a room's start; edge i goes src[i] -> dst[i] by moves[i]."""

    boards: list[Any]
    src: np.ndarray
    dst: np.ndarray
    moves: list[str]
    complete: bool  # False when max_states cut the search short


def state_graph(env: Any, start: Any, max_states: int) -> StateGraph:
    """Breadth-first over valid moves; solved positions (and dead ones when the env ends
    episodes there) are terminal, and each invalid move is a self-loop."""
    from rollhub.envs.sokoban.env import is_deadlocked
    from rollhub.envs.sokoban.grid import MOVES
    from rollhub.envs.sokoban.solver import push_distances

    live_cells = push_distances(start)
    index = {start.anchor(): 0}
    boards, src, dst, moves = [start], [], [], []
    frontier = 0
    while frontier < len(boards):
        board = boards[frontier]
        if board.solved or (env.end_on_deadlock and is_deadlocked(board, live_cells)):
            frontier += 1
            continue
        for move in MOVES:
            after, _ = board.try_move(move)
            key = (after or board).anchor()
            if key not in index:
                if len(boards) >= max_states:
                    return StateGraph(boards, np.array(src), np.array(dst), moves, complete=False)
                index[key] = len(boards)
                boards.append(after)
            src.append(frontier)
            dst.append(index[key])
            moves.append(move)
        frontier += 1
    return StateGraph(boards, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), moves, complete=True)


def _cycle_in_predecessors(pred_edge: np.ndarray, src: np.ndarray) -> list[int] | None:
    """A cycle of the predecessor graph (each node's last improving edge), as edge indices in
    walking order, or None. Pointer doubling finds a node on a cycle in log2(n) numpy passes."""
    n = len(pred_edge)
    sink = n
    parent = np.full(n + 1, sink, dtype=np.int64)
    has = pred_edge >= 0
    parent[:n][has] = src[pred_edge[has]]
    jump = parent.copy()
    for _ in range(max(1, int(np.ceil(np.log2(n + 1))))):
        jump = jump[jump]
    # a node 2^m >= n + 1 parent steps up from any node is on a cycle (a path that long repeats)
    reached = jump[:n][jump[:n] != sink]
    if len(reached) == 0:
        return None
    node = int(reached[0])
    edges = []
    current = node
    for _ in range(n):
        edge = int(pred_edge[current])
        edges.append(edge)
        current = int(src[edge])
        if current == node:
            return edges[::-1]
    raise AssertionError("pointer doubling gave a node that is not on a cycle")


def paying_loop(n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> list[int] | None:
    """Edge indices of a loop whose weights sum to more than TOLERANCE, or None when none exists.

    Bellman-Ford for longest paths from a virtual source joined to every node (all distances
    start at 0): without a positive loop nothing relaxes after at most n rounds. Each round
    relaxes every edge at once (numpy); every 8 rounds the predecessor graph is checked for a
    cycle, which is returned once its weight is checked to be positive.
    """
    if len(src) == 0:
        return None
    dist = np.zeros(n)
    pred_edge = np.full(n, -1, dtype=np.int64)
    for round_ in range(n + 1):
        candidate = dist[src] + weight
        better = np.nonzero(candidate > dist[dst] + TOLERANCE)[0]
        if len(better) == 0:
            return None
        order = better[np.lexsort((candidate[better], dst[better]))]
        last_per_node = np.r_[dst[order][1:] != dst[order][:-1], True]
        chosen = order[last_per_node]
        dist[dst[chosen]] = candidate[chosen]
        pred_edge[dst[chosen]] = chosen
        if round_ % 8 == 7 or round_ == n:
            cycle = _cycle_in_predecessors(pred_edge, src)
            if cycle is not None and weight[cycle].sum() > TOLERANCE:
                return cycle
    raise RuntimeError("Bellman-Ford still relaxing after n rounds but no positive predecessor cycle")  # unreachable


# --- pricing a room ---------------------------------------------------------------------------


def price_edges(env: Any, graph: StateGraph, pricing: str, k: float) -> tuple[np.ndarray, np.ndarray]:
    """(reward, residual) of every edge under `pricing`; residual = reward - k (d(s) - d(s'))."""
    distance = np.array([env.distance_to_go(board) for board in graph.boards], dtype=float)
    invalid = env.rewards.invalid
    reward = np.empty(len(graph.src))
    for i, (s, t) in enumerate(zip(graph.src, graph.dst)):
        if s == t:
            reward[i] = invalid  # an invalid move: the position stays, the env pays its invalid reward
            continue
        before, after = graph.boards[s], graph.boards[t]
        if pricing == "clip-every-move":
            # the first clip's pricing: the preset's terms plus the potential step clipped to [-k, k]
            base = env.move_reward(before, after) - env.progress_reward * (distance[s] - distance[t])
            reward[i] = base + k * float(np.clip(distance[s] - distance[t], -1.0, 1.0))
        else:
            reward[i] = env.move_reward(before, after)
    residual = reward - k * (distance[graph.src] - distance[graph.dst])
    return reward, residual


def pricing_kwargs(kwargs: dict[str, Any], pricing: str, k: float) -> dict[str, Any]:
    """The env arguments a pricing is measured with: the recipe's, or its shaping set to k with
    the dead-push clip on (dead-clip) or off (potential; clip-every-move reprices on top)."""
    if pricing == "recipe":
        return dict(kwargs)
    return {**kwargs, "progress_reward": k, "progress_clip": pricing == "dead-clip"}


async def _room(env: Any, seed: int, cfg: ShapingLoopsConfig, pricing: str, k: float) -> dict[str, Any]:
    await env.reset(seed=seed)
    start = env.board
    graph = state_graph(env, start, cfg.max_states)
    row: dict[str, Any] = {"seed": seed, "states": len(graph.boards), "complete": graph.complete}
    if not graph.complete:
        return row
    reward, residual = price_edges(env, graph, pricing, k)
    # valid moves that do not solve the room (the success reward is meant to exceed the potential)
    solved = np.array([board.solved for board in graph.boards])
    moved = (graph.src != graph.dst) & ~solved[graph.dst]
    row["moves_priced_above_potential"] = int(((residual > TOLERANCE) & moved).sum())
    row["valid_moves"] = int(moved.sum())
    loop = paying_loop(len(graph.boards), graph.src, graph.dst, residual)
    row["paying_loop"] = loop is not None
    if loop is not None:
        row["lap_moves"] = len(loop)
        row["lap_reward"] = float(reward[loop].sum())
        row["lap"] = " ".join(graph.moves[e] for e in loop)
        row["lap_start"] = graph.boards[int(graph.src[loop[0]])].render()
    return row


def _summary(recipe: str, pricing: str, k: float, rooms: list[dict[str, Any]]) -> dict[str, Any]:
    searched = [r for r in rooms if r["complete"]]
    paying = [r for r in searched if r["paying_loop"]]
    valid = sum(r["valid_moves"] for r in searched)
    return {
        "recipe": Path(recipe).stem,
        "pricing": pricing,
        "rooms": len(searched),
        "skipped": len(rooms) - len(searched),  # more than max_states positions
        "positions": statistics.median(r["states"] for r in searched) if searched else 0,  # median per room
        "paying loop": len(paying),  # rooms with one
        "share": len(paying) / len(searched) if searched else 0.0,
        # share of valid, non-solving moves paid more than the potential step k (d(s) - d(s'))
        "above potential": sum(r["moves_priced_above_potential"] for r in searched) / max(1, valid),
        "lap / k": statistics.median(r["lap_reward"] / k for r in paying) if paying else 0.0,  # median
        "lap moves": statistics.median(r["lap_moves"] for r in paying) if paying else 0,  # median
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rollhub.core.config import load_config
    from rollhub.envs.registry import make
    from rollhub.envs.run_checks import check_env_kwargs
    from rollhub.trainer.config import RunConfig

    cfg, out = bench_setup(ShapingLoopsConfig, args, QUICK)
    from tqdm import tqdm

    rows, details = [], {}
    for recipe_path in cfg.recipe_list:
        if not Path(recipe_path).is_file():
            raise UserError(f"no recipe at {recipe_path}")
        recipe = load_config(RunConfig, recipe_path, [])
        env_id = recipe.env.id
        if not env_id.startswith("rollhub/Sokoban"):
            raise UserError(f"shaping-loops knows Sokoban only; {recipe_path} trains on {env_id}")
        kwargs = check_env_kwargs(env_id, recipe.env.kwargs)
        k = cfg.progress_reward or float(kwargs.get("progress_reward") or 0.3)
        seeds = range(cfg.seed_offset, cfg.seed_offset + cfg.rooms)
        bar = tqdm(total=len(seeds) * len(cfg.pricing_list), desc=Path(recipe_path).stem, disable=not cfg.progress)
        for pricing in cfg.pricing_list:
            env_kwargs = pricing_kwargs(kwargs, pricing, k)
            env = make(env_id, **env_kwargs)
            rooms = []
            for seed in seeds:
                rooms.append(asyncio.run(_room(env, seed, cfg, pricing, k)))
                bar.update()
            summary = _summary(recipe_path, pricing, k, rooms)
            summary["k"] = k
            rows.append(summary)
            details[f"{recipe_path}:{pricing}"] = {
                "env": {"id": env_id, "kwargs": env_kwargs},
                "rooms": rooms,
            }
        bar.close()
    print_table("loops that pay (exact search of every room's state graph, training rooms)", rows)
    for key, detail in details.items():
        example = next((r for r in detail["rooms"] if r.get("paying_loop")), None)
        if example is not None:
            lap = f"a {example['lap_moves']}-move lap pays {example['lap_reward']:.3g}"
            print(f"{key}: seed {example['seed']}, {lap}: {example['lap']}")
            print(example["lap_start"])
    result = {"benchmark": "shaping-loops", "config": vars(cfg), "rows": rows, "rooms": details}
    save_json(out / "result.json", result)
    save_plot(out / "shaping_loops.png", _draw, rows)
    print(f"wrote {out / 'result.json'} and {out / 'shaping_loops.png'}")
    return result


def _draw(ax: Any, rows: list[dict[str, Any]]) -> None:
    recipes = list(dict.fromkeys(row["recipe"] for row in rows))
    pricings = list(dict.fromkeys(row["pricing"] for row in rows))
    width = 0.8 / max(1, len(pricings))
    for i, pricing in enumerate(pricings):
        for j, recipe in enumerate(recipes):
            row = next((r for r in rows if r["recipe"] == recipe and r["pricing"] == pricing), None)
            if row is None:
                continue
            x = j + i * width
            ax.bar(x, row["share"], width, color=f"C{i}", label=pricing if j == 0 else None)
            # a zero bar is invisible: the count says it was searched and found nothing
            ax.text(x, row["share"] + 0.02, f"{row['paying loop']}/{row['rooms']}", ha="center", fontsize=8)
    ax.set_xticks([j + width * (len(pricings) - 1) / 2 for j in range(len(recipes))], recipes)
    ax.set_ylabel("share of rooms with a loop that pays")
    ax.set_ylim(0, 1)
    ax.set_title("Can a policy farm the shaping? (exact state-graph search)")
    ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> int:
    return tool_main(run, "shaping-loops", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
