"""`rollhub envs list` and `rollhub envs try ID`.

`try` plays one episode and prints the transcript: the env's messages, each action and its
reward. With `--json` the last line is exactly one JSON object
`{"env", "seed", "steps", "return", "success"}` so scripts can read the outcome.
Kept import-light: numpy and the env modules load inside the handlers.
"""

from __future__ import annotations

import argparse
import json

from rollhub.core.errors import UserError

AGENTS = ("random", "expert", "human")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("envs", help="list and try environments")
    commands = parser.add_subparsers(dest="envs_command", metavar="{list,try}", parser_class=type(parser))
    parser.set_defaults(func=_missing_command)

    listing = commands.add_parser("list", help="registered env ids, what each needs")
    listing.add_argument("--json", action="store_true", help="one JSON object per env")
    listing.set_defaults(func=list_envs)

    trying = commands.add_parser("try", help="play one episode and print the transcript")
    trying.add_argument("env_id", metavar="ID", help="env id, e.g. rollhub/Sokoban-v0")
    trying.add_argument("--seed", type=int, default=0, help="episode seed (default 0)")
    trying.add_argument("--agent", choices=AGENTS, default="random", help="who plays (default random)")
    trying.add_argument("--json", action="store_true", help="end with one JSON line: env, seed, steps, return, success")
    trying.add_argument("--max-steps", type=int, default=None, help="stop after N steps (default: the env's limit)")
    trying.add_argument(
        "--set",
        dest="env_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env constructor argument, e.g. --set num_boxes=2",
    )
    trying.set_defaults(func=try_env)


def _missing_command(args: argparse.Namespace) -> int:
    raise UserError("envs needs a command: 'rollhub envs list' or 'rollhub envs try ID'")


def list_envs(args: argparse.Namespace) -> int:
    from rollhub.envs.checker import missing_requirements
    from rollhub.envs.registry import SOURCES, all_specs, source_of, source_spec

    specs = all_specs() + [source_spec(sample) for entry in SOURCES.values() for sample in entry[3]]
    rows = []
    for spec in specs:
        needs = list(spec.requires) + (
            [f"extra:{spec.extra}"] if spec.extra and f"extra:{spec.extra}" not in spec.requires else []
        )
        missing = missing_requirements(spec) if needs else []
        rows.append(
            {
                "id": spec.id,
                "source": source_of(spec.id),
                "description": spec.description,
                "needs": needs,
                "available": not missing,
            }
        )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    width = max([len(r["id"]) for r in rows] + [2])
    print(f"{'ID':{width}}  {'SOURCE':12}  {'NEEDS':24}  DESCRIPTION")
    for row in rows:
        needs = ", ".join(row["needs"]) or "-"
        if not row["available"]:
            needs += " (missing)"
        print(f"{row['id']:{width}}  {row['source']:12}  {needs:24}  {row['description']}")
    forms = "; ".join(f"{name}:<{entry[2]}>" for name, entry in SOURCES.items())
    print(f"(any env of another standard: {forms})")
    return 0


def _parse_env_args(items: list[str]) -> dict:
    from rollhub.core.config import parse_override

    kwargs = {}
    for item in items:
        keys, value = parse_override(item)
        if len(keys) != 1:
            raise UserError(f"--set {item}: env arguments are flat (KEY=VALUE), not dotted paths")
        kwargs[keys[0]] = value
    return kwargs


def try_env(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.envs.arguments import typed_env_kwargs
    from rollhub.envs.checker import missing_requirements
    from rollhub.envs.registry import make, spec

    if args.max_steps is not None and args.max_steps < 1:
        raise UserError(f"--max-steps must be >= 1, got {args.max_steps}")
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    env_spec = spec(args.env_id)
    missing = missing_requirements(env_spec)
    if missing:
        raise UserError(f"{args.env_id} cannot run here: {'; '.join(missing)}")
    kwargs = typed_env_kwargs(env_spec, _parse_env_args(args.env_args), key_prefix="--set ")
    try:
        env = make(args.env_id, **kwargs)
    except ValueError as exc:
        raise UserError(f"bad arguments for env {args.env_id}: {exc}") from None
    return asyncio.run(_play(env, args))


async def _play(env, args: argparse.Namespace) -> int:
    import numpy as np

    rng = np.random.default_rng(args.seed)
    limit = args.max_steps or int(env.max_steps)
    steps, total, success = 0, 0.0, False
    try:
        try:
            obs, info = await env.reset(seed=args.seed)
        except ValueError as exc:  # e.g. a room that cannot hold the requested boxes
            raise UserError(f"{args.env_id} could not start an episode: {exc}") from None
        _print_messages(obs)
        for _ in range(limit):
            action = _next_action(env, args.agent, rng)
            if action is None:  # the person at the terminal stopped
                break
            print(f"[agent] {action}")
            obs, reward, terminated, truncated, info = await env.step(action)
            steps += 1
            total += reward
            _print_messages(obs)
            print(
                f"[reward {reward:+.2f}  return {total:+.2f}"
                f"{'  terminated' if terminated else ''}{'  truncated' if truncated else ''}]"
            )
            if terminated or truncated:
                success = bool(info.get("success", False))
                break
    finally:
        await env.close()
    if args.json:
        print(
            json.dumps(
                {"env": args.env_id, "seed": args.seed, "steps": steps, "return": round(total, 6), "success": success}
            )
        )
    else:
        print(f"episode: {steps} steps, return {total:+.2f}, success {success}")
    return 0


def _next_action(env, agent: str, rng) -> str | None:
    if agent == "random":
        try:
            return env.random_action(rng)
        except NotImplementedError:
            raise UserError(f"{type(env).__name__} has no random agent; use --agent expert or human") from None
    if agent == "expert":
        try:
            return env.expert_action()
        except NotImplementedError:
            raise UserError(f"{type(env).__name__} has no scripted expert; use --agent random or human") from None
    from rollhub.envs.base import wrap_action

    try:
        text = input(f"your action (plain text is wrapped in <{env.action_tag}>; Ctrl-D stops)> ")
    except EOFError:
        print()
        return None
    return text if f"<{env.action_tag}>" in text else wrap_action(text.strip(), env.action_tag)


def _print_messages(messages) -> None:
    for message in messages:
        print(f"[{message['role']}]")
        print(message["content"])
