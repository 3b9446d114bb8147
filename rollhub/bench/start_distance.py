"""Group outcomes of a Sokoban run by how far each group's start was from the goal.

A group-relative estimator learns only from mixed groups; on Sokoban whether a group is mixed
depends mostly on the start's shortest-plan length. This table shows where that frontier lies
for the policy being trained (rooms past it are all-fail, rooms short of it all-succeed), which
is what a difficulty band (`min_solution_steps`) or a start-state curriculum
(`solution_start_distance`) should aim at. It needs no extra logging: the first turn of every
logged trajectory keeps its state's anchor, from which the start position is rebuilt and
solved. With `solution_start` on, a start is "moved" when it differs from the seed's room as
drawn (the env without the start arguments), so the table reads right even for a run made by
code that cut plans differently.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from rollhub.bench.run_signal import group_outcome

#: env arguments that move the start; the room as drawn is the env without them
START_ARGS = ("solution_start", "solution_start_distance")


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


async def _drawn_rooms(env_id: str, env_kwargs: dict[str, Any], seeds: list[int]) -> dict[int, bytes]:
    import rollhub.envs as envs

    env = envs.make(env_id, **{k: v for k, v in env_kwargs.items() if k not in START_ARGS})
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

    env = envs.make(env_id, **env_kwargs)
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
