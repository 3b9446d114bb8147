"""Gold through the full grading path on every trust=oracle task, and what the oracle adds.

For each task whose row says `trust: "oracle"`: the gold patch graded by `evaluate_patch` (the
grading entry point) with the oracle, the first time (the gold's answers not yet cached in this
process: the clean container and the unpatched task image run too; `--concurrency` of them at
once). On a sample of `--pairs` tasks, round-robin over packages, the gold is then graded twice
more, interleaved: by the visible tests alone and with the oracle (the gold's answers cached, as
in training after a task's first episode); the difference is the per-episode overhead.

    PYTHONPATH=$PWD python3 experiments/swe_oracle_overhead.py rollhub/envs/swe/data/tasks.jsonl \
        --pairs 24 --json /tmp/oracle_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from rollhub.envs.swe.grading.evaluate import evaluate_patch
from rollhub.envs.swe.tasks import SweTask, read_rows
from rollhub.sandbox.base import Limits
from rollhub.sandbox.docker_backend import DockerBackend

LIMITS = Limits(cpus=1.0, memory_mb=2048, user="agent")


def with_trust(row: dict, trust: str) -> SweTask:
    return SweTask.from_row({**row, "rollhub": {**row["rollhub"], "trust": trust}})


async def timed(backend: DockerBackend, task: SweTask) -> tuple[float, float, dict]:
    started = time.monotonic()
    outcome = await evaluate_patch(backend, task, task.patch, limits=LIMITS, timeout_s=300)
    return outcome.reward, time.monotonic() - started, outcome.info()


def round_robin(rows: list[dict]) -> list[dict]:
    by_package: dict[str, list[dict]] = {}
    for row in rows:
        by_package.setdefault(row["rollhub"]["package"], []).append(row)
    order = []
    while any(by_package.values()):
        for queue in by_package.values():
            if queue:
                order.append(queue.pop(0))
    return order


async def main(args: argparse.Namespace) -> None:
    rows = [r for r in read_rows(args.file) if (r.get("rollhub") or {}).get("trust") == "oracle"]
    backend = DockerBackend()
    first, pairs, failures, downgraded = [], [], [], []
    try:
        gate = asyncio.Semaphore(args.concurrency)

        async def first_grading(row: dict) -> None:
            async with gate:
                reward, seconds, info = await timed(backend, with_trust(row, "oracle"))
            first.append(seconds)
            if reward != 1.0:
                failures.append({"instance_id": row["instance_id"], "info": {k: info.get(k) for k in sorted(info)}})
            if info.get("trust") != "oracle":  # the re-check on the inputs used did not hold
                downgraded.append({"instance_id": row["instance_id"], "trust_why": info.get("trust_why")})
            shown = {"id": row["instance_id"], "gold": reward, "trust": info.get("trust"), "first_s": round(seconds, 2)}
            print(json.dumps(shown), flush=True)

        await asyncio.gather(*(first_grading(row) for row in rows))
        for row in round_robin(rows)[: args.pairs]:
            _, visible_s, _ = await timed(backend, with_trust(row, "visible-tests"))
            _, oracle_s, info = await timed(backend, with_trust(row, "oracle"))
            pairs.append({"id": row["instance_id"], "visible_s": visible_s, "oracle_s": oracle_s, **info})
            print(
                json.dumps({"id": row["instance_id"], "visible_s": round(visible_s, 2), "oracle_s": round(oracle_s, 2)})
            )
    finally:
        await backend.close()
    overhead = [p["oracle_s"] - p["visible_s"] for p in pairs]
    summary = {
        "oracle_tasks": len(rows),
        "gold_resolved": len(rows) - len(failures),
        "gold_failures": failures,
        "graded_as_oracle": len(rows) - len(downgraded),
        "downgraded": downgraded,
        "first_grading_s_median": round(statistics.median(first), 2) if first else None,
        "pairs": len(pairs),
        "visible_only_s_median": round(statistics.median(p["visible_s"] for p in pairs), 2) if pairs else None,
        "with_oracle_s_median": round(statistics.median(p["oracle_s"] for p in pairs), 2) if pairs else None,
        "overhead_s_median": round(statistics.median(overhead), 2) if overhead else None,
        "oracle_candidate_run_s_median": (
            round(statistics.median(p["oracle_duration_s"] for p in pairs), 2) if pairs else None
        ),
    }
    print(json.dumps(summary, sort_keys=True))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"summary": summary, "pairs": pairs, "first_s": first}, f, indent=1, default=str)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=1, help="first gradings at once (the pairs run one by one)")
    parser.add_argument("--json", dest="json_out", default=None)
    asyncio.run(main(parser.parse_args()))
