"""What only a GPU shows, measured in one process each and reported as OK, SKIPPED (with why) or FAIL:

* gloo push into device memory: a weight-update group of two processes over gloo (what a server
  sharing the trainer's GPU gets), rank 1 receiving into host buffers and copying them into
  device buffers the way `rollhub serve` loads them; GiB/s of the whole move;
* the memory plan against the allocator: one AdamW step of a Qwen2.5-1.5B- and a 3B-shaped model
  (random weights, real shapes, bf16 autocast, fp32 master) at a small micro-batch, planned
  (rollhub.trainer.memory_plan, no engine) against `torch.cuda.max_memory_allocated`;
* the version-0 log-prob gap between the in-process engine and the trainer in the run's compute
  dtype (bf16 on CUDA), through the same check a run makes before RL.

    python benchmarks/gpu_check/probes.py DEVICE MODEL_DIR     # DEVICE: cuda or cpu

Prints one line per probe (`probe NAME: STATUS ...`) and a JSON line of the figures; exits 1
when any probe FAILs (a SKIPPED probe is never counted as passed: the shell script lists them).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

PUSH_BYTES = 256 * 1024 * 1024  # one push bucket (DistributedWeightSync's default)
#: the allocator's peak may sit this far from the plan either way before the probe fails
PLAN_TOLERANCE = (0.6, 1.5)
#: bf16 engines and trainers stay within a few hundredths of a nat; the run's warning level
LOGPROB_GAP_MAX_NAT = 0.1


class Skipped(Exception):
    """The probe cannot run here; the message says why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _receiver(port: int, device: str, numel: int, out: Any) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    buffer = torch.empty(numel, dtype=torch.bfloat16)
    target = torch.empty(numel, dtype=torch.bfloat16, device=device)
    dist.broadcast(buffer, src=0)
    target.copy_(buffer, non_blocking=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    out.put(float(target[:16].float().sum()))
    dist.destroy_process_group()


def probe_gloo_push(device: str) -> dict[str, float]:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    numel = PUSH_BYTES // 2
    port = _free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    process = ctx.Process(target=_receiver, args=(port, device, numel, out))
    process.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    payload = torch.full((numel,), 0.5, dtype=torch.bfloat16)
    started = time.perf_counter()
    dist.broadcast(payload, src=0)
    checksum = out.get(timeout=300)
    elapsed = time.perf_counter() - started
    dist.destroy_process_group()
    process.join(timeout=60)
    if abs(checksum - 8.0) > 1e-3:
        raise AssertionError(f"received bytes differ from the sent ones (checksum {checksum}, expected 8.0)")
    return {"push_gib": PUSH_BYTES / 2**30, "push_s": elapsed, "push_gib_per_s": PUSH_BYTES / 2**30 / elapsed}


QWEN25 = {
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}  # fmt: skip


def probe_memory_plan(device: str) -> dict[str, float]:
    if not device.startswith("cuda"):
        raise Skipped(
            "the allocator's peak is a CUDA statistic; the CPU figures are in tests/trainer/test_memory_plan.py"
        )
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rollhub.trainer.memory_plan import GIB, ModelShape, PlanInputs, plan_memory

    figures: dict[str, float] = {}
    rows, tokens = 2, 1024
    for name, dims in QWEN25.items():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = Qwen2ForCausalLM(Qwen2Config(**dims)).to(device=device, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        ids = torch.randint(0, dims["vocab_size"], (rows, tokens), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids, use_cache=False).logits
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).mean()
        logp.backward()
        optimizer.step()
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated()
        shape = ModelShape.from_config({"model_type": "qwen2", **dims})
        plan = plan_memory(
            PlanInputs(shape=shape, gpu_memory_bytes=10**15, micro_batch_rows=rows, context_tokens=tokens)
        )
        planned = plan.total_bytes - plan.items["CUDA context and workspaces"]  # the context is not allocated
        figures[f"{name}_measured_gib"] = measured / GIB
        figures[f"{name}_planned_gib"] = planned / GIB
        figures[f"{name}_plan_ratio"] = planned / measured
        del model, optimizer, logits, logp
        low, high = PLAN_TOLERANCE
        if not low <= planned / measured <= high:
            raise AssertionError(f"{name}: planned {planned / GIB:.2f} GiB, measured {measured / GIB:.2f} GiB")
    return figures


def probe_logprob_gap(device: str, model_dir: str) -> dict[str, float]:
    from types import SimpleNamespace

    from rollhub.inference.engines.hf import HFEngine
    from rollhub.trainer.logprob_check import engine_agreement
    from rollhub.trainer.losses import LossConfig
    from rollhub.trainer.policy import Policy

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    config = SimpleNamespace(
        agent=SimpleNamespace(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=8), loss=LossConfig()
    )

    async def measure() -> dict[str, float]:
        engine = HFEngine(model_dir, threads=1, max_batch_size=4, dtype=dtype, device=device)
        try:
            policy = Policy(model_dir, device=device, dtype=dtype)
            return await engine_agreement(engine, policy, config)
        finally:
            await engine.close()

    metrics = asyncio.run(measure())
    gap = metrics["check/logprob_v0_max_abs_diff"]
    if gap > LOGPROB_GAP_MAX_NAT:
        raise AssertionError(f"{dtype} engine and trainer differ by {gap:.3f} nat at version 0")
    return {"logprob_gap_max_nat": gap, "logprob_gap_mean_nat": metrics["check/logprob_v0_mean_abs_diff"]}


def run(probes: dict[str, Callable[[], dict[str, float]]]) -> int:
    figures: dict[str, Any] = {}
    failed = 0
    for name, probe in probes.items():
        started = time.perf_counter()
        try:
            result = probe()
        except Skipped as why:
            print(f"probe {name}: SKIPPED ({why})", flush=True)
            figures[name] = "skipped"
            continue
        except Exception as exc:  # a probe's failure is reported, the others still run
            failed += 1
            print(f"probe {name}: FAIL ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
            figures[name] = "fail"
            continue
        shown = ", ".join(f"{k} {v:.3g}" for k, v in result.items())
        print(f"probe {name}: OK in {time.perf_counter() - started:.1f} s ({shown})", flush=True)
        figures.update(result)
    print(json.dumps({"probes": figures}))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("cuda", "cpu"):
        print("usage: python benchmarks/gpu_check/probes.py cuda|cpu MODEL_DIR", file=sys.stderr)
        return 2
    device, model_dir = argv
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return run(
        {
            "gloo_push_into_device": lambda: probe_gloo_push(device),
            "memory_plan_vs_allocator": lambda: probe_memory_plan(device),
            "logprob_gap_engine_vs_trainer": lambda: probe_logprob_gap(device, model_dir),
        }
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
