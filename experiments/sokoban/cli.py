"""The command line every campaign tool shares: `python -m experiments.sokoban.NAME [--out DIR] [--quick]
[--set KEY=VALUE ...]`, the options `rollhub bench` gives a benchmark, so a tool reads its options the same
way (`run(args)` with `args.out`, `args.quick`, `args.overrides`) and the log's commands keep their meaning."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from rollhub.core.errors import UserError


def default_out(name: str) -> str:
    """Where a tool writes when `--out` is not given."""
    return f"runs/experiments/sokoban/{name}"


def main(run: Callable[[argparse.Namespace], Any], name: str, doc: str | None, argv: list[str] | None = None) -> int:
    """Parse the shared options, run the tool, and turn a `UserError` into one line and exit code 2."""
    parser = argparse.ArgumentParser(
        prog=f"python -m experiments.sokoban.{name.replace('-', '_')}",
        description=doc.strip().splitlines()[0].split("`: ", 1)[-1] if doc else None,
    )
    parser.add_argument("--out", default=None, help=f"output folder (default {default_out(name)})")
    parser.add_argument("--quick", action="store_true", help="smallest sizes (smoke test)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="tool option")
    args = parser.parse_args(argv)
    args.name = name
    if args.out is None:
        args.out = default_out(name)
    try:
        run(args)
    except UserError as exc:
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 2
    return 0
