"""The `rollhub` command line.

Each area owns its own subcommands in a small module with a `register(subparsers)` function
(listed in COMMAND_MODULES). Those modules must stay import-light: heavy libraries are
imported inside the command handlers, so `rollhub --help` and `rollhub envs list` start fast.
A handler is stored as `func` on its parser and receives the parsed `argparse.Namespace`; it
returns an exit code (or None for 0). `UserError` becomes a one-line message and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from rollhub.core.errors import UserError

COMMAND_MODULES = (
    "rollhub.envs.cli",  # rollhub envs list|try
    "rollhub.sandbox.cli",  # rollhub sandbox gc|build-base|...
    "rollhub.inference.cli",  # rollhub model init-tiny|smollm2, rollhub serve
    "rollhub.rollout.cli",  # rollhub rollout
    "rollhub.rollout.gateway.cli",  # rollhub gateway
    "rollhub.trainer.cli",  # rollhub train, rollhub sft, rollhub view
    "rollhub.trainer.config_cli",  # rollhub config show
    "rollhub.bench.cli",  # rollhub bench NAME
    "rollhub.envs.swe.cli",  # rollhub swe make-tasks|build-images
    "rollhub.envs.alfworld.cli",  # rollhub alfworld make-games
)


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"rollhub: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="rollhub", description="Environment hub and async RL trainer for LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = args.func(args)
    except UserError as exc:
        sys.stderr.write(f"rollhub: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("rollhub: interrupted\n")
        return 130
    except BrokenPipeError:  # output piped into `head` and friends: not an error
        sys.stderr.close()
        return 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
