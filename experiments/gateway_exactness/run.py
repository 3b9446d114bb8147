"""Token exactness of the gateway at scale: N sessions per framework (OpenAI Agents SDK, LangChain)
per chat-template family, each compared with what the engine sampled; prints mismatches and the
per-call overhead: in the gateway (`Gateway.chat` minus the engine's time) and as the client sees
it (latency minus engine time; with many sessions at once this includes the frameworks' own
work on the shared event loop, so measure it with --concurrency 1).

    OMP_NUM_THREADS=1 PYTHONPATH=. python experiments/gateway_exactness/run.py --sessions 1000

The drivers are the tests' (tests/rollout/gateway_frameworks.py): tiny random models built
locally, so thousands of sessions run on a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "rollout")]

from gateway_frameworks import FRAMEWORKS, _mean_ms, run_framework, template_tokenizer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000, help="sessions per framework, split over the families")
    parser.add_argument("--families", default="qwen,smollm2,llama3")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    families = args.families.split(",")
    rows = []
    for framework in args.frameworks.split(","):
        for index, family in enumerate(families):
            share = args.sessions // len(families) + (1 if index < args.sessions % len(families) else 0)
            began = time.perf_counter()
            report = asyncio.run(
                run_framework(
                    framework, family, share, concurrency=args.concurrency, tokenizer=template_tokenizer(family)
                )
            )
            row = {
                "framework": framework,
                "family": family,
                "sessions": report.sessions,
                "calls": report.calls,
                "turns_exported": report.turns,
                "leaves": report.leaves,
                "mismatches": report.mismatches,
                "prefix_breaks": report.prefix_breaks,
                "unexported_samples": report.unexported_samples,
                "calls_by_kind": dict(report.kinds),
                "client_overhead_ms_per_call": round(report.overhead_ms, 2),
                "gateway_overhead_ms_per_call": round(report.gateway_overhead_ms, 2),
                "engine_ms_per_call": round(_mean_ms(report.engine_s), 2),
                "wall_s": round(time.perf_counter() - began, 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    for framework in args.frameworks.split(","):
        mine = [r for r in rows if r["framework"] == framework]
        print(
            f"{framework}: {sum(r['sessions'] for r in mine)} sessions, {sum(r['calls'] for r in mine)} calls, "
            f"{sum(r['mismatches'] + r['prefix_breaks'] + r['unexported_samples'] for r in mine)} mismatches"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 1 if any(r["mismatches"] or r["prefix_breaks"] or r["unexported_samples"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
