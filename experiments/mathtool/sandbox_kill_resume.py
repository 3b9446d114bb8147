"""The MathTool recipe with the python tool in sandbox containers, SIGKILLed mid-run and resumed.

    python -m experiments.mathtool.sandbox_kill_resume [--steps 4] [--kill-after 2] [--eval-episodes 40]
        [--run-dir runs/mathtool_sandbox] [--out experiments/mathtool/results/sandbox_kill_resume.json]

Runs `rollhub train configs/mathtool_smollm2.yaml` with `env.kwargs.backend=sandbox` and a checkpoint
after every step, polls Docker for the run's containers (label rollhub.role=mathtool) every second,
SIGKILLs the trainer (only the trainer: what an OOM kill does) once checkpoint `--kill-after` is on disk
and a container is alive, counts what the kill left, resumes the run with `--resume`, and at its end
counts the containers and `rollhub serve` processes left (the claim: 0 of each). The sandbox's cost
per episode comes from the run's own trajectories (the env's `sandbox_start_s`, `sandbox_exec_s` and
`sandbox_execs` in each episode's `env_metrics`); the learning result from the run's summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LABEL = "rollhub.role=mathtool"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def containers(client: Any) -> int:
    """One list call (the high-level list inspects each container, racing their removal)."""
    return len(client.api.containers(all=True, filters={"label": LABEL}))


def servers(run_dir: Path) -> list[int]:
    """Pids of `rollhub serve` processes this run launched (their command lines name no run folder,
    so every one alive counts: run this with no other training job on the machine)."""
    out = subprocess.run(["pgrep", "-f", "rollhub.cli serve"], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def watch(proc: subprocess.Popen, client: Any, trace: list[tuple[float, int]], until: Any = None) -> bool:
    """Poll until the process ends (False) or `until()` holds (True), recording containers alive."""
    while proc.poll() is None:
        trace.append((time.time(), containers(client)))
        if until is not None and until():
            return True
        time.sleep(1.0)
    return False


def sandbox_cost(run_dir: Path) -> dict[str, Any]:
    starts, execs, episodes, with_box = [], [], 0, 0
    for line in (run_dir / "trajectories.jsonl").read_text().splitlines():
        metrics = json.loads(line).get("info", {}).get("env_metrics", {})
        episodes += 1
        if "sandbox_start_s" in metrics:
            with_box += 1
            starts.append(metrics["sandbox_start_s"])
        if metrics.get("sandbox_execs"):
            execs.append(metrics["sandbox_exec_s"] / metrics["sandbox_execs"])
    ms = lambda v: None if v is None else round(1000 * v, 1)  # noqa: E731
    return {
        "training_episodes": episodes,
        "episodes_with_a_container": with_box,
        "start_p50_ms": ms(percentile(starts, 0.5)),
        "start_p99_ms": ms(percentile(starts, 0.99)),
        "exec_per_call_p50_ms": ms(percentile(execs, 0.5)),
        "exec_per_call_p99_ms": ms(percentile(execs, 0.99)),
        "exec_per_call_mean_ms": ms(statistics.fmean(execs) if execs else None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/mathtool_smollm2.yaml")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--kill-after", type=int, default=2, help="SIGKILL once this step's checkpoint exists")
    parser.add_argument("--eval-episodes", type=int, default=40)
    parser.add_argument("--run-dir", default="runs/mathtool_sandbox")
    parser.add_argument("--out", default="experiments/mathtool/results/sandbox_kill_resume.json")
    args = parser.parse_args()

    import docker

    client = docker.from_env()
    run_dir = Path(args.run_dir)
    command = [
        sys.executable, "-m", "rollhub", "train", args.config, "--no-progress",
        "--set", f"run_dir={run_dir}", "--set", "env.kwargs.backend=sandbox",
        "--set", f"train.steps={args.steps}", "--set", "train.checkpoint_every=1",
        "--set", f"eval.episodes={args.eval_episodes}",
    ]  # fmt: skip
    report: dict[str, Any] = {"command": " ".join(command[2:]), "containers_before": containers(client)}
    trace: list[tuple[float, int]] = []
    checkpoint = run_dir / "checkpoints" / f"step-{args.kill_after:06d}" / "state.pt"
    started = time.time()
    first = subprocess.Popen(command, start_new_session=True)
    due = lambda: checkpoint.is_file() and containers(client) > 0  # noqa: E731
    if not watch(first, client, trace, until=due):
        raise SystemExit(f"the run ended (exit {first.returncode}) before checkpoint {args.kill_after} was written")
    alive_at_kill = containers(client)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    time.sleep(3.0)
    report["kill"] = {
        "after_s": round(time.time() - started, 1),
        "containers_alive_at_kill": alive_at_kill,
        "containers_left_by_the_kill": containers(client),
        "servers_alive_3s_after_the_kill": len(servers(run_dir)),
    }
    print("kill:", report["kill"], flush=True)
    resume_log = run_dir / "resume.log"
    with open(resume_log, "w") as log:
        resume = [sys.executable, "-m", "rollhub", "train", "--resume", str(run_dir), "--no-progress"]
        resumed = subprocess.Popen(resume, start_new_session=True, stdout=log, stderr=log)
        watch(resumed, client, trace)
    report["resume_exit_code"] = resumed.returncode
    text = resume_log.read_text()
    report["resume_printed"] = [line for line in text.splitlines() if "orphaned" in line or "success" in line]
    time.sleep(2.0)
    report["containers_left_after_the_run"] = containers(client)
    report["servers_left_after_the_run"] = len(servers(run_dir))
    report["peak_containers_alive"] = max((n for _, n in trace), default=0)
    report["wall_s"] = round(time.time() - started, 1)
    report["sandbox"] = sandbox_cost(run_dir)
    summary_file = run_dir / "summary.json"
    report["summary"] = json.loads(summary_file.read_text()) if summary_file.exists() else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "summary"}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
