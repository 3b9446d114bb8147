"""`python -m experiments.sokoban.start_distance`: a Sokoban run's learning signal, with its groups
sorted by how far each group's start was from the goal, and its replayed rooms told apart.

A group-relative estimator learns only from mixed groups; on Sokoban whether a group is mixed
depends mostly on the start's shortest-plan length. The start table shows where that frontier lies
for the policy being trained (rooms past it are all-fail, rooms short of it all-succeed), which
is what a difficulty band (`min_solution_steps`) or a start-state curriculum should aim at. It
needs no extra logging: the first turn of every logged trajectory keeps its state's anchor, from
which the start position is rebuilt and solved. A start is "moved" when it differs from the
seed's room as drawn (the env without the start arguments), which reads the runs made with the
start-state curriculum (`solution_start`, measured and removed: README.md).

With hard-seed replay (also measured and removed) a room's seed came back; the first group of a
seed is a fresh room and later ones are replays, so the window table adds the replayed share, the
all-fail share among fresh rooms alone (comparable with a run without replay), and how many
replays of rooms whose first group all failed had at least one success.

The window table itself is `rollhub bench run-signal`'s. `--set by_start=last` reads only the last
window for the start table, `none` skips it.

  python -m experiments.sokoban.start_distance --set run=RUN [--set windows=4] [--set by_start=last]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
from dataclasses import dataclass
from typing import Any

from experiments.sokoban.cli import main as tool_main
from rollhub.bench.report import bench_setup, print_table, save_json, save_plot
from rollhub.bench.run_signal import draw, group_outcome, read_run, window_rows

#: env arguments that moved the start; the room as drawn is the env without them
START_ARGS = ("solution_start", "solution_start_distance")
BY_START = ("all", "last", "none")
QUICK: list[str] = []


@dataclass
class StartDistanceConfig:
    run: str = ""  # a Sokoban run folder with trajectories.jsonl and config.json
    windows: int = 3  # equal slices of the run, in the order groups were trained
    bar: float | None = None  # shortfall threshold (run-signal's): null = the run's algorithm.turn_bar, else 0.3
    by_start: str = "all"  # the start table over all groups, the last window, or none

    def validate(self) -> None:
        if self.by_start not in BY_START:
            raise ValueError(f"by_start must be one of {', '.join(BY_START)}, got {self.by_start!r}")
        if self.windows < 1:
            raise ValueError(f"windows must be >= 1, got {self.windows}")
        if self.bar is not None and not math.isfinite(self.bar):
            raise ValueError(f"bar must be a finite number, got {self.bar}")


def is_sokoban(env_id: str) -> bool:
    """Whether `env_id` builds a SokobanEnv (the only env whose starts this can read).

    A class entry point answers without building an env (an ALFWorld or SWE env's constructor
    may load games or start containers); only a factory function is built to find out."""
    import rollhub.envs as envs
    from rollhub.envs.registry import spec
    from rollhub.envs.sokoban.env import SokobanEnv

    try:
        factory = spec(env_id).load_entry_point()
        if isinstance(factory, type):
            return issubclass(factory, SokobanEnv)
        return isinstance(envs.make(env_id), SokobanEnv)
    except Exception:  # an env that cannot be built here (a missing extra): not ours to read
        return False


def start_anchor(group: list[dict[str, Any]]) -> bytes | None:
    """The anchor of the group's first state, as the trajectory log keeps it ({"__bytes__": hex})."""
    turns = group[0].get("turns") if group else None
    anchor = turns[0].get("anchor") if turns else None
    if isinstance(anchor, dict) and isinstance(anchor.get("__bytes__"), str):
        try:
            return bytes.fromhex(anchor["__bytes__"])
        except ValueError:
            return None
    return None


def _as_drawn(env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The env arguments without the ones that moved the start (a start's distance does not depend on them)."""
    return {k: v for k, v in env_kwargs.items() if k not in START_ARGS}


async def _drawn_rooms(env_id: str, env_kwargs: dict[str, Any], seeds: list[int]) -> dict[int, bytes]:
    import rollhub.envs as envs

    env = envs.make(env_id, **_as_drawn(env_kwargs))
    rooms = {}
    for seed in seeds:
        await env.reset(seed=seed)
        rooms[seed] = env.board.anchor()
    return rooms


def distance_rows(groups: list[list[dict[str, Any]]], env_id: str, env_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (start kind, moves to the goal): groups, episode success, outcome shares.

    Groups whose first turn has no readable anchor are skipped. Moves are the env's
    `distance_to_go` (capped at its max_steps)."""
    import rollhub.envs as envs
    from rollhub.envs.sokoban.grid import Board

    env = envs.make(env_id, **_as_drawn(env_kwargs))
    starts = [(g, start_anchor(g)) for g in groups]
    starts = [(g, a) for g, a in starts if a is not None]
    moves = bool(env_kwargs.get("solution_start"))
    seeds = sorted({g[0]["seed"] for g, _ in starts if isinstance(g[0].get("seed"), int)})
    drawn = asyncio.run(_drawn_rooms(env_id, env_kwargs, seeds)) if moves else {}
    distance: dict[bytes, int] = {}
    cells: dict[tuple[str, int], list[list[dict[str, Any]]]] = collections.defaultdict(list)
    for group, anchor in starts:
        if anchor not in distance:
            try:
                distance[anchor] = env.distance_to_go(Board.from_anchor(anchor))
            except ValueError:  # not a Sokoban position (another env's log)
                continue
        room = drawn.get(group[0].get("seed"))
        kind = "moved" if room is not None and room != anchor else "as drawn"
        cells[(kind, distance[anchor])].append(group)
    rows = []
    for (kind, moves_to_goal), part in sorted(cells.items()):
        outcomes = collections.Counter(group_outcome(g) for g in part)
        episodes = [bool(t.get("success")) for g in part for t in g]
        rows.append(
            {
                "start": kind,
                "moves to goal": moves_to_goal,
                "groups": len(part),
                "success": sum(episodes) / len(episodes),
                "all_fail": outcomes["all_fail"] / len(part),
                "mixed": outcomes["mixed"] / len(part),
                "all_succeed": outcomes["all_succeed"] / len(part),
            }
        )
    return rows


def replay_marks(groups: list[list[dict[str, Any]]]) -> tuple[list[bool], list[bool]]:
    """Per group in training order: (is a replay, is a replay of a room whose first group all
    failed). A group is a replay when an earlier group had the same seed; groups without a seed
    are fresh (replay keyed rooms by seed)."""
    first_outcome: dict[Any, str] = {}
    replayed, of_all_fail = [], []
    for group in groups:
        seed = group[0].get("seed") if group else None
        again = seed is not None and seed in first_outcome
        replayed.append(again)
        of_all_fail.append(again and first_outcome[seed] == "all_fail")
        if seed is not None and not again:
            first_outcome[seed] = group_outcome(group)
    return replayed, of_all_fail


def add_replay_columns(rows: list[dict[str, Any]], groups: list[list[dict[str, Any]]], windows: int) -> None:
    """Add to each window's row the replayed share and, in a run with replay, the fresh rooms' all-fail
    share and how the replays of all-fail rooms went (windows split groups as `window_rows` does)."""
    replayed, of_all_fail = replay_marks(groups)
    n = len(groups)
    for w, row in enumerate(rows):
        lo, hi = n * w // windows, n * (w + 1) // windows
        part = groups[lo:hi]
        fresh = [g for g, again in zip(part, replayed[lo:hi]) if not again]
        row["replayed groups"] = 1 - len(fresh) / len(part) if part else float("nan")
        if len(fresh) < len(part):  # a run with replay: the fresh rooms alone, and the replays of all-fail rooms
            row["all fail, fresh rooms"] = (
                sum(group_outcome(g) == "all_fail" for g in fresh) / len(fresh) if fresh else float("nan")
            )
            again = [g for g, mark in zip(part, of_all_fail[lo:hi]) if mark]
            row["replays of all-fail rooms"] = len(again)
            row["... with a success"] = (
                sum(group_outcome(g) != "all_fail" for g in again) / len(again) if again else float("nan")
            )


def by_start_rows(
    config: dict[str, Any], groups: list[list[dict[str, Any]]], windows: int, by_start: str
) -> list[dict[str, Any]]:
    """The start-distance table of a Sokoban run (its saved `config.json` as `config`), [] for other
    envs or `by_start=none`."""
    if by_start == "none":
        return []
    env = config.get("env", {})
    env_id, env_kwargs = str(env.get("id", "")), dict(env.get("kwargs") or {})
    if not is_sokoban(env_id):
        return []
    part = groups[len(groups) - len(groups) // windows :] if by_start == "last" else groups
    return distance_rows(part, env_id, env_kwargs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg, out = bench_setup(StartDistanceConfig, args, QUICK)
    record = read_run(cfg.run, cfg.windows, cfg.bar)
    rows = window_rows(record.groups, record.steps, cfg.windows, record.bar)
    add_replay_columns(rows, record.groups, cfg.windows)
    print_table(f"training signal of {record.run_dir} by window (shortfall: a turn's reward < {record.bar:g})", rows)
    result: dict[str, Any] = {"benchmark": "start-distance", "config": vars(cfg), "bar": record.bar, "rows": rows}
    config_file = record.run_dir / "config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    by_start = by_start_rows(config, record.groups, cfg.windows, cfg.by_start)
    if by_start:
        print_table(f"groups by their start's moves to the goal ({cfg.by_start} groups)", by_start)
        result["by_start"] = by_start
        save_plot(out / "by_start.png", _draw_by_start, by_start)
    save_json(out / "result.json", result)
    save_plot(out / "run_signal.png", draw, rows)
    print(f"wrote {out / 'result.json'} and {out / 'run_signal.png'}" + (" and by_start.png" if by_start else ""))
    return result


def _draw_by_start(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Episode success and the mixed-group share against the start's moves to the goal."""
    for kind, colour in (("as drawn", "tab:blue"), ("moved", "tab:orange")):
        part = [row for row in rows if row["start"] == kind]
        if not part:
            continue
        moves = [row["moves to goal"] for row in part]
        ax.plot(moves, [row["success"] for row in part], color=colour, marker="o", label=f"success, {kind}")
        ax.plot(moves, [row["mixed"] for row in part], color=colour, linestyle="--", label=f"mixed groups, {kind}")
    ax.set_ylim(0, 1)
    ax.set_xlabel("start's moves to the goal (shortest plan)")
    ax.set_ylabel("share")
    ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> int:
    return tool_main(run, "start-distance", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
