"""`rollhub bench trainer`: trainer step speed, padded vs packed micro-batches, and where the step goes.

The batch is recorded with the real rollout code: `EnvManager` and the agent play
`rollhub/Sokoban-v0` with the recipe's env arguments (`configs/sokoban_tiny.yaml`: 6x6,
end on deadlock, at most 10 moves), and the advantages come from the recipe's GiGPO through
`build_training_batch`. The engine is a scripted mover (`RandomMoveEngine`: a uniformly
random move word per turn), not the tiny model: an untrained 5M model answers no legal
move, so its episodes would all run to the step limit with the same length, while random
legal moves end episodes at deadlocks after 1 to 10 turns, as a learning policy's do.
The behaviour log-probs are then recomputed by the policy itself (on-policy samples).
Two prompt layouts: `history` (the agent's default: every turn appends to one sequence, so
lengths differ several-fold) and `observation_only` (the recipe's Markov agent: one short
sequence per turn).

For every layout and `loss.proximal` setting, one step of the recipe's update (`ppo_update`
with its loss, mini-batches and optimizer) runs padded (`optim.micro_batch_size` rows) and
packed (`optim.pack_tokens` for each budget), in interleaved rounds, each from the same
weights and optimizer state. Reported per mode: median step time, trained tokens/s (real,
unpadded tokens of the batch per second of step), the tokens the forward passes actually
ran (padding included), the step split (`split/*` of `ppo_update`: proximal pass, reference
pass, forward, loss, backward, optimizer) and, with `memory=true`, the peak memory of the
step: each mode runs once more in a fresh process (spawn) whose resident set size is read
from /proc/self/statm every millisecond; the peak growth over the step is reported
(tracemalloc cannot see torch's allocator, and ru_maxrss would include model loading).

1 vs 2 trainer ranks (`rank_comparison`, section `ranks`): the first layout's batch, the first
proximal setting, one step at a time in each of the `rank_modes` (RANKSxTHREADS: one rank with
one thread, one rank with two, two ranks with one each; RANKSxTHREADS@TOKENS packs micro-batches
to TOKENS, e.g. 2x1@1024), each mode in its own processes, interleaved; tokens/s and per-rank
peak memory. On one machine this
shows the data-parallel split against threads on the same cores, not multi-node scaling.

Options (`--set key=value`): recipe, model, groups, group_size, layouts, proximal, pack_tokens
(budgets), rounds, memory, seed, sections (packing, ranks), rank_modes, recipe_set (overrides of
the recipe, e.g. "recipe_set=[model.dtype=float32]").
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import logging
import os
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollhub.bench.report import bench_setup, print_table, save_json

logger = logging.getLogger(__name__)

LAYOUTS = ("history", "observation_only")
SECTIONS = ("packing", "ranks")  # padded vs packed; 1 vs 2 trainer ranks
STEP_SEED = 7  # the mini-batch shuffle of the measured step


@dataclass
class TrainerBenchConfig:
    recipe: str = "configs/sokoban_tiny.yaml"
    model: str = ""  # HF checkpoint dir; empty = the recipe's model.path (built when missing)
    groups: int = 8  # the recipe's groups_per_batch
    group_size: int = 4
    layouts: list[str] = field(default_factory=lambda: list(LAYOUTS))
    proximal: list[str] = field(default_factory=lambda: ["behaviour", "recompute"])
    pack_tokens: list[int] = field(default_factory=lambda: [1024, 2048])
    rounds: int = 3  # interleaved repetitions of every mode
    recipe_set: list[str] = field(default_factory=list)  # KEY=VALUE overrides of the recipe, e.g. [model.dtype=float32]
    memory: bool = True  # padded vs packed: peak RSS growth per mode, one fresh process each
    seed: int = 0
    sections: list[str] = field(default_factory=lambda: list(SECTIONS))
    # RANKSxTHREADS per rank, @TOKENS: packed micro-batches (the recipe's optim.pack_tokens)
    rank_modes: list[str] = field(default_factory=lambda: ["1x1", "1x2", "2x1", "1x2@1024", "2x1@1024"])

    def validate(self) -> None:
        if min(self.groups, self.group_size, self.rounds) < 1:
            raise ValueError("groups, group_size and rounds must be >= 1")
        if unknown := [layout for layout in self.layouts if layout not in LAYOUTS]:
            raise ValueError(f"unknown layouts {unknown}; choose from {list(LAYOUTS)}")
        if unknown := [p for p in self.proximal if p not in ("behaviour", "recompute")]:
            raise ValueError(f"unknown proximal settings {unknown}; choose behaviour or recompute")
        if any(budget < 1 for budget in self.pack_tokens):
            raise ValueError("every pack_tokens budget must be >= 1")
        if unknown := [section for section in self.sections if section not in SECTIONS]:
            raise ValueError(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
        if not self.layouts or not self.proximal:
            raise ValueError("layouts and proximal need at least one entry each")
        for mode in self.rank_modes:
            parse_rank_mode(mode)
        if "ranks" in self.sections and not self.rank_modes:
            raise ValueError("the ranks section needs at least one rank mode (e.g. rank_modes=[1x1,2x1])")


QUICK = ["groups=2", "group_size=2", "layouts=[history]", "proximal=[behaviour]", "pack_tokens=[1024]", "rounds=1"]


# --- recording a batch ------------------------------------------------------------------


class RandomMoveEngine:
    """A scripted engine for `EnvManager`: answers a uniformly random move word each turn."""

    weight_version = 0

    def __init__(self, tokenizer: Any, moves: list[str], seed: int) -> None:
        self._answers = [tokenizer.encode(move, add_special_tokens=False) for move in moves]
        self._eos = tokenizer.eos_token_id
        self._rng = random.Random(seed)

    async def generate(self, input_ids: list[int], sampling: Any, request_id: str | None = None) -> Any:
        from rollhub.inference.engines.base import Generation

        ids = list(self._rng.choice(self._answers))[: sampling.max_new_tokens]
        finish = "length"
        if len(ids) < sampling.max_new_tokens:
            ids.append(self._eos)
            finish = "stop"
        return Generation(ids, [0.0] * len(ids), [0] * len(ids), finish, prompt_tokens=len(input_ids))

    async def update_weights(self, source: Any, version: int) -> None:
        self.weight_version = version

    async def pause(self) -> None:
        return None

    async def resume(self) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        return None

    async def abort_all(self) -> None:
        return None

    async def close(self) -> None:
        return None


def record_batch(config: Any, tokenizer: Any, layout: str, groups: int, group_size: int, seed: int) -> Any:
    """A training batch of Sokoban groups played by `RandomMoveEngine` through the real EnvManager."""
    from rollhub.envs.base import wrap_action
    from rollhub.envs.sokoban.grid import MOVES
    from rollhub.rollout.manager import EnvManager
    from rollhub.trainer.batch import build_training_batch

    agent = copy.deepcopy(config.agent)
    agent.observation_only = layout == "observation_only"
    agent.max_new_tokens = max(agent.max_new_tokens, 8)
    tag = str(config.env.kwargs.get("action_tag", "action"))
    engine = RandomMoveEngine(tokenizer, [wrap_action(move, tag) for move in MOVES], seed)
    env = dataclasses.replace(config.env, train_seed_offset=config.env.train_seed_offset + seed)
    lockstep = {"lockstep": True, "async_ratio": 0, "redundant_groups": 0, "redundant_trajectories": 0}
    rollout = dataclasses.replace(config.rollout, group_size=group_size, **lockstep)

    async def collect() -> list[Any]:
        manager = EnvManager(engine, tokenizer, env=env, rollout=rollout, agent=agent)
        try:
            return await manager.collect_batch(groups)
        finally:
            await manager.close()

    batch, _ = build_training_batch(asyncio.run(collect()), tokenizer.pad_token_id, config.algorithm, loss=config.loss)
    if batch is None:
        raise RuntimeError("the recorded groups carry no advantage signal; try another seed")
    return batch


# --- one measured step ------------------------------------------------------------------


def forward_tokens(batch: Any, optim: Any, pack_tokens: int | None, seed: int) -> int:
    """Token positions the update's forward passes run over one epoch, padding included.

    Follows `ppo_update`'s partition (the same seeded shuffle into mini-batches), then
    `micro_batch_size` right-padded rows (each as wide as its longest), or packed groups of
    `pack_tokens` whose rows run only the tokens no other row of the group already holds.
    """
    import torch

    from rollhub.trainer.packing import plan_packed_micro_batches, sequence_lengths, shared_prefixes

    lengths = sequence_lengths(batch.attention_mask)
    parts = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed))
    parts = parts.tensor_split(min(optim.minibatches, len(lengths)))
    total = 0
    for part in parts:
        minibatch = batch.select(part)
        if pack_tokens is None:
            rows = [lengths[i] for i in part.tolist()]
            for start in range(0, len(rows), optim.micro_batch_size):
                chunk = rows[start : start + optim.micro_batch_size]
                total += len(chunk) * max(chunk)
            continue
        for group in plan_packed_micro_batches(sequence_lengths(minibatch.attention_mask), pack_tokens):
            piece = minibatch.select(group)
            total += sum(shared_prefixes(piece.input_ids, piece.attention_mask, piece.response_mask).needed)
    return total


def _step(setup: dict[str, Any], proximal: str, pack_tokens: int | None) -> dict[str, float]:
    """One `ppo_update` of the recipe from the saved weights and optimizer state; returns its metrics + wall time."""
    from rollhub.trainer.update import ppo_update

    config = setup["config"]
    policy, optimizer = setup["policy"], setup["optimizer"]
    policy.model.load_state_dict(setup["weights"])
    optimizer.load_state_dict(setup["optimizer_state"])
    loss = copy.deepcopy(config.loss)
    loss.proximal = proximal
    started = time.perf_counter()
    out = ppo_update(
        policy,
        optimizer,
        setup["batch"],
        loss,
        minibatches=config.optim.minibatches,
        epochs=config.optim.epochs,
        max_grad_norm=config.optim.max_grad_norm,
        seed=STEP_SEED,
        reference=setup["reference"],
        pack_tokens=pack_tokens,
    )
    out["step_s"] = time.perf_counter() - started
    return out


def _setup(config: Any, model_dir: Path, batch: Any) -> dict[str, Any]:
    import torch

    from rollhub.trainer.build import build_optimizer, build_policy, build_reference

    policy = build_policy(config, model_dir)
    reference = build_reference(config, model_dir, policy)
    optimizer = build_optimizer(policy, config)
    batch.behaviour_logprobs = policy.compute_logprobs(batch)  # on-policy samples: mu = pi
    return {
        "config": config,
        "policy": policy,
        "reference": reference,
        "optimizer": optimizer,
        "batch": batch,
        "weights": {k: v.detach().clone() for k, v in policy.model.state_dict().items()},
        "optimizer_state": copy.deepcopy(optimizer.state_dict()),
        "torch": torch,
    }


# --- memory: one fresh process per mode --------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _memory_child(recipe: str, overrides: list[str], batch_path: str, proximal: str, pack_tokens: Any, queue) -> None:
    import torch

    from rollhub.core.config import load_config
    from rollhub.trainer.config import RunConfig

    torch.set_num_threads(1)
    config = load_config(RunConfig, recipe, overrides)
    batch = torch.load(batch_path, weights_only=False)
    setup = _setup(config, Path(config.model.path), batch)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.001)

    baseline = _rss_bytes()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _step(setup, proximal, pack_tokens)
    done.set()
    sampler.join()
    queue.put(max(peak[0], _rss_bytes()) - baseline)


def _peak_memory_mb(recipe: str, overrides: list[str], batch_path: Path, proximal: str, pack_tokens: Any) -> float:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(
        target=_memory_child, args=(recipe, overrides, str(batch_path), proximal, pack_tokens, queue)
    )
    child.start()
    try:
        grown = queue.get(timeout=600)
    finally:
        child.join(timeout=60)
    return grown / 2**20


# --- 1 vs 2 trainer ranks -------------------------------------------------------------------


def parse_rank_mode(mode: str) -> tuple[int, int, int | None]:
    """`"RxT"` -> (R ranks, T threads per rank, None), e.g. "2x1"; `"RxT@P"` packs to P tokens."""
    shape, at, pack = mode.lower().partition("@")
    try:
        ranks, threads = (int(part) for part in shape.split("x"))
        pack_tokens = int(pack) if at else None
    except ValueError:
        raise ValueError(f"rank mode {mode!r} is not RANKSxTHREADS or RANKSxTHREADS@TOKENS (e.g. 2x1@1024)") from None
    if ranks < 1 or threads < 1:
        raise ValueError(f"rank mode {mode!r} needs at least 1 rank and 1 thread")
    if pack_tokens is not None and pack_tokens < 1:
        raise ValueError(f"rank mode {mode!r}: the packing budget must be >= 1 token")
    return ranks, threads, pack_tokens


def _memory_kb() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in kB; VmHWM is the peak RSS since the last `_reset_peak`."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line.split(":")[0]] = int(line.split()[1])
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def _reset_peak() -> int:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux `clear_refs` 5); returns that RSS in kB.

    Why not a sampling thread: it would wake in every idle worker every millisecond and
    perturb the other modes' timings; the kernel's high-water mark is exact and free.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        logger.warning("cannot reset the peak RSS mark; peak memory includes model loading")
    return _memory_kb()[0]


def _memory_report(baseline_kb: int) -> dict[str, float]:
    rss, peak = _memory_kb()
    return {"peak_mb": peak / 1024, "growth_mb": max(peak - baseline_kb, 0) / 1024, "rss_mb": rss / 1024}


def _rank_worker(spec: dict[str, Any], conn: Any) -> None:
    """One process of a rank mode: a single-process trainer (`ppo_update`), or rank `spec["rank"]` of a group.

    Rank 0 (or the single process) answers the bench's `step` commands with the step's wall
    time; the followers serve rank 0 exactly as in training (`RankGroup.serve`). Every
    process reports its peak RSS over the steps, from its RSS after building its model.
    """
    os.environ["OMP_NUM_THREADS"] = str(spec["threads"])
    import torch

    from rollhub.core.config import load_config
    from rollhub.trainer.build import build_optimizer, build_policy, build_reference
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.update import ppo_update

    torch.set_num_threads(spec["threads"])
    config = load_config(RunConfig, spec["recipe"], spec["overrides"])
    model_dir = Path(config.model.path)
    loss = copy.deepcopy(config.loss)
    loss.proximal = spec["proximal"]
    group = None
    try:
        if spec["world"] > 1:
            from rollhub.trainer.build import sharded_config
            from rollhub.trainer.ranks.group import RankGroup, init_ranks

            os.environ.update(
                RANK=str(spec["rank"]),
                LOCAL_RANK=str(spec["rank"]),
                WORLD_SIZE=str(spec["world"]),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(spec["port"]),
            )
            group = RankGroup(init_ranks("gloo", 600.0, "cpu"))
            baseline = [0]

            def build(payload: dict[str, Any]) -> tuple[Any, Any, Any]:
                policy = build_policy(sharded_config(config), Path(payload["model_dir"]))
                optimizer = build_optimizer(policy, config)
                reference = build_reference(config, Path(payload["reference_dir"]), policy)
                baseline[0] = _reset_peak()
                return policy, optimizer, reference

            if spec["rank"] != 0:
                group.serve(build)
                conn.send(_memory_report(baseline[0]))
                return
            policy, optimizer, reference = build({"model_dir": str(model_dir), "reference_dir": str(model_dir)})
            group.start({"model_dir": str(model_dir), "reference_dir": str(model_dir)})
            group.attach(policy, optimizer, reference)
            update = group.ppo_update
        else:
            policy = build_policy(config, model_dir)
            reference = build_reference(config, model_dir, policy)
            optimizer = build_optimizer(policy, config)
            update = ppo_update
        batch = torch.load(spec["batch_path"], weights_only=False)
        baseline_kb = _reset_peak()
        conn.send("ready")
        while conn.recv() == "step":
            started = time.perf_counter()
            out = update(
                policy,
                optimizer,
                batch,
                loss,
                minibatches=config.optim.minibatches,
                epochs=config.optim.epochs,
                max_grad_norm=config.optim.max_grad_norm,
                seed=STEP_SEED,
                reference=reference,
                pack_tokens=spec["pack_tokens"],
            )
            conn.send({"step_s": time.perf_counter() - started, "loss": float(out["loss"])})
        if group is not None:
            group.stop()
        conn.send(_memory_report(baseline_kb))
    finally:
        if group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


class _RankMode:
    """The processes of one rank mode, started once and driven step by step from the bench."""

    def __init__(self, context: Any, spec: dict[str, Any], ranks: int, threads: int, pack_tokens: int | None) -> None:
        from rollhub.trainer.ranks.launch import free_port

        self.ranks, self.threads, self.pack_tokens = ranks, threads, pack_tokens
        port = free_port() if ranks > 1 else 0
        self.conns, self.procs = [], []
        for rank in range(ranks):
            parent, child = context.Pipe()
            rank_spec = {
                **spec,
                "overrides": [*spec["overrides"], f"model.threads={threads}"],
                "world": ranks,
                "rank": rank,
                "threads": threads,
                "pack_tokens": pack_tokens,
                "port": port,
            }
            proc = context.Process(target=_rank_worker, args=(rank_spec, child), daemon=True)
            proc.start()
            child.close()  # so that a dead worker reads as EOF here, not as a hang
            self.conns.append(parent)
            self.procs.append(proc)

    @property
    def name(self) -> str:
        ranks = f"{self.ranks} rank{'s' if self.ranks > 1 else ''}"
        name = f"{ranks} x {self.threads} thread{'s' if self.threads > 1 else ''}"
        return name if self.pack_tokens is None else f"{name}, packed {self.pack_tokens}"

    def _recv(self, conn: Any, timeout_s: float = 1800.0) -> Any:
        if not conn.poll(timeout_s):
            raise RuntimeError(f"{self.name}: no answer from a worker within {timeout_s:.0f} s")
        try:
            return conn.recv()
        except EOFError:
            codes = [proc.exitcode for proc in self.procs]
            raise RuntimeError(f"{self.name}: a worker died (exit codes {codes}; see its log above)") from None

    def ready(self) -> None:
        self._recv(self.conns[0])

    def step(self) -> dict[str, float]:
        self.conns[0].send("step")
        return self._recv(self.conns[0])

    def finish(self) -> list[dict[str, float]]:
        """Stop the workers; every rank's memory report, rank 0 first."""
        self.conns[0].send("stop")
        reports = [self._recv(conn, 120.0) for conn in self.conns]
        for proc in self.procs:
            proc.join(timeout=60)
        return reports

    def kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join()


def rank_comparison(
    cfg: TrainerBenchConfig, recipe_overrides: list[str], batch_path: Path, real_tokens: int
) -> dict[str, Any]:
    """1 vs 2 trainer ranks on the same recorded batch, each mode in its own processes, interleaved.

    Modes are `cfg.rank_modes` ("RANKSxTHREADS"; default 1x1, 1x2, 2x1). One rank is the
    single-process trainer (`ppo_update`, what `trainer.world_size: 1` runs); N ranks are
    `rollhub.trainer.ranks` as training runs them: gloo, FSDP2-sharded policy, rank 0
    splitting every mini-batch by tokens (`RankGroup.ppo_update`), the others in
    `RankGroup.serve`. A mode with @TOKENS packs its micro-batches (`optim.pack_tokens`); on
    ranks a prompt's rows then stay on one rank and shorter plans are padded.

    Every mode's processes start and build their model first; then one warm-up step and
    `cfg.rounds` timed steps per mode, one mode at a time in turn (the idle modes wait on a
    pipe or inside a gloo receive, using no CPU). The weights are not reset between steps:
    the step's work does not depend on their values, and every mode runs the same batch with
    the same number of optimizer steps. The warm-up step starts from the same weights in every
    mode, so its loss must agree across modes of one micro-batch layout (a check that the ranks
    run the same update; packed mini-batches keep a prompt's rows together, so they are not the
    padded ones). In bf16 (the recipe's `model.dtype`) packed rows meet other neighbours on each
    rank and the loss agrees only to bf16's rounding; in float32 to 1e-4.

    Memory per rank: the kernel's peak RSS (VmHWM, reset after the model is built) over the
    steps, as growth and as the absolute peak; the job's total is the sum over its ranks.

    On one machine the ranks share its cores: this shows what the data-parallel split costs
    and saves against threads on the same cores, not multi-node scaling.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    spec = {
        "recipe": cfg.recipe,
        "overrides": recipe_overrides,
        "batch_path": str(batch_path),
        "proximal": cfg.proximal[0],
    }
    modes = [_RankMode(context, spec, *parse_rank_mode(mode)) for mode in cfg.rank_modes]
    steps: dict[str, list[dict[str, float]]] = {mode.name: [] for mode in modes}
    memory: dict[str, list[dict[str, float]]] = {}
    try:
        for mode in modes:
            mode.ready()
        warm = {mode.name: mode.step() for mode in modes}  # one at a time: allocator, lazy imports
        for _ in range(cfg.rounds):
            for mode in modes:
                steps[mode.name].append(mode.step())
        for mode in modes:
            memory[mode.name] = mode.finish()
    finally:
        for mode in modes:
            mode.kill()
    rows = []
    for mode in modes:
        step_s = _median([s["step_s"] for s in steps[mode.name]])
        per_rank = memory[mode.name]
        rows.append(
            {
                "mode": mode.name,
                "ranks": mode.ranks,
                "threads_per_rank": mode.threads,
                "micro_batches": "padded" if mode.pack_tokens is None else f"packed {mode.pack_tokens}",
                "step_s": step_s,
                "step_s_all": [s["step_s"] for s in steps[mode.name]],
                "tokens_per_s": real_tokens / step_s,
                "first_step_loss": warm[mode.name]["loss"],
                "peak_growth_mb_per_rank": max(r["growth_mb"] for r in per_rank),
                "peak_rss_mb_per_rank": max(r["peak_mb"] for r in per_rank),
                "peak_rss_mb_total": sum(r["peak_mb"] for r in per_rank),
                "memory_per_rank": per_rank,
            }
        )
    for row in rows:
        row["speedup_vs_first"] = rows[0]["step_s"] / row["step_s"]
    return {
        "status": "measured",
        "layout": cfg.layouts[0],
        "proximal": cfg.proximal[0],
        "real_tokens": real_tokens,
        "rows": rows,
        "memory_method": "per rank: VmHWM (kernel peak RSS) over the steps, reset by /proc/self/clear_refs "
        "after the model is built; growth = peak - RSS at the reset",
        "note": "ranks on one machine share its cores: the data-parallel split against threads, not multi-node scaling",
    }


# --- the benchmark -------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _packing_section(
    cfg: TrainerBenchConfig, config: Any, setup: dict[str, Any], layout: str, overrides: list[str], batch_path: Path
) -> list[dict[str, Any]]:
    """Padded vs packed steps of one layout's batch, interleaved; one row per (proximal, micro-batches)."""
    from rollhub.trainer.packing import sequence_lengths
    from rollhub.trainer.update import SPLIT_KEYS

    lengths = sequence_lengths(setup["batch"].attention_mask)
    modes = [(p, None) for p in cfg.proximal] + [(p, budget) for p in cfg.proximal for budget in cfg.pack_tokens]
    timings: dict[tuple[str, Any], list[dict[str, float]]] = {mode: [] for mode in modes}
    _step(setup, modes[0][0], modes[0][1])  # warm-up (allocator, lazy imports)
    for _ in range(cfg.rounds):  # interleaved: every mode once per round
        for mode in modes:
            timings[mode].append(_step(setup, *mode))
    rows = []
    for proximal, budget in modes:
        runs = timings[(proximal, budget)]
        step_s = _median([r["step_s"] for r in runs])
        row: dict[str, Any] = {
            "layout": layout,
            "proximal": proximal,
            "micro_batches": "padded" if budget is None else f"packed {budget}",
            "step_s": step_s,
            "tokens_per_s": sum(lengths) / step_s,
            "forward_tokens": forward_tokens(setup["batch"], config.optim, budget, STEP_SEED),
            "real_tokens": sum(lengths),
        }
        for key in SPLIT_KEYS:
            row[key.removeprefix("split/")] = _median([r.get(key, 0.0) for r in runs])
        if cfg.memory:
            row["peak_mb"] = _peak_memory_mb(cfg.recipe, overrides, batch_path, proximal, budget)
        rows.append(row)
    for row in rows:
        padded = next(r for r in rows if r["proximal"] == row["proximal"] and r["micro_batches"] == "padded")
        row["speedup_vs_padded"] = padded["step_s"] / row["step_s"]
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rollhub.core.config import load_config
    from rollhub.trainer.build import ensure_model
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.packing import sequence_lengths
    from rollhub.trainer.update import SPLIT_KEYS

    cfg, out = bench_setup(TrainerBenchConfig, args, QUICK)
    torch.set_num_threads(1)
    overrides = ["model.threads=1", f"rollout.group_size={cfg.group_size}", f"rollout.groups_per_batch={cfg.groups}"]
    if cfg.model:
        overrides.append(f"model.path={cfg.model}")
    overrides += cfg.recipe_set
    config = load_config(RunConfig, cfg.recipe, overrides)
    model_dir = ensure_model(config)
    overrides.append(f"model.path={model_dir}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    results: dict[str, Any] = {"config": asdict(cfg), "layouts": {}, "memory_method": None}
    rows = []
    # the packing section runs every layout; the ranks section only the first
    layouts = cfg.layouts if "packing" in cfg.sections else cfg.layouts[:1]
    for layout in layouts:
        batch = record_batch(config, tokenizer, layout, cfg.groups, cfg.group_size, cfg.seed)
        lengths = sequence_lengths(batch.attention_mask)
        setup = _setup(config, model_dir, batch)
        batch_path = out / f"batch-{layout}.pt"
        torch.save(setup["batch"], batch_path)
        info: dict[str, Any] = {
            "sequences": len(lengths),
            "length_min": min(lengths),
            "length_median": _median([float(n) for n in lengths]),
            "length_max": max(lengths),
            "real_tokens": sum(lengths),
            "response_tokens": float(batch.response_mask.sum()),
            "rows": [],
        }
        if "packing" in cfg.sections:
            info["rows"] = _packing_section(cfg, config, setup, layout, overrides, batch_path)
            rows += info["rows"]
        results["layouts"][layout] = info
        del setup
        if layout == cfg.layouts[0]:
            ranks_batch = (batch_path, sum(lengths))
    results["memory_method"] = (
        "peak RSS growth over one step in a fresh spawned process per mode, /proc/self/statm sampled every 1 ms"
        if cfg.memory and "packing" in cfg.sections
        else "not measured (memory=false or no packing section)"
    )
    if "ranks" in cfg.sections:
        results["ranks"] = rank_comparison(cfg, overrides, *ranks_batch)
    else:
        results["ranks"] = {"status": "not measured (sections has no ranks)"}
    results["recipe"] = {
        "loss": asdict(config.loss),
        "minibatches": config.optim.minibatches,
        "epochs": config.optim.epochs,
        "micro_batch_size": config.optim.micro_batch_size,
    }
    columns = [
        "layout",
        "proximal",
        "micro_batches",
        "step_s",
        "speedup_vs_padded",
        "tokens_per_s",
        "forward_tokens",
        *[key.removeprefix("split/") for key in SPLIT_KEYS],
    ] + (["peak_mb"] if cfg.memory else [])
    print_table("trainer step: padded vs packed (median of interleaved rounds)", rows, columns)
    for layout, info in results["layouts"].items():
        print(
            f"{layout}: {info['sequences']} sequences, lengths {info['length_min']}-{info['length_max']} "
            f"(median {info['length_median']:.0f})"
        )
    ranks = results["ranks"]
    if ranks["status"] == "measured":
        print_table(
            f"trainer step: ranks ({ranks['layout']}, proximal {ranks['proximal']}; median of interleaved rounds)",
            ranks["rows"],
            [
                "mode",
                "step_s",
                "speedup_vs_first",
                "tokens_per_s",
                "first_step_loss",
                "peak_growth_mb_per_rank",
                "peak_rss_mb_per_rank",
                "peak_rss_mb_total",
            ],
        )
        print(ranks["note"])
    else:
        print(ranks["status"])
    save_json(out / "trainer.json", results)
    return results
