"""`rollhub alfworld ...`: ALFWorld utilities (import-light; the engine loads in handlers)."""

from __future__ import annotations

import argparse
import importlib.util

from rollhub.core.errors import MissingExtraError, UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("alfworld", help="ALFWorld utilities (rollhub alfworld make-games)")
    commands = parser.add_subparsers(dest="alfworld_command", metavar="COMMAND")
    make = commands.add_parser(
        "make-games", help="generate PDDL games for the six task types, kept only if the planner solves them"
    )
    make.add_argument("--n", type=int, required=True, help="number of games to write")
    make.add_argument("--out", required=True, help="output folder (play them with game_dir=OUT)")
    make.add_argument(
        "--task-types", default="", help="comma-separated ids 1-6 or names (default: all six, round-robin)"
    )
    make.add_argument("--seed", type=int, default=0, help="generation seed (same seed, same games)")
    make.set_defaults(func=_make_games)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def _make_games(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise UserError("--n must be at least 1")
    for module in ("textworld", "alfworld", "fast_downward"):
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError("alfworld", "rollhub alfworld make-games")
    from rollhub.envs.alfworld.games import normalise_task_types
    from rollhub.envs.alfworld.generate import generate_games

    task_types = normalise_task_types([t.strip() for t in args.task_types.split(",") if t.strip()])
    report = generate_games(args.n, args.out, task_types=list(task_types), seed=args.seed)
    print(f"wrote {len(report.written)} games to {args.out} ({report.attempts} drawn; rejected: {report.rejected})")
    print(f"play them: rollhub envs try rollhub/ALFWorld-v0 --agent expert --set game_dir={args.out}")
    return 0
