"""`rollhub bench swe`: SWE-v0 latencies and agreement with the official swebench harness.

For every task of the set (default: the shipped one; `--set tasks=FILE`, `--quick` = 3
tasks) it measures env reset, one tool call and the reward evaluation, and grades the gold
and the empty patch twice: with our reward (`evaluate_patch`) and with swebench's own
`run_instance` on the same locally tagged image. Agreement must be 100%.
Writes `swe.json` under `--out`.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollhub.envs.swe.tasks import SHIPPED_TASKS, SweTask, load_tasks


def _options(args: Any) -> dict[str, str]:
    pairs = [o.split("=", 1) for o in getattr(args, "overrides", []) or []]
    return {k: v for k, v in pairs}


class _NoNetworkContainers:
    """`client.containers` whose `create` adds network_mode="none" (grading needs no network,
    and engines without a bridge, like these machines', cannot attach the default one)."""

    def __init__(self, containers: Any):
        self._containers = containers

    def create(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("network_mode", "none")
        return self._containers.create(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._containers, name)


class _NoNetworkClient:
    def __init__(self, client: Any):
        self._client = client
        self.containers = _NoNetworkContainers(client.containers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def official_verdicts(
    tasks: list[SweTask], patches: dict[str, dict[str, str]], workdir: Path, max_workers: int = 2
) -> dict[tuple[str, str], bool | None]:
    """(instance_id, patch name) -> resolved per swebench's `run_instance` (None = error)."""
    import docker
    from swebench.harness.run_evaluation import run_instance
    from swebench.harness.utils import make_test_spec

    raw_client = docker.from_env(timeout=600)
    client = _NoNetworkClient(raw_client)  # everything else is swebench's own run_instance
    jobs = []
    for task in tasks:
        for name, patch in patches[task.instance_id].items():
            jobs.append(
                (
                    task,
                    name,
                    {"instance_id": task.instance_id, "model_name_or_path": f"rollhub-{name}", "model_patch": patch},
                )
            )
    cwd = os.getcwd()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # run_instance writes logs/run_evaluation/... relative to the cwd
    try:
        run_id = f"bench-{int(time.time())}"

        def one(job: tuple[SweTask, str, dict[str, str]]) -> tuple[tuple[str, str], bool | None]:
            task, name, prediction = job
            # one run id per patch kind: run_instance names its container by (instance, run id) and
            # removes a same-named "ghost", which would kill a concurrent job on the same instance
            result = run_instance(make_test_spec(task.row), prediction, client, f"{run_id}-{name}", timeout=900)
            if not result:
                return (task.instance_id, name), None
            return (task.instance_id, name), bool(result[1][task.instance_id]["resolved"])

        with ThreadPoolExecutor(max_workers) as pool:
            return dict(pool.map(one, jobs))
    finally:
        os.chdir(cwd)
        raw_client.close()


async def _ours(
    tasks: list[SweTask], patches: dict[str, dict[str, str]]
) -> tuple[dict[tuple[str, str], float], dict[str, list[float]], list[str]]:
    from rollhub.envs.swe.agent.tools import ToolCall
    from rollhub.envs.swe.env import SWEEnv
    from rollhub.envs.swe.grading.evaluate import evaluate_patch
    from rollhub.sandbox.docker_backend import DockerBackend

    backend = DockerBackend()
    timings: dict[str, list[float]] = {"reset_s": [], "tool_call_s": [], "eval_s": [], "close_s": []}
    rewards = {}
    infra_failures: list[str] = []
    try:
        env = SWEEnv(tasks, backend=backend)
        for task in tasks:
            started = time.monotonic()
            _, info = await env.reset(options={"instance_id": task.instance_id})
            if info.get("infra_failure"):
                infra_failures.append(f"{task.instance_id}: {info['infra_failure']}")
                continue
            timings["reset_s"].append(time.monotonic() - started)
            started = time.monotonic()
            await env.step(ToolCall("bash", {"command": "git status --short"}).to_text())
            timings["tool_call_s"].append(time.monotonic() - started)
            started = time.monotonic()
            await env._close_box()
            timings["close_s"].append(time.monotonic() - started)
            for name, patch in patches[task.instance_id].items():
                outcome = await evaluate_patch(backend, task, patch)
                if outcome.infra_failure:
                    infra_failures.append(f"{task.instance_id}/{name}: {outcome.infra_failure}")
                    continue
                timings["eval_s"].append(outcome.duration_s)
                rewards[(task.instance_id, name)] = outcome.reward
        await env.close()
    finally:
        await backend.close()
    return rewards, timings, infra_failures


def run(args: Any) -> dict[str, Any]:
    options = _options(args)
    tasks = load_tasks(options.get("tasks", SHIPPED_TASKS))
    if args.quick:
        tasks = tasks[:3]
    patches = {t.instance_id: {"gold": t.patch, "empty": ""} for t in tasks}
    rewards, timings, infra_failures = asyncio.run(_ours(tasks, patches))
    official = official_verdicts(tasks, patches, Path(args.out) / "official", int(options.get("workers", 2)))
    compared = [key for key, resolved in official.items() if resolved is not None and key in rewards]
    agree = sum(1 for key in compared if official[key] == (rewards[key] == 1.0))
    summary: dict[str, Any] = {
        "tasks": len(tasks),
        "gold_resolved_ours": sum(rewards.get((t.instance_id, "gold")) == 1.0 for t in tasks),
        "empty_resolved_ours": sum(rewards.get((t.instance_id, "empty")) == 1.0 for t in tasks),
        "infra_failures_ours": len(infra_failures),
        "gold_resolved_official": sum(bool(official[(t.instance_id, "gold")]) for t in tasks),
        "empty_resolved_official": sum(bool(official[(t.instance_id, "empty")]) for t in tasks),
        "official_errors": sum(v is None for v in official.values()),
        "agreement": f"{agree}/{len(compared)}",
        **{f"{name}_p50": round(statistics.median(values), 3) for name, values in timings.items() if values},
        **{f"{name}_max": round(max(values), 3) for name, values in timings.items() if values},
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "swe.json").write_text(
        json.dumps(
            {
                "summary": summary,
                "infra_failures": infra_failures,
                "rewards": {f"{k[0]}:{k[1]}": v for k, v in rewards.items()},
                "official": {f"{k[0]}:{k[1]}": v for k, v in official.items()},
            },
            indent=2,
        )
    )
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        print(f"{key:{width}s}  {value}")
    return summary
