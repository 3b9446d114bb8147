"""`rollhub sandbox ls | gc | build-base` (import-light: docker is imported in handlers)."""

from __future__ import annotations

import argparse

from rollhub.core.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sandbox", help="manage Docker sandboxes (ls, gc, build-base)")
    actions = parser.add_subparsers(dest="sandbox_command", metavar="ACTION")

    ls = actions.add_parser("ls", help="list rollhub containers and whether their owner is alive")
    ls.set_defaults(func=_ls)

    gc = actions.add_parser(
        "gc",
        help="remove containers whose owner process is provably gone (on this host, in this PID namespace)",
    )
    gc.add_argument(
        "--all",
        action="store_true",
        help="remove every rollhub container, owners alive or not, including other hosts' and namespaces'",
    )
    gc.add_argument("--run", default=None, metavar="RUN_ID", help="only containers of this run id")
    gc.set_defaults(func=_gc)

    build = actions.add_parser("build-base", help="build rollhub/base:bookworm with debootstrap (no registry)")
    build.add_argument("--tag", default=None, help="image tag (default rollhub/base:bookworm)")
    build.add_argument("--mirror", default=None, help="Debian mirror URL (default http://deb.debian.org/debian)")
    build.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    build.set_defaults(func=_build_base)

    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def _client():
    from rollhub.sandbox.base import SandboxError
    from rollhub.sandbox.docker_backend import connect

    try:
        return connect()
    except SandboxError as exc:
        raise UserError(str(exc)) from exc


def _ls(args: argparse.Namespace) -> int:
    from rollhub.sandbox.reaper import list_rollhub_containers

    records = list_rollhub_containers(_client().api)
    print(f"{'container':14s} {'state':10s} {'owner':8s} {'run':24s} image")
    for record in records:
        owner = _OWNER_WORDS[record.owner.state]
        print(f"{record.id[:12]:14s} {record.state:10s} {owner:8s} {record.run_id[:24]:24s} {record.image}")
    foreign = sum(r.owner.state == "foreign" for r in records)
    print(
        f"{len(records)} rollhub container(s), {sum(not r.owner_alive for r in records)} orphaned, "
        f"{foreign} with an owner on another host or PID namespace (not checkable here)"
    )
    return 0


_OWNER_WORDS = {"alive": "alive", "dead": "GONE", "foreign": "foreign"}


def _gc(args: argparse.Namespace) -> int:
    from rollhub.sandbox.reaper import sweep

    report = sweep(_client().api, remove_all=args.all, run_id=args.run)
    scope = f" of run {args.run}" if args.run else ""
    what = " (all rollhub containers)" if args.all else " whose owner is provably gone"
    print(f"removed {len(report.removed) - report.failed} container(s){scope}{what}")
    if report.failed:
        print(f"could not remove {report.failed} container(s); see the warnings above and run gc again")
    for reason, records in sorted(report.skipped.items()):
        print(f"skipped {len(records)} container(s): {reason}")
    if any(reason != "owner alive" for reason in report.skipped):
        print("containers of other hosts or PID namespaces are only removed with --all (check they are unused)")
    return 1 if report.failed else 0


def _build_base(args: argparse.Namespace) -> int:
    from rollhub.sandbox import images
    from rollhub.sandbox.base import SandboxError

    client = _client()
    try:
        tag = images.build_base_image(
            client,
            args.tag or images.BASE_IMAGE,
            mirror=args.mirror or images.DEBIAN_MIRROR,
            force=args.force,
        )
    except SandboxError as exc:
        raise UserError(str(exc)) from exc
    size_mb = client.images.get(tag).attrs["Size"] / 1e6
    print(f"{tag} ready ({size_mb:.0f} MB)")
    return 0
