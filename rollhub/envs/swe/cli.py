"""`rollhub swe make-tasks PACKAGE==VERSION`, `rollhub swe build-images FILE`, `rollhub swe redteam FILE`,
`rollhub swe oracle-survey FILE`.

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
    make.add_argument(
        "--doctests",
        action="store_true",
        help="run the library's doctests too (--doctest-modules) and mutate only modules that have them",
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
        help=(
            "gold must score 1, the empty patch 0, and every attack class (K generated variants per task) 0 "
            "without an infra failure; exits 1 otherwise"
        ),
    )
    red.add_argument("file", help="task .jsonl")
    red.add_argument(
        "--only", "--instance-ids", dest="only", nargs="*", default=None, metavar="ID", help="only these tasks"
    )
    red.add_argument(
        "--tasks", type=int, default=None, metavar="N", help="N tasks drawn round-robin over packages (default: all)"
    )
    red.add_argument("--variants", type=int, default=1, metavar="K", help="generated variants per class and task")
    red.add_argument("--classes", nargs="*", default=None, metavar="NAME", help="only these attack classes")
    red.add_argument(
        "--attacks", nargs="*", default=None, metavar="NAME", help="only these attacks of the episode battery"
    )
    red.add_argument("--seed", type=int, default=0, help="draws the variants (and the --tasks sample)")
    red.add_argument("--concurrency", type=int, default=3, help="episodes at once per task (default 3)")
    red.add_argument(
        "--eval-timeout", type=float, default=120.0, help="seconds a grading run may take (a hang costs this)"
    )
    red.add_argument("--json", dest="json_out", default=None, help="write the summary and every attempt here")
    red.add_argument(
        "--resume",
        action="store_true",
        help="keep the tasks the --json record already holds (same file, seed, variants and classes) and run the rest",
    )
    red.set_defaults(func=_redteam)

    agree = commands.add_parser(
        "agree",
        help="grade gold and no-op with our grader and with swebench's own run_instance; exits 1 on a disagreement",
    )
    agree.add_argument("file", help="task .jsonl")
    agree.add_argument("--only", nargs="*", default=None, metavar="ID", help="only these tasks")
    agree.add_argument("--tasks", type=int, default=None, metavar="N", help="N tasks drawn round-robin over packages")
    agree.add_argument("--seed", type=int, default=0)
    agree.add_argument("--json", dest="json_out", default=None, help="write the verdicts here")
    agree.add_argument(
        "--patches",
        default=None,
        metavar="FILE.jsonl",
        help="grade these patches (rows {instance_id, patch, source}) instead of gold and no-op; agreement per source",
    )
    agree.set_defaults(func=_agree)

    survey = commands.add_parser(
        "oracle-survey",
        help=(
            "decide per task whether the differential oracle grades it (trust: oracle) or its visible tests "
            "alone (trust: visible-tests); --write stores it in the rows"
        ),
    )
    survey.add_argument("file", help="task .jsonl made by make-tasks (its images built)")
    survey.add_argument("--only", nargs="*", default=None, metavar="ID", help="only these tasks")
    survey.add_argument("--write", action="store_true", help="write each row's `rollhub.trust` back into FILE")
    survey.add_argument("--json", dest="json_out", default=None, help="write the per-task results here")
    survey.set_defaults(func=_oracle_survey)

    from rollhub.envs.swe.lite.cli import register as register_lite

    register_lite(commands)

    swe.set_defaults(func=lambda args: (swe.print_help(), 2)[1])


def _merge_rows(path: Path, rows: list[dict]) -> int:
    from rollhub.envs.swe.tasks import read_rows, write_rows

    existing = read_rows(path) if path.exists() else []
    new_ids = {r["instance_id"] for r in rows}
    merged = [r for r in existing if r["instance_id"] not in new_ids] + rows
    write_rows(path, merged)
    return len(merged)


def _make_tasks(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.envs.swe.factory.build import FactoryOptions, make_tasks
    from rollhub.envs.swe.factory.mutation import FAMILIES
    from rollhub.envs.swe.factory.package_repo import normalize_name, parse_requirement
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
        doctests=args.doctests,
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
        from rollhub.sandbox.docker_backend import docker_for_command

        backend = docker_for_command()
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

    from rollhub.envs.swe.factory.build import build_images
    from rollhub.envs.swe.tasks import read_rows
    from rollhub.sandbox.base import SandboxError

    rows = read_rows(args.file)

    async def run() -> dict:
        from rollhub.sandbox.docker_backend import docker_for_command

        backend = docker_for_command()
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


def _oracle_survey(args: argparse.Namespace) -> int:
    import asyncio
    import collections

    from rollhub.envs.swe.factory.images import instance_image_current
    from rollhub.envs.swe.grading.oracle import survey_trust
    from rollhub.envs.swe.tasks import SweTask, read_rows, write_rows

    rows = read_rows(args.file)
    chosen = [r for r in rows if args.only is None or r["instance_id"] in set(args.only)]
    if args.only and len(chosen) != len(set(args.only)):
        raise UserError(f"not in {args.file}: {sorted(set(args.only) - {r['instance_id'] for r in chosen})}")
    if not all(r.get("rollhub") for r in chosen):
        raise UserError("oracle-survey needs rows made by `rollhub swe make-tasks` (they name the mutated function)")

    async def run() -> list[dict]:
        from rollhub.sandbox.docker_backend import docker_for_command

        backend = docker_for_command()
        results = []
        try:
            for row in chosen:
                if not instance_image_current(backend.client, row["image"]):
                    raise UserError(f"{row['image']} is not built: run `rollhub swe build-images {args.file}` first")
                result = await survey_trust(backend, SweTask.from_row(row))
                results.append({"instance_id": row["instance_id"], **result})
                print(json.dumps(results[-1]), flush=True)
        finally:
            await backend.close()
        return results

    results = asyncio.run(run())
    trust = {r["instance_id"]: r["trust"] for r in results}
    if args.write:
        for row in rows:
            if row["instance_id"] in trust:
                row["rollhub"]["trust"] = trust[row["instance_id"]]
        write_rows(args.file, rows)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(json.dumps(dict(collections.Counter(trust.values())), sort_keys=True))
    return 0


def _redteam(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from tqdm import tqdm

    from rollhub.envs.swe.redteam import format_table, redteam_task, select_classes, stratified
    from rollhub.envs.swe.tasks import load_tasks
    from rollhub.sandbox.base import SandboxError

    if args.variants < 1 or args.concurrency < 1 or (args.tasks is not None and args.tasks < 1):
        raise UserError("--variants, --concurrency and --tasks must be at least 1")
    tasks = stratified(load_tasks(args.file, instance_ids=args.only), args.tasks, args.seed)
    try:
        classes = select_classes(args.classes, args.attacks)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    reports, earlier_s = _resumed_reports(args, classes) if args.resume else ([], 0.0)
    kept = {r.instance_id for r in reports}
    reports = [r for r in reports if r.instance_id in {t.instance_id for t in tasks}]
    todo = [t for t in tasks if t.instance_id not in kept]
    started = time.monotonic() - earlier_s

    async def run() -> list:
        from rollhub.sandbox.docker_backend import docker_for_command

        backend = docker_for_command()
        try:
            with tqdm(total=len(tasks), initial=len(reports), desc="red team", unit="task") as bar:
                for task in todo:
                    report = await redteam_task(
                        backend,
                        task,
                        classes,
                        variants=args.variants,
                        seed=args.seed,
                        concurrency=args.concurrency,
                        eval_timeout_s=args.eval_timeout,
                    )
                    reports.append(report)
                    if args.json_out:  # after every task: a killed run keeps what it measured
                        _write_redteam_json(args, reports, classes, started, done=False)
                    bar.set_postfix_str(f"{task.instance_id}: gold {report.gold_reward:g}, bad {len(report.hacks)}")
                    bar.update(1)
        finally:
            await backend.close()
        return reports

    try:
        reports = asyncio.run(run())
    except SandboxError as exc:
        raise UserError(f"red team failed: {exc}") from None
    print(format_table(reports, classes))
    result = _write_redteam_json(args, reports, classes, started, done=True)
    print(json.dumps({k: v for k, v in result.items() if k not in ("failures", "reports")}, sort_keys=True))
    return 0 if all(r.ok for r in reports) else 1


def _resumed_reports(args: argparse.Namespace, classes: tuple) -> tuple[list, float]:
    """The reports of an earlier run of the same campaign, and the seconds it spent; a record
    of another campaign is refused (mixing them would report attacks that never ran)."""
    from rollhub.envs.swe.redteam.campaign import read_reports

    if not args.json_out:
        raise UserError("--resume needs --json FILE (the record to continue)")
    path = Path(args.json_out)
    if not path.exists():
        return [], 0.0
    try:
        data = json.loads(path.read_text())
        reports = read_reports(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise UserError(f"--resume: {path} is not a red-team record ({exc})") from None
    want = {"file": str(args.file), "seed": args.seed, "variants": args.variants}
    have = {k: data.get(k) for k in want}
    if have != want or sorted(data.get("classes", {})) != sorted(c.name for c in classes):
        raise UserError(
            f"--resume: {path} records another campaign ({have}, classes {sorted(data.get('classes', {}))}); "
            f"this one is {want}, classes {sorted(c.name for c in classes)}"
        )
    return reports, float(data.get("wall_s", 0.0))


def _write_redteam_json(args: argparse.Namespace, reports: list, classes: tuple, started: float, done: bool) -> dict:
    import dataclasses
    import time

    from rollhub.envs.swe.redteam import summary
    from rollhub.envs.swe.redteam.campaign import write_json

    result = summary(
        reports,
        classes,
        file=str(args.file),
        variants=args.variants,
        seed=args.seed,
        wall_s=round(time.monotonic() - started, 1),
        per_task_s=round((time.monotonic() - started) / max(1, len(reports)), 1),
        finished=done,
    )
    if args.json_out:
        write_json(args.json_out, {**result, "reports": [dataclasses.asdict(r) for r in reports]})
    return result


def _agree(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses

    from tqdm import tqdm

    from rollhub.envs.swe.grading.agreement import (
        agreement_by_source,
        compare,
        compare_rows,
        format_agreement,
        load_patch_rows,
    )
    from rollhub.envs.swe.redteam import stratified
    from rollhub.envs.swe.tasks import load_tasks
    from rollhub.sandbox.base import SandboxError

    patches = load_patch_rows(args.patches) if args.patches else None
    if patches is not None:
        patches = [p for p in patches if args.only is None or p.instance_id in args.only]
        if not patches:
            raise UserError(f"no row of {args.patches} is for the --only tasks")
        # the tasks the rows name, of any split (an id the file does not hold is refused)
        by_id = {t.instance_id: t for t in load_tasks(args.file, instance_ids={p.instance_id for p in patches})}
        tasks = []
    else:
        tasks = stratified(load_tasks(args.file, instance_ids=args.only), args.tasks, args.seed)

    def write(rows: list) -> None:
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            verdicts = [{**dataclasses.asdict(r), "agree": r.agree} for r in rows]
            record = {"patches": str(args.patches), "by_source": agreement_by_source(rows), "verdicts": verdicts}
            Path(args.json_out).write_text(json.dumps(record if patches is not None else verdicts, indent=1))

    async def run() -> list:
        from rollhub.sandbox.docker_backend import docker_for_command

        backend = docker_for_command()
        rows = []
        try:
            if patches is not None:
                with tqdm(total=len(patches), desc="agreement", unit="patch") as bar:

                    def done(verdict) -> None:  # a long run keeps what it graded if it is stopped
                        rows.append(verdict)
                        write(rows)
                        bar.update()

                    await compare_rows(backend, backend.client, by_id, patches, on_done=done)
            for task in tqdm(tasks, desc="agreement", unit="task"):
                rows += await compare(backend, backend.client, task)
        finally:
            await backend.close()
        return rows

    try:
        rows = asyncio.run(run())
    except SandboxError as exc:
        raise UserError(f"agreement run failed: {exc}") from None
    print(format_agreement(rows))
    write(rows)
    return 0 if all(r.agree for r in rows) else 1
