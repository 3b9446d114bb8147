"""`rollhub gateway`: serve the OpenAI-compatible session gateway over a model or a running server.

Import-light: torch, transformers and aiohttp are imported inside the handler.
"""

from __future__ import annotations

import argparse
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    gateway = subparsers.add_parser(
        "gateway", help="OpenAI-compatible sessions for agent programs, recorded token-exactly as trajectories"
    )
    source = gateway.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="HF checkpoint dir, generated in this process (the CPU engine)")
    source.add_argument("--engine-url", help="a running 'rollhub serve' or SGLang server (needs --tokenizer)")
    gateway.add_argument("--tokenizer", default=None, help="tokenizer dir (default: --model)")
    gateway.add_argument("--engine-api-key", default=None, help="the server's key (default $ROLLHUB_API_KEY)")
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on; beyond loopback it needs --api-key")
    gateway.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="a key callers must send as 'Authorization: Bearer KEY' (repeatable; default $ROLLHUB_GATEWAY_API_KEY, "
        "else none: loopback only)",
    )
    gateway.add_argument("--port", type=int, default=8000)
    gateway.add_argument("--model-name", default="rollhub-policy", help="the id /v1/models lists")
    gateway.add_argument("--max-in-flight", type=int, default=None, help="calls at once before 429 (default no cap)")
    gateway.add_argument("--threads", type=int, default=1, help="torch threads of the in-process engine")
    gateway.add_argument(
        "--out", default="runs/gateway/trajectories.jsonl", help="JSONL file the ended sessions' trajectories go to"
    )
    gateway.set_defaults(func=_cmd_gateway)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from rollhub.core.errors import UserError
    from rollhub.rollout.gateway.config import GatewayConfig

    from_env = os.environ.get("ROLLHUB_GATEWAY_API_KEY")
    keys = args.api_key or ([from_env] if from_env else [])
    config = GatewayConfig(model_name=args.model_name, max_in_flight=args.max_in_flight, api_keys=tuple(keys))
    try:
        config.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not keys:
        raise UserError(
            f"--host {args.host} is reachable from other machines: give it a key (--api-key KEY or "
            "$ROLLHUB_GATEWAY_API_KEY), or serve on loopback (--host 127.0.0.1)"
        )
    from aiohttp import web
    from transformers import AutoTokenizer

    from rollhub.rollout.gateway.app import build_gateway_app
    from rollhub.rollout.gateway.service import Gateway
    from rollhub.rollout.gateway.sessions import group_trajectories
    from rollhub.rollout.trajectory_log import TrajectoryWriter

    if args.engine_url and not args.tokenizer:
        raise UserError("--engine-url needs --tokenizer DIR: the gateway renders chat templates itself")

    async def build() -> web.Application:
        if args.model:
            from rollhub.inference.engines.hf import HFEngine

            engine = HFEngine(args.model, threads=args.threads)
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else engine.tokenizer
        else:
            from rollhub.inference.engines.sglang import SGLangEngine

            engine = SGLangEngine(args.engine_url, api_key=args.engine_api_key)
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        writer = TrajectoryWriter(args.out)

        def write(trajectories: list) -> None:  # one session's leaves share its group: written and flushed whole
            for group in group_trajectories(trajectories):
                writer.write_group(group)

        gateway = Gateway(engine, tokenizer, config, on_end=write)
        app = build_gateway_app(gateway)

        async def close(_: web.Application) -> None:
            writer.close()
            await engine.close()

        app.on_cleanup.append(close)
        return app

    print(f"gateway on http://{args.host}:{args.port}: POST /rl/sessions, then base_url=/sessions/ID/v1")
    web.run_app(build(), host=args.host, port=args.port, print=None)
    return 0
