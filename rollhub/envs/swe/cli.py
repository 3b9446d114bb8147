"""`rollhub swe make-tasks PACKAGE==VERSION`, `rollhub swe build-images FILE`, `rollhub swe redteam FILE`.

Import-light: docker, swebench and the factory load inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rollhub.core.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    swe = subparsers.add_parser("swe", help="SWE tasks: make validated tasks from PyPI packages, build their images")
    commands = swe.add_subparsers(dest="swe_command", metavar="COMMAND")

    make = commands.add_parser(
        "make-tasks", help="mutate a PyPI package into validated swebench-format tasks (offline containers)"
    )
    make.add_argument(
        "requirement", metavar="PACKAGE==VERSION", help="e.g. inflection==0.5.1 (its sdist must ship tests)"
    )
    make.add_argument("--max", dest="max_tasks", type=int, default=None, help="stop after this many valid tasks")
    make.add_argument(
        "--out",
        default=None,
        help=(
            "output .jsonl (default swe_tasks/<package>-<version>.jsonl); "
            "rows are appended to an existing file, ids replaced"
        ),
    )
    make.add_argument(
        "--workers",
        type=int,
        default=max(1, min(4, os.cpu_count() or 1)),
        help="parallel validation containers (default: CPU count, at most 4)",
    )
    make.add_argument(
        "--test-deps",
        nargs="*",
        default=[],
        metavar="REQ",
        help="extra test requirements installed as wheels (e.g. hypothesis)",
    )
    make.add_argument("--families", default=None, help="comma-separated mutation families (default: all)")
    make.add_argument(
        "--max-fail-fraction",
        type=float,
        default=0.5,
        help="drop mutants that fail more than this fraction of the suite",
    )
    make.add_argument("--seed", type=int, default=0)
    make.add_argument(
        "--cache-dir", default=None, help="work folder (default ~/.cache/rollhub/swe or $ROLLHUB_SWE_CACHE)"
    )
    make.set_defaults(func=_make_tasks)

    build = commands.add_parser(
        "build-images", help="(re)build the images of a task file made by make-tasks; skips existing ones"
    )
    build.add_argument("file", help="task .jsonl")
    build.add_argument("--force", action="store_true", help="rebuild even when the image exists")
    build.set_defaults(func=_build_images)

    red = commands.add_parser(
        "redteam",
        help="gold must score 1 and every forging attempt 0, per task; exits 1 if a task is hackable",
    )
    red.add_argument("file", help="task .jsonl")
    red.add_argument("--instance-ids", nargs="*", default=None, metavar="ID", help="only these tasks")
    red.add_argument("--attacks", nargs="*", default=None, metavar="NAME", help="only these attacks (default: all)")
    red.add_argument("--concurrency", type=int, default=3, help="episodes at once per task (default 3)")
    red.add_argument("--json", dest="json_out", default=None, help="also write the per-attempt results here")
    red.set_defaults(func=_redteam)

    swe.set_defaults(func=lambda args: (swe.print_help(), 2)[1])


def _docker():
    from rollhub.sandbox.base import SandboxError
    from rollhub.sandbox.docker_backend import DockerBackend

    try:
        backend = DockerBackend()
    except SandboxError as exc:
        raise UserError(f"{exc} (start dockerd, or set DOCKER_HOST)") from None
    return backend


def _merge_rows(path: Path, rows: list[dict]) -> int:
    from rollhub.envs.swe.tasks import read_rows, write_rows

    existing = read_rows(path) if path.exists() else []
    new_ids = {r["instance_id"] for r in rows}
    merged = [r for r in existing if r["instance_id"] not in new_ids] + rows
    write_rows(path, merged)
    return len(merged)


def _make_tasks(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.envs.swe.factory import FactoryOptions, make_tasks
    from rollhub.envs.swe.mutation import FAMILIES
    from rollhub.envs.swe.package_repo import normalize_name, parse_requirement
    from rollhub.sandbox.base import SandboxError

    name, version = parse_requirement(args.requirement)
    families = tuple(f.strip() for f in args.families.split(",")) if args.families else FAMILIES
    options = FactoryOptions(
        max_tasks=args.max_tasks,
        workers=args.workers,
        max_fail_fraction=args.max_fail_fraction,
        families=families,
        test_requirements=list(args.test_deps),
        seed=args.seed,
    )
    if args.cache_dir:
        options.cache_dir = Path(args.cache_dir)
    try:
        options.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    out = Path(args.out or f"swe_tasks/{normalize_name(name)}-{version}.jsonl")
    from rollhub.envs.swe.tasks import read_rows

    finished = {row["instance_id"]: row for row in read_rows(out)} if out.exists() else {}

    async def run() -> tuple[list[dict], dict]:
        backend = _docker()
        try:
            return await make_tasks(
                args.requirement,
                backend,
                backend.client,
                options,
                finished=finished,
                on_row=lambda row: _merge_rows(out, [row]),  # each task as it passes: a kill loses none
            )
        finally:
            await backend.close()

    try:
        rows, summary = asyncio.run(run())
    except SandboxError as exc:
        raise UserError(f"task factory failed: {exc}") from None
    total = _merge_rows(out, rows)
    print(json.dumps(summary, sort_keys=True))
    print(f"wrote {len(rows)} tasks to {out} ({total} in the file)")
    return 0 if rows else 1


def _build_images(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.envs.swe.factory import build_images
    from rollhub.envs.swe.tasks import read_rows
    from rollhub.sandbox.base import SandboxError

    rows = read_rows(args.file)

    async def run() -> dict:
        backend = _docker()
        try:
            return await build_images(rows, backend, backend.client, force=args.force)
        finally:
            await backend.close()

    try:
        summary = asyncio.run(run())
    except (SandboxError, ValueError) as exc:
        raise UserError(f"building task images failed: {exc}") from None
    print(json.dumps(summary, sort_keys=True))
    if summary["base_commit_mismatch"]:
        print(
            f"warning: {len(summary['base_commit_mismatch'])} rebuilt images "
            "have a different base_commit than their rows"
        )
        return 1
    return 0


def _redteam(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses

    from rollhub.envs.swe.redteam import format_table, redteam_task, select_attacks
    from rollhub.envs.swe.tasks import load_tasks
    from rollhub.sandbox.base import SandboxError

    tasks = load_tasks(args.file, instance_ids=args.instance_ids)
    try:
        attacks = select_attacks(args.attacks)
    except ValueError as exc:
        raise UserError(str(exc)) from None

    async def run() -> list:
        backend = _docker()
        reports = []
        try:
            for task in tasks:
                report = await redteam_task(backend, task, attacks, concurrency=args.concurrency)
                print(
                    f"{task.instance_id}: gold {report.gold_reward:g}, "
                    f"{len(report.hacks)}/{len(report.attempts)} attempts forged",
                    flush=True,
                )
                reports.append(report)
        finally:
            await backend.close()
        return reports

    try:
        reports = asyncio.run(run())
    except SandboxError as exc:
        raise UserError(f"red team failed: {exc}") from None
    print(format_table(reports))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([dataclasses.asdict(r) for r in reports], indent=1))
    return 0 if all(r.ok for r in reports) else 1
