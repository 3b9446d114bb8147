"""`rollhub bench weight-sync`: how long a weight push to inference servers takes, per method.

For each model (the tiny random-init Qwen3, and SmolLM2-135M-Instruct when it has been
exported with `rollhub model smollm2`), `replicas` real `rollhub serve` processes are
started and the same trainer-side state dict (fresh values each push) is pushed over:

* `disk`: write `v{version}` atomically, `/update_weights_from_disk`, remove old folders;
* `distributed`: one broadcast per bucket (SGLang's flattened bucket) over the weight-update
  group (gloo on CPU), with `/update_weights_from_distributed`; forming the group is timed
  once, apart;
* `distributed-per-tensor`: the same, one broadcast per tensor (the earlier protocol).

Methods alternate within each repeat (disk, distributed, then distributed, disk, ...) so a
machine that gets busier during the run does not favour one. After every push each server
must report the pushed version, or the benchmark fails. Numbers are wall time on this
machine with the servers on the same host (loopback TCP, page-cached disk): a lower bound
for a cluster, where NCCL over NVLink / InfiniBand and a shared file system change both.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

METHODS = ("disk", "distributed", "distributed-per-tensor")


@dataclass
class WeightSyncBenchConfig:
    models: list[str] = field(default_factory=lambda: ["tiny", "smollm2"])
    tiny_size: str = "5m"
    smollm2_dir: str = "runs/models/smollm2-135m-instruct"  # where `rollhub model smollm2` writes
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    replicas: int = 1
    repeats: int = 3
    threads: int = 1  # torch threads of each server
    startup_timeout_s: float = 600.0

    def validate(self) -> None:
        unknown = [m for m in self.models if m not in ("tiny", "smollm2")]
        if unknown or not self.models:
            raise ValueError(f"models must be a non-empty list of tiny / smollm2, got {self.models}")
        if not self.methods or any(m not in METHODS for m in self.methods):
            raise ValueError(f"methods must be a non-empty list of {list(METHODS)}, got {self.methods}")
        if self.replicas < 1 or self.repeats < 1 or self.threads < 1:
            raise ValueError("replicas, repeats and threads must be >= 1")
        if self.tiny_size not in ("5m", "30m"):
            raise ValueError("tiny_size must be 5m or 30m")


QUICK = ["models=[tiny]", "repeats=1"]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _launch(model_dir: Path, cfg: WeightSyncBenchConfig, logs: Path, api_key: str) -> list[Any]:
    from rollhub.inference.engines.sglang import SGLangEngine

    async def one(index: int) -> Any:
        port = _free_port()
        command = [sys.executable, "-m", "rollhub.cli", "serve", "--model", str(model_dir)]
        command += ["--port", str(port), "--threads", str(cfg.threads)]
        return await SGLangEngine.launch(
            str(model_dir),
            port=port,
            command=command,
            api_key=api_key,
            startup_timeout_s=cfg.startup_timeout_s,
            log_path=logs / f"{model_dir.name}-{index}.log",
        )

    return list(await asyncio.gather(*(one(i) for i in range(cfg.replicas))))


def _state(model_dir: Path, version: int) -> dict[str, Any]:
    """The trainer's view: every tensor (tied head included, as Policy.engine_state_dict has it), new values."""
    from rollhub.inference.weight_sync import read_checkpoint

    state = read_checkpoint(model_dir)
    state = {name: tensor + 1e-4 * version for name, tensor in state.items()}
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    return state


async def bench_model(model_dir: Path, label: str, cfg: WeightSyncBenchConfig, out: Path) -> list[dict[str, Any]]:
    """Push `repeats` times per method to freshly launched servers; one record per push."""
    from rollhub.inference.weight_sync import DiskWeightSync, DistributedWeightSync

    api_key = secrets.token_hex(16)
    clients = await _launch(model_dir, cfg, out / "servers", api_key)
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rollhub-weight-sync-") as folder:
        pushers = {
            "disk": DiskWeightSync(Path(folder) / "weights", config_dir=model_dir),
            "distributed": DistributedWeightSync(backend="gloo", timeout_s=300),
        }
        # one group serves both distributed methods (a server joins one group at a time)
        pushers["distributed-per-tensor"] = pushers["distributed"]
        load_formats = {"distributed": "flattened_bucket", "distributed-per-tensor": "per_tensor"}
        try:
            version = 0
            for repeat in range(cfg.repeats):
                order = cfg.methods if repeat % 2 == 0 else list(reversed(cfg.methods))
                for method in order:
                    version += 1
                    state = await asyncio.to_thread(_state, model_dir, version)
                    if method in load_formats:
                        pushers[method].load_format = load_formats[method]
                    timings = await pushers[method].push(clients, state, version)
                    served = await asyncio.gather(*(client.server_weight_version() for client in clients))
                    if set(served) != {str(version)}:
                        raise RuntimeError(f"{method} push of version {version}: servers report {served}")
                    records.append({"model": label, "repeat": repeat, **timings, "method": method})
                    print(f"  {label} {method:12s} v{version}: {timings['total_s'] * 1000:8.1f} ms", flush=True)
                    del state
        finally:
            await pushers["distributed"].close(clients)
            await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
    return records


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, method): median push time (group formation left out) and its split."""
    rows = []
    for model in dict.fromkeys(r["model"] for r in records):
        for method in dict.fromkeys(r["method"] for r in records if r["model"] == model):
            runs = [r for r in records if r["model"] == model and r["method"] == method]
            steady = [r["total_s"] - r.get("group_s", 0.0) for r in runs]
            megabytes = runs[-1]["bytes"] / 1e6
            row: dict[str, Any] = {
                "model": model,
                "method": method,
                "servers": runs[-1]["servers"],
                "pushes": len(runs),
                "push_ms_p50": 1000 * statistics.median(steady),
                "push_ms_min": 1000 * min(steady),
                "MB": megabytes,
                "MB_per_s": megabytes / statistics.median(steady) if statistics.median(steady) > 0 else float("nan"),
            }
            if method == "disk":
                row["write_ms_p50"] = 1000 * statistics.median(r["write_s"] for r in runs)
                row["load_ms_p50"] = 1000 * statistics.median(r["load_s"] for r in runs)
            else:
                row["group_init_ms"] = 1000 * max(r["group_s"] for r in runs)
            rows.append(row)
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rollhub.bench.report import bench_setup, print_table, save_json
    from rollhub.inference.models import init_tiny_model

    cfg, out = bench_setup(WeightSyncBenchConfig, args, QUICK)
    torch.set_num_threads(1)
    records: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rollhub-bench-") as folder:
        for model in cfg.models:
            if model == "tiny":
                model_dir, label = init_tiny_model(Path(folder) / "tiny", size=cfg.tiny_size), f"qwen3-{cfg.tiny_size}"
            else:
                model_dir, label = Path(cfg.smollm2_dir), "smollm2-135m"
                if not (model_dir / "config.json").is_file():
                    skipped[label] = f"no export at {model_dir}: run 'rollhub model smollm2' first"
                    print(f"skipping {label}: {skipped[label]}", flush=True)
                    continue
            print(f"{label}: {cfg.replicas} rollhub serve process(es), {cfg.repeats} push(es) per method", flush=True)
            records += asyncio.run(bench_model(model_dir, label, cfg, out))
    rows = summarise(records)
    print_table(
        f"weight push to {cfg.replicas} local rollhub serve process(es), median of {cfg.repeats} "
        "(group formation apart), gloo on CPU",
        rows,
    )
    result = {"config": asdict(cfg), "summary": rows, "pushes": records, "skipped": skipped}
    path = save_json(out / "weight_sync.json", result)
    print(f"wrote {path}")
    return result
