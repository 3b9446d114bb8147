"""`rollhub bench sandbox`: what a Docker sandbox costs on this host.

Phases (all against the real engine, one run id, everything removed at the end):
1. start latency: `starts` sequential starts (create + start of an idle container, and of
   its persistent shell);
2. exec round trip: `execs` sequential `true` commands in one sandbox, on each exec path
   (`exec_modes`: the persistent shell, and one `docker exec` per command), interleaved
   command by command so the machine's load weighs on both alike;
3. throughput: for each exec path and each concurrency c, c sandboxes in parallel each
   start, run `execs_per_sandbox` commands and close (starts throttled by the pool, as in
   training);
   Baseline: `docker run -d` / `docker exec` through the CLI in the same process; the
   ratios (start_vs_cli, exec_vs_cli) are what to compare across machines and loads.
4. idle memory: `idle` idle containers; the cgroup's own usage per container and the PSS
   of the containerd shim that serves each one (its host-side cost);
5. leaks: rollhub containers of this run still present after the backend closed (must be 0);
6. hardening cost (only with `hardening_image`, e.g. an SWE task image): what the image's
   non-root user and the disk budget cost, against root and no budget, on the same image:
   `hardening_rounds` rounds, each starting one sandbox per variant in turn (interleaved,
   so the load weighs on all alike) and running `hardening_execs` commands in it; start
   and exec p50 / p99 per variant.

Options: `--set image=... starts=30 execs=100 concurrency=[1,8,32,64] idle=32
execs_per_sandbox=3 max_concurrent_starts=8 exec_modes=[persistent-shell,docker-exec]
user=auto disk_mb=null hardening_image=... hardening_rounds=20 hardening_execs=20
hardening_disk_mb=1024 hardening_writable_dirs=[/tmp,/var/tmp,/home]`. `user` and `disk_mb`
apply to phases 1-4. `--quick` shrinks every phase.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollhub.bench.report import print_table, save_json, save_plot

logger = logging.getLogger(__name__)


@dataclass
class SandboxBenchConfig:
    image: str = "rollhub/base:bookworm"
    starts: int = 30
    execs: int = 100
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32, 64])
    execs_per_sandbox: int = 3
    idle: int = 32
    max_concurrent_starts: int = 8
    memory_mb: int = 512
    exec_modes: list[str] = field(default_factory=lambda: ["persistent-shell", "docker-exec"])
    user: str = "auto"
    disk_mb: int | None = None
    hardening_image: str = ""
    hardening_rounds: int = 20
    hardening_execs: int = 20
    hardening_disk_mb: int = 1024
    #: the budgeted folders (empty: Limits' default); the SWE env leaves /root out
    hardening_writable_dirs: list[str] = field(default_factory=list)

    def validate(self) -> None:
        from rollhub.sandbox.base import EXEC_MODES

        if not self.exec_modes or any(mode not in EXEC_MODES for mode in self.exec_modes):
            raise ValueError(f"exec_modes must be a non-empty list of {', '.join(EXEC_MODES)}")
        if min(self.starts, self.execs, self.idle, self.max_concurrent_starts, self.memory_mb) < 1:
            raise ValueError("starts, execs, idle, max_concurrent_starts and memory_mb must be >= 1")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency must be a non-empty list of positive integers")
        if self.execs_per_sandbox < 0:
            raise ValueError("execs_per_sandbox must be >= 0")
        if min(self.hardening_rounds, self.hardening_execs, self.hardening_disk_mb) < 1:
            raise ValueError("hardening_rounds, hardening_execs and hardening_disk_mb must be >= 1")
        if self.disk_mb is not None and self.disk_mb < 1:
            raise ValueError("disk_mb must be >= 1 or null (no budget)")


QUICK = ["starts=5", "execs=20", "concurrency=[1,8]", "idle=4", "hardening_rounds=4", "hardening_execs=5"]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _shim_pss_bytes(container_ids: list[str]) -> int | None:
    """Proportional set size of the containerd shims serving these containers (the host-side
    cost of a container outside its cgroup); None when they are not visible from here."""
    wanted = set(container_ids)
    total, found = 0, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not argv or b"containerd-shim" not in argv[0] or b"-id" not in argv:
                continue
            if argv[argv.index(b"-id") + 1].decode() not in wanted:
                continue
            for line in Path(f"/proc/{entry}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    found += 1
        except (OSError, IndexError, ValueError):
            continue
    return total if found else None


def _cgroup_memory_bytes(container_id: str) -> int | None:
    """The container's memory usage from its cgroup on this host (v1, then v2); None when
    the engine is remote or the layout differs."""
    for path in (
        f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes",
        f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.current",
        f"/sys/fs/cgroup/docker/{container_id}/memory.current",
    ):
        try:
            return int(Path(path).read_text())
        except OSError:
            continue
    return None


def _docker_cli_baseline(cfg: SandboxBenchConfig) -> dict:
    """The same two operations through the `docker` CLI, measured in this process: the
    baseline our numbers are read against (the machine's load moves both alike)."""
    import shutil
    import subprocess

    from rollhub.sandbox.pool import percentile

    if shutil.which("docker") is None:
        return {}
    run_argv = [
        "docker",
        "run",
        "-d",
        "--init",
        "--network",
        "none",
        "--label",
        "rollhub.run=bench-cli-baseline",
        cfg.image,
        "sleep",
        "infinity",
    ]
    start_s, exec_s = [], []
    container_ids = []
    try:
        for _ in range(max(3, cfg.starts // 3)):
            began = time.monotonic()
            container_ids.append(subprocess.run(run_argv, check=True, capture_output=True, text=True).stdout.strip())
            start_s.append(time.monotonic() - began)
        for _ in range(max(5, cfg.execs // 3)):
            began = time.monotonic()
            subprocess.run(["docker", "exec", container_ids[0], "true"], check=True, capture_output=True)
            exec_s.append(time.monotonic() - began)
    finally:
        if container_ids:
            subprocess.run(["docker", "rm", "-f", *container_ids], capture_output=True)
    return {"cli_run_p50_ms": _ms(percentile(start_s, 0.5)), "cli_exec_p50_ms": _ms(percentile(exec_s, 0.5))}


async def _start_latency(backend, cfg: SandboxBenchConfig, limits) -> dict:
    from rollhub.sandbox.pool import percentile

    start_s, remove_s = [], []
    for _ in range(cfg.starts):
        began = time.monotonic()
        box = await backend.start(cfg.image, limits)
        start_s.append(time.monotonic() - began)
        began = time.monotonic()
        await box.close()
        remove_s.append(time.monotonic() - began)
    return {
        "start_p50_ms": _ms(percentile(start_s, 0.5)),
        "start_p95_ms": _ms(percentile(start_s, 0.95)),
        "remove_p50_ms": _ms(percentile(remove_s, 0.5)),
        "remove_p95_ms": _ms(percentile(remove_s, 0.95)),
    }


async def _exec_latency(backend, cfg: SandboxBenchConfig, limits) -> list[dict]:
    """`true` round trips on every exec path, one sandbox each, interleaved."""
    import dataclasses

    from rollhub.sandbox.pool import percentile

    boxes = {
        mode: await backend.start(cfg.image, dataclasses.replace(limits, exec_mode=mode)) for mode in cfg.exec_modes
    }
    round_trips: dict[str, list[float]] = {mode: [] for mode in cfg.exec_modes}
    try:
        for box in boxes.values():
            await box.exec("true", timeout_s=30)  # first exec warms the engine's exec path
        for _ in range(cfg.execs):
            for mode, box in boxes.items():
                began = time.monotonic()
                result = await box.exec("true", timeout_s=30)
                round_trips[mode].append(time.monotonic() - began)
                if not result.ok:
                    raise RuntimeError(f"`true` failed in the sandbox ({mode}): {result}")
    finally:
        await asyncio.gather(*(box.close() for box in boxes.values()))
    return [
        {
            "exec_mode": mode,
            "exec_p50_ms": _ms(percentile(times, 0.5)),
            "exec_p95_ms": _ms(percentile(times, 0.95)),
            "fell_back_to_docker_exec": boxes[mode]._shell_unavailable is not None,
        }
        for mode, times in round_trips.items()
    ]


async def _throughput(backend, cfg: SandboxBenchConfig, limits, concurrency: int, exec_mode: str) -> dict:
    import dataclasses

    from rollhub.sandbox.base import SandboxError
    from rollhub.sandbox.pool import SandboxPool

    pool = SandboxPool(
        backend, max_concurrent=concurrency, max_concurrent_starts=cfg.max_concurrent_starts, start_retries=0
    )
    failures = 0
    limits = dataclasses.replace(limits, exec_mode=exec_mode)

    async def episode(index: int) -> None:
        nonlocal failures
        try:
            async with pool.sandbox(cfg.image, limits) as box:
                for step in range(cfg.execs_per_sandbox):
                    result = await box.exec(f"echo {index}-{step}", timeout_s=60)
                    if result.output != f"{index}-{step}\n":
                        failures += 1
        except SandboxError as exc:
            logger.warning("episode %d failed: %s", index, exc)
            failures += 1

    began = time.monotonic()
    await asyncio.gather(*(episode(i) for i in range(concurrency)))
    wall_s = time.monotonic() - began
    await pool.close()
    summary = pool.metrics.summary()
    return {
        "exec_mode": exec_mode,
        "concurrency": concurrency,
        "wall_s": round(wall_s, 2),
        "sandboxes_per_s": round(concurrency / wall_s, 2),
        "execs_per_s": round(concurrency * cfg.execs_per_sandbox / wall_s, 1),
        "start_p50_ms": summary["start_p50_ms"],
        "start_p95_ms": summary["start_p95_ms"],
        "exec_p50_ms": summary["exec_p50_ms"],
        "exec_p95_ms": summary["exec_p95_ms"],
        "failures": failures + summary["start_failures"],
    }


async def _idle_memory(backend, cfg: SandboxBenchConfig, limits) -> dict:
    from rollhub.sandbox.pool import SandboxPool

    pool = SandboxPool(backend, max_concurrent=cfg.idle, max_concurrent_starts=cfg.max_concurrent_starts)
    boxes = await asyncio.gather(*(pool.acquire(cfg.image, limits) for _ in range(cfg.idle)))
    await asyncio.sleep(2.0)  # let the shims settle
    cgroup = [_cgroup_memory_bytes(box.id) for box in boxes]
    shims = _shim_pss_bytes([box.id for box in boxes])
    await asyncio.gather(*(box.close() for box in boxes))
    known = [value for value in cgroup if value is not None]
    return {
        "idle_containers": cfg.idle,
        "cgroup_mib_per_container": round(sum(known) / len(known) / 2**20, 2) if known else None,
        "shim_pss_mib_per_container": round(shims / cfg.idle / 2**20, 2) if shims is not None else None,
    }


async def _hardening_cost(backend, cfg: SandboxBenchConfig, limits) -> list[dict]:
    """Start and exec latency of root vs the image's sandbox user, with and without the disk
    budget, on `hardening_image`, interleaved round by round."""
    import dataclasses

    from rollhub.sandbox.pool import percentile

    if cfg.hardening_writable_dirs:
        limits = dataclasses.replace(limits, writable_dirs=tuple(cfg.hardening_writable_dirs))
    variants = {
        (user, budget): dataclasses.replace(limits, user=user, disk_mb=budget, exec_mode=None)
        for user in ("root", "auto")
        for budget in (None, cfg.hardening_disk_mb)
    }
    starts: dict[tuple, list[float]] = {key: [] for key in variants}
    execs: dict[tuple, list[float]] = {key: [] for key in variants}
    who: dict[tuple, str] = {}
    for _ in range(cfg.hardening_rounds):
        for key, variant in variants.items():
            began = time.monotonic()
            box = await backend.start(cfg.hardening_image, variant)
            starts[key].append(time.monotonic() - began)
            try:
                who[key] = (await box.exec("id -un", timeout_s=30)).output.strip()
                for _ in range(cfg.hardening_execs):
                    began = time.monotonic()
                    result = await box.exec("true", timeout_s=30)
                    execs[key].append(time.monotonic() - began)
                    if not result.ok:
                        raise RuntimeError(f"`true` failed in the sandbox ({key}): {result}")
            finally:
                await box.close()
    return [
        {
            "user": who.get(key, user),
            "disk_budget_mb": budget or "none",
            "disk_mode": backend.disk_budget_mode() if budget else "",
            "start_p50_ms": _ms(percentile(starts[key], 0.5)),
            "start_p99_ms": _ms(percentile(starts[key], 0.99)),
            "exec_p50_ms": _ms(percentile(execs[key], 0.5)),
            "exec_p99_ms": _ms(percentile(execs[key], 0.99)),
        }
        for key, (user, budget) in zip(variants, variants, strict=True)
    ]


async def _bench(cfg: SandboxBenchConfig) -> dict:
    from rollhub.sandbox.base import Limits
    from rollhub.sandbox.docker_backend import DockerBackend
    from rollhub.sandbox.reaper import list_rollhub_containers

    backend = DockerBackend(max_threads=max(64, 2 * max(cfg.concurrency)))
    limits = Limits(cpus=1.0, memory_mb=cfg.memory_mb, pids=512, user=cfg.user, disk_mb=cfg.disk_mb)
    results: dict = {
        "config": cfg.__dict__,
        "engine": backend.client.version().get("Version"),
        "host_cpus": os.cpu_count(),
        "load_avg_1m_before": round(os.getloadavg()[0], 2),  # shared machines: read numbers with this
    }
    try:
        latency = await _start_latency(backend, cfg, limits)
        exec_rows = await _exec_latency(backend, cfg, limits)
        latency.update({key: exec_rows[0][key] for key in ("exec_p50_ms", "exec_p95_ms")})  # the first mode's
        baseline = await asyncio.to_thread(_docker_cli_baseline, cfg)
        if baseline:
            latency.update(baseline)
            latency["start_vs_cli"] = round(latency["start_p50_ms"] / baseline["cli_run_p50_ms"], 2)
            for row in exec_rows:
                row["exec_vs_cli"] = round(row["exec_p50_ms"] / baseline["cli_exec_p50_ms"], 3)
        results["latency"] = latency
        results["exec"] = exec_rows
        results["throughput"] = [
            await _throughput(backend, cfg, limits, c, mode) for mode in cfg.exec_modes for c in cfg.concurrency
        ]
        results["memory"] = await _idle_memory(backend, cfg, limits)
        if cfg.hardening_image:
            results["hardening"] = await _hardening_cost(backend, cfg, limits)
    finally:
        await backend.close()
    from rollhub.sandbox.docker_backend import connect

    client = connect()
    results["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    results["leaked_containers"] = len(list_rollhub_containers(client.api, backend.run_id))
    client.close()
    return results


def _draw_throughput(axes, all_rows: list[dict]) -> None:
    for mode in dict.fromkeys(row["exec_mode"] for row in all_rows):
        rows = [row for row in all_rows if row["exec_mode"] == mode]
        concurrency = [row["concurrency"] for row in rows]
        axes[0].plot(concurrency, [row["sandboxes_per_s"] for row in rows], marker="o", label=mode)
        axes[1].plot(concurrency, [row["exec_p50_ms"] for row in rows], marker="o", label=f"exec p50 ({mode})")
        axes[1].plot(concurrency, [row["exec_p95_ms"] for row in rows], marker="o", label=f"exec p95 ({mode})")
        axes[1].plot(concurrency, [row["start_p50_ms"] for row in rows], marker="s", label=f"start p50 ({mode})")
    axes[0].set(xlabel="concurrent sandboxes", ylabel="sandboxes / s (start + execs + close)", title="throughput")
    axes[0].legend()
    axes[1].set(xlabel="concurrent sandboxes", ylabel="ms", title="latency under load", yscale="log")
    axes[1].legend(fontsize="small")


def run(args: argparse.Namespace) -> dict:
    from rollhub.core.config import load_config
    from rollhub.core.errors import UserError
    from rollhub.sandbox.base import SandboxError

    cfg = load_config(SandboxBenchConfig, None, (QUICK if args.quick else []) + list(args.overrides))
    try:
        results = asyncio.run(_bench(cfg))
    except SandboxError as exc:
        raise UserError(str(exc)) from exc
    print_table("sandbox latency (ms)", [results["latency"]])
    print_table("exec round trip of `true`, per exec path (ms)", results["exec"])
    print_table("sandbox throughput", results["throughput"])
    print_table(
        "idle memory and leaks",
        [
            {
                **results["memory"],
                "leaked_containers": results["leaked_containers"],
                "load_avg_1m": results["load_avg_1m_before"],
            }
        ],
    )
    if "hardening" in results:
        print_table(f"non-root user and disk budget on {cfg.hardening_image} (ms)", results["hardening"])
    path = save_json(Path(args.out) / "sandbox.json", results)
    plot = save_plot(Path(args.out) / "sandbox.png", _draw_throughput, results["throughput"], panels=2)
    print(f"wrote {path} and {plot}")
    if results["leaked_containers"]:
        raise RuntimeError(f"{results['leaked_containers']} containers leaked after the benchmark")
    return results
