"""`rollhub swe lite build` and `rollhub swe lite check FILE` (import-light: docker loads in the handlers)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rollhub.core.errors import UserError


def register(commands: argparse._SubParsersAction) -> None:
    lite = commands.add_parser("lite", help="SWE-lite: small generated projects with one bug each (few images)")
    sub = lite.add_subparsers(dest="lite_command", metavar="COMMAND")

    build = sub.add_parser("build", help="generate, build and verify the SWE-lite tasks from a seed (offline)")
    build.add_argument("--seed", type=int, default=0, help="decides the split, every function and every bug")
    build.add_argument("--train", type=int, default=4000, help="training tasks (default 4000)")
    build.add_argument("--eval", type=int, default=500, help="held-out tasks: unseen families and bug templates")
    build.add_argument("--pack-size", type=int, default=500, help="tasks per image (default 500)")
    build.add_argument(
        "--out", default=None, help="task .jsonl (default ~/.cache/rollhub/swe-lite/seed<N>/tasks.jsonl)"
    )
    build.set_defaults(func=_build)

    check = sub.add_parser(
        "check", help="gold must resolve and the empty patch must not, through env episodes; exits 1 otherwise"
    )
    check.add_argument("file", help="task .jsonl made by `rollhub swe lite build`")
    check.add_argument("--tasks", type=int, default=40, help="tasks drawn round-robin over packs (default 40)")
    check.add_argument("--split", default="all", choices=["all", "train", "eval"])
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--concurrency", type=int, default=2)
    check.add_argument("--json", dest="json_out", default=None, help="write the summary here")
    check.set_defaults(func=_check)

    lite.set_defaults(func=lambda args: (lite.print_help(), 2)[1])


def _build(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.envs.swe.lite.build import LITE_CACHE, BuildOptions, build
    from rollhub.sandbox.base import SandboxError
    from rollhub.sandbox.docker_backend import docker_for_command

    out = Path(args.out) if args.out else LITE_CACHE / f"seed{args.seed}" / "tasks.jsonl"
    options = BuildOptions(seed=args.seed, train=args.train, eval=args.eval, pack_size=args.pack_size, out=out)
    try:
        options.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None

    async def run() -> dict:
        backend = docker_for_command()
        try:
            return await build(backend, backend.client, options)
        finally:
            await backend.close()

    try:
        summary = asyncio.run(run())
    except SandboxError as exc:
        raise UserError(f"SWE-lite build failed: {exc}") from None
    print(json.dumps(summary, sort_keys=True))
    return 0


def _check(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.envs.swe.lite.check import check, sample
    from rollhub.envs.swe.tasks import load_tasks
    from rollhub.sandbox.base import SandboxError
    from rollhub.sandbox.docker_backend import docker_for_command

    tasks = load_tasks(args.file, split=args.split)
    chosen = sample(tasks, args.tasks, args.seed)

    async def run() -> dict:
        backend = docker_for_command()
        try:
            return await check(backend, chosen, concurrency=args.concurrency)
        finally:
            await backend.close()

    try:
        summary = asyncio.run(run())
    except SandboxError as exc:
        raise UserError(f"SWE-lite check failed: {exc}") from None
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, sort_keys=True))
    tasks = summary["tasks"]
    print(f"gold resolved {summary['gold_resolved']}/{tasks}, no-op resolved {summary['noop_resolved']}/{tasks}")
    ok = summary["gold_resolved"] == summary["tasks"] and summary["noop_resolved"] == 0
    return 0 if ok else 1
