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
    make.add_argument("--n", type=int, default=500, help="number of games the folder should hold (default 500)")
    make.add_argument(
        "--out",
        default=None,
        help="output folder (default: the train split, DATA/json_2.1.1/train, played with split=train; "
        "any other folder is played with game_dir=OUT)",
    )
    make.add_argument(
        "--task-types", default="", help="comma-separated ids 1-6 or names (default: all six, round-robin)"
    )
    make.add_argument("--seed", type=int, default=0, help="generation seed (same seed, same games; a rerun resumes)")
    make.add_argument("--quiet", action="store_true", help="no progress bar")
    make.set_defaults(func=_make_games)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def _make_games(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise UserError("--n must be at least 1")
    for module in ("textworld", "alfworld", "fast_downward"):
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError("alfworld", "rollhub alfworld make-games")
    from rollhub.envs.alfworld.games import DATA_VERSION_DIR, data_root, normalise_task_types
    from rollhub.envs.alfworld.generate import generate_games

    task_types = normalise_task_types([t.strip() for t in args.task_types.split(",") if t.strip()])
    out = args.out or str(data_root() / DATA_VERSION_DIR / "train")
    report = generate_games(args.n, out, task_types=list(task_types), seed=args.seed, progress=not args.quiet)
    made = len(report.written) - report.resumed
    rate = 60 * made / report.wall_s if made and report.wall_s > 0 else 0.0
    print(
        f"{len(report.written)} games in {out} ({report.resumed} from an earlier run, {made} made in "
        f"{report.wall_s:.0f}s = {rate:.1f} games/min; {report.attempts} drawn in all; rejected: {report.rejected})"
    )
    play = "--set split=train" if args.out is None else f"--set game_dir={out}"
    print(f"play them: rollhub envs try rollhub/ALFWorld-v0 --agent expert {play}")
    return 0
