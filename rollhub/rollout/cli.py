"""CLI of the rollout area: `rollhub rollout`.

Import-light: torch, transformers and aiohttp are imported inside the handlers.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    rollout = subparsers.add_parser("rollout", help="collect groups of trajectories from an env with an engine")
    rollout.add_argument("--env", required=True, help="env id, e.g. rollhub/Sokoban-v0")
    rollout.add_argument(
        "--engine",
        default="inprocess",
        choices=["inprocess", "server", "hf", "sglang"],
        help="inprocess = transformers in this process; server = launched or attached servers "
        "(--launch/--replicas or --url); hf and sglang are the older names",
    )
    rollout.add_argument(
        "--url",
        dest="urls",
        action="append",
        default=[],
        help="attach to a running server (repeat for several replicas; e.g. one started by 'rollhub serve')",
    )
    rollout.add_argument(
        "--launch", default=None, help="server command template, or 'rollhub' / 'sglang' (default rollhub)"
    )
    rollout.add_argument("--replicas", type=int, default=1, help="servers to launch with --engine server")
    rollout.add_argument("--device", default="auto", help="engine device: auto, cpu, cuda or cuda:N")
    rollout.add_argument("--model", default=None, help="HF checkpoint dir (default: a fresh tiny 5m model in --out)")
    rollout.add_argument("--groups", type=int, default=8)
    rollout.add_argument("--group-size", type=int, default=4)
    rollout.add_argument("--seed", type=int, default=0, help="first task seed")
    rollout.add_argument("--max-new-tokens", type=int, default=64)
    rollout.add_argument("--temperature", type=float, default=1.0)
    rollout.add_argument("--concurrency", type=int, default=64, help="max trajectories in flight")
    rollout.add_argument("--lockstep", action="store_true", help="sync baseline: all envs step together")
    rollout.add_argument("--threads", type=int, default=1)
    rollout.add_argument("--out", default="runs/rollout", help="folder for trajectories.jsonl")
    rollout.add_argument("--json", action="store_true", help="print only the JSON summary line")
    rollout.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env/rollout/agent knobs by their train-config names, e.g. agent.history_window=2",
    )
    rollout.set_defaults(func=_cmd_rollout)
    envs = subparsers.choices.get("envs")
    if envs is not None:  # `rollhub envs try --agent model`: the env layer cannot load models, this one can
        envs.set_defaults(open_chat_model=_open_chat_model)


def _open_chat_model(model: str, **options: object) -> object:
    from rollhub.rollout.chat_models import open_chat_model

    return open_chat_model(model, **options)


def _cmd_rollout(args: argparse.Namespace) -> int:
    from rollhub.rollout.rollout_command import run_rollout_command

    return run_rollout_command(args)
