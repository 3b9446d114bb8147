"""Probe the differential oracle on a few shipped SWE tasks: trust survey per task (and its time).

PYTHONPATH=$PWD python3 experiments/swe_oracle_probe.py rollhub/envs/swe/data/tasks.jsonl [ID_SUBSTRING ...]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from rollhub.envs.swe.grading.oracle import survey_trust
from rollhub.envs.swe.tasks import SweTask
from rollhub.sandbox.base import Limits
from rollhub.sandbox.docker_backend import DockerBackend


async def main(path: str, wanted: list[str]) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if not wanted or any(w in r["instance_id"] for w in wanted)]
    backend = DockerBackend()
    try:
        for row in rows:
            task = SweTask.from_row(row)
            started = time.monotonic()
            result = await survey_trust(backend, task, Limits(cpus=1.0, memory_mb=1024, user="agent"))
            mutation = row["rollhub"]["mutation"]["function"]
            print(
                json.dumps(
                    {"id": task.instance_id, "function": mutation, **result, "s": round(time.monotonic() - started, 2)}
                ),
                flush=True,
            )
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
