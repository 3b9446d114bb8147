"""A child "run" for the leak tests: starts N containers, prints READY, then ends as told.

usage: leak_child.py RUN_ID N MODE   (MODE: close | raise | wait)
`wait` sleeps until the parent signals or kills it.
"""

import asyncio
import sys

from rollhub.sandbox.base import Limits
from rollhub.sandbox.docker_backend import DockerBackend


async def main(run_id: str, count: int, mode: str) -> None:
    backend = DockerBackend(run_id=run_id, max_threads=8)
    boxes = await asyncio.gather(*(backend.start("rollhub/base:bookworm", Limits(memory_mb=64)) for _ in range(count)))
    print("READY", " ".join(box.id[:12] for box in boxes), flush=True)
    if mode == "close":
        await backend.close()
    elif mode == "raise":
        raise RuntimeError("simulated crash of a run")
    elif mode == "wait":
        while True:
            await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
