"""Data-parallel trainer ranks: rank 0 leads, the others follow its commands.

Rank 0 runs the whole job of rollhub.trainer.loop (rollout, buffer, logging, checkpoints,
evaluation) exactly as a single process does. The other ranks hold only a shard of the
policy (FSDP2, `Policy(fsdp=True)`), its optimizer and the reference policy, and wait in
`serve_followers` for what rank 0 asks of them. Every collective of the job is one command:

  update      rank 0 splits the step's batch across ranks, balanced by tokens, and scatters
              the shards (with the proximal/reference log-probs and the GLOBAL loss
              normaliser of each PPO mini-batch); every rank runs the same `policy_update`
  prox        the no-grad proximal pass over each rank's shard, gathered back to rank 0
  engine      the full state dict for the weight push (`Policy.engine_state_dict`)
  checkpoint  full model and optimizer state on rank 0 (written in the single-process format)
  load        a checkpoint's full state scattered to every rank and sharded again
  stop        leave the loop

Why a leader: generation, envs and the buffer are a single stream; splitting them would make
rollout ordering (and so seeds, resume and logs) depend on the world size. Only the tensor
work is data parallel, and a run with N ranks draws the same tasks as a run with one.

Gradient reduction: each rank's loss is its share of the global mean (the normaliser counts
the whole mini-batch), so the full-batch gradient is the SUM of the ranks' gradients; FSDP2
averages by default, and `Policy._wrap_fsdp2` sets the divide factor to 1.

Every rank must run the same number of forward passes (FSDP2 all-gathers parameters in each
one): shards are padded with empty rows (one token, no response) to the same row count, so
the padded micro-batch plan has the same length everywhere. Packed micro-batches
(`optim.pack_tokens`) plan by tokens, so their count differs per rank: rank 0 plans every
rank's micro-batches and pads the shorter plans with micro-batches of one empty row. The
mini-batches are drawn as the one-process packed step draws them (`prompt_split`), and a
prompt's rows stay on one rank (`split_by_prompt`), so no two ranks run the same prompt.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rollhub.core.errors import UserError
from rollhub.trainer.cli import launched_ranks

logger = logging.getLogger(__name__)

#: torch.distributed's launch variables (set by torchrun, by `launch_local_ranks` and by the Ray actors)
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankContext:
    """Where this process stands in the trainer group."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    backend: str

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the rendezvous of a group started here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def init_ranks(backend: str = "auto", timeout_s: float = 86400.0, device: str = "auto") -> RankContext:
    """Join the process group described by the launch variables (RANK, WORLD_SIZE, MASTER_*).

    gloo on CPU, NCCL when the trainer runs on CUDA. The timeout is long on purpose: the
    followers wait inside a collective while rank 0 generates, evaluates or writes a
    checkpoint, which can take far longer than torch's default of 10-30 minutes.
    """
    missing = [name for name in RANK_ENV if name not in os.environ and name != "LOCAL_RANK"]
    if missing:
        raise UserError(f"trainer ranks need {', '.join(missing)} set (launch with torchrun or trainer.world_size)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    else:
        device = "cpu"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    return RankContext(rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend)


# --- splitting a batch ------------------------------------------------------------------


def split_by_tokens(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Row indices for each of `parts` ranks, with about equal token sums (not equal row counts).

    Longest first, each to the rank with the fewest tokens so far (ties: the lower rank), so
    the largest rank's load is within one sequence of the mean; rows keep their batch order
    inside a part. Deterministic: every run of the same batch splits it the same way.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    loads = [0] * parts
    assigned: list[list[int]] = [[] for _ in range(parts)]
    for row in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        target = min(range(parts), key=lambda p: (loads[p], p))
        assigned[target].append(row)
        loads[target] += int(lengths[row])
    return [sorted(rows) for rows in assigned]


def split_by_prompt(batch: Any, parts: int) -> list[list[int]]:
    """Row indices for each rank with a prompt's rows kept on one rank (the packed update).

    Packing runs a prompt shared by several rows once (`packing.shared_prefixes`); split over
    two ranks, both would run it. Prompt groups are balanced by the tokens their packed forward
    runs (the prompt once, plus each row's tokens after it), longest first, as `split_by_tokens`;
    the cost is read from the lengths, since the rank's own update finds the shared prefixes.
    When whole groups cannot be balanced (fewer groups than ranks, or one group costing more
    than a rank's fair share, e.g. few prompts with many long answers), rows are split one by
    one instead: an idle rank costs more than a prompt run twice.
    """
    from rollhub.trainer.packing import prompt_groups

    groups = prompt_groups(batch.input_ids, batch.response_mask)
    lengths = batch.attention_mask.sum(-1).tolist()
    prompt = batch.response_mask.gt(0).float().argmax(-1).tolist()
    costs = [prompt[rows[0]] + sum(lengths[row] - prompt[row] for row in rows) for rows in groups]
    if len(groups) < parts or max(costs) > sum(costs) / parts:
        return split_by_tokens(lengths, parts)
    return [sorted(row for group in share for row in groups[group]) for share in split_by_tokens(costs, parts)]


def _empty_rows(count: int) -> Any:
    """`count` one-token rows with no response: they add forward passes but no loss and no gradient."""
    from rollhub.trainer.policy import TokenBatch

    width = 1
    input_ids = torch.zeros((count, width), dtype=torch.long)
    attention = torch.ones((count, width), dtype=torch.long)
    zeros = torch.zeros((count, width), dtype=torch.float32)
    versions = torch.full((count, width), -1, dtype=torch.long)
    return TokenBatch(input_ids, attention, zeros.clone(), zeros.clone(), zeros.clone(), versions)


def _pad_to_rows(part: Any, rows: int, extra: Sequence[torch.Tensor | None] = ()) -> tuple[Any, list[Any]]:
    """`part` (a TokenBatch) and its companion [rows, time] tensors padded with empty rows to `rows` rows."""
    from rollhub.trainer.policy import TokenBatch

    missing = rows - len(part)
    if missing <= 0:
        return part, list(extra)
    filler = _empty_rows(missing)
    width = max(part.input_ids.shape[1], 1)

    def widen(tensor: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value)

    pad_values = (0, 0, 0.0, 0.0, 0.0, -1)
    merged = TokenBatch(
        *(
            torch.cat([mine, widen(theirs, value).to(mine.dtype)])
            for mine, theirs, value in zip(part._tensors(), filler._tensors(), pad_values)
        )
    )
    padded_extra = [
        None if t is None else torch.cat([t, torch.zeros((missing, t.shape[1]), dtype=t.dtype)]) for t in extra
    ]
    return merged, padded_extra


@dataclass
class ShardPart:
    """One PPO mini-batch as one rank sees it."""

    batch: Any  # TokenBatch: this rank's rows, padded with empty rows to the common row count
    prox: torch.Tensor | None  # proximal log-probs of those rows (None: the update's own forward)
    reference: torch.Tensor | None  # sampled-token reference log-probs (k3 KL), or None
    normaliser: Any  # BatchNormaliser of the WHOLE mini-batch (all ranks)
    tokens: float  # this rank's response tokens (weights the metrics)
    plan: list[list[int]] | None = None  # packed micro-batches, as many on every rank (pack_tokens)


def plan_parts(
    batch: Any, *, minibatches: int, epochs: int, seed: int, pack_tokens: int | None = None
) -> list[torch.Tensor]:
    """The rows of each PPO mini-batch, in order: exactly the shuffle `ppo_update` draws."""
    from rollhub.trainer.update import minibatch_orders

    if minibatches == 1 and epochs == 1:
        return [torch.arange(len(batch))]
    orders = minibatch_orders(batch, minibatches=minibatches, epochs=epochs, seed=seed, pack_tokens=pack_tokens)
    return [torch.as_tensor(rows) for epoch in orders for rows in epoch]


def shard_parts(
    batch: Any,
    parts: list[torch.Tensor],
    world_size: int,
    *,
    prox: torch.Tensor | None,
    reference: torch.Tensor | None,
    pack_tokens: int | None = None,
) -> list[list[ShardPart]]:
    """For each rank, its share of every mini-batch (token-balanced, padded to equal row counts).

    With `pack_tokens` each share is padded instead to an equal count of packed micro-batches.
    """
    from rollhub.trainer.losses import BatchNormaliser
    from rollhub.trainer.packing import plan_packed_micro_batches, sequence_lengths

    lengths = batch.attention_mask.sum(-1).tolist()
    out: list[list[ShardPart]] = [[] for _ in range(world_size)]
    for rows in parts:
        rows = rows.tolist()
        whole = batch.select(rows)
        normaliser = BatchNormaliser.from_mask(whole.response_mask)
        if pack_tokens is None:
            split = split_by_tokens([lengths[r] for r in rows], world_size)
        else:
            split = split_by_prompt(whole, world_size)
        shares = []
        for local in split:
            picked = [rows[i] for i in local]
            if picked:
                part = batch.select(picked)
                width = part.input_ids.shape[1]
                extra = [None if t is None else t[picked, :width] for t in (prox, reference)]
            else:
                part, extra = _empty_rows(0), [None if t is None else t[:0, :1] for t in (prox, reference)]
            plan = None
            if pack_tokens is not None:
                plan = plan_packed_micro_batches(sequence_lengths(part.attention_mask), pack_tokens) if picked else []
            shares.append((part, extra, plan))
        if pack_tokens is None:
            common = max(max(len(s) for s in split), 1)
        else:
            count = max(max(len(plan) for _, _, plan in shares), 1)
        for rank, (part, extra, plan) in enumerate(shares):
            rows_needed = common if plan is None else len(part) + count - len(plan)
            if plan is not None:  # one empty row per missing micro-batch
                plan = plan + [[len(part) + i] for i in range(count - len(plan))]
            part, (part_prox, part_ref) = _pad_to_rows(part, rows_needed, extra)
            tokens = float(part.response_mask.sum())
            out[rank].append(ShardPart(part, part_prox, part_ref, normaliser, tokens, plan))
    return out


def shard_rows(batch: Any, world_size: int) -> tuple[list[list[int]], list[Any]]:
    """Token-balanced rows of the whole batch per rank, and each rank's padded TokenBatch (the prox pass)."""
    split = split_by_tokens(batch.attention_mask.sum(-1).tolist(), world_size)
    common = max(max(len(s) for s in split), 1)
    shards = []
    for rows in split:
        part = batch.select(rows) if rows else _empty_rows(0)
        shards.append(_pad_to_rows(part, common)[0])
    return split, shards


# --- running a step on this rank --------------------------------------------------------


def run_parts(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    parts: list[ShardPart],
    loss_config: Any,
    *,
    max_grad_norm: float | None,
    reference: Any,
    pack_tokens: int | None = None,
) -> list[dict[str, float]]:
    """This rank's side of a step: one `policy_update` (one optimizer step) per mini-batch."""
    from rollhub.trainer.update import policy_update

    results = []
    for part in parts:
        result = policy_update(
            policy,
            optimizer,
            part.batch,
            part.prox,
            loss_config,
            max_grad_norm=max_grad_norm,
            reference_logprobs=part.reference,
            reference=reference,
            normaliser=part.normaliser,
            pack_tokens=pack_tokens,
            packed_plan=part.plan,
        )
        result["local_tokens"] = part.tokens
        results.append(result)
    return results


def combine_results(per_rank: list[list[dict[str, float]]], response_tokens: float) -> dict[str, float]:
    """One step's metrics from every rank's per-mini-batch results, as `ppo_update` reports them.

    Per mini-batch: the loss is the sum of the ranks' shares (each is a part of the global
    mean), loss metrics are token-weighted means, the gradient norm and the skip flag are
    the same on every rank. Over mini-batches: means, except the counts and timings.
    """
    steps = []
    for index in range(len(per_rank[0])):
        results = [rank_results[index] for rank_results in per_rank]
        merged: dict[str, float] = {}
        # a rank whose share of a small mini-batch is only padding rows reports no loss metrics
        # (no response tokens): merge each name over the ranks that reported it
        for key in dict.fromkeys(k for r in results for k in r):
            if key in ("local_tokens", "response_tokens"):
                continue
            having = [r for r in results if key in r]
            tokens = sum(r.get("local_tokens", 0.0) for r in having)
            if key == "loss":
                merged[key] = sum(r[key] for r in having)
            elif key in ("grad_norm", "skipped_nonfinite") or key.startswith("split/") or key == "micro_batches":
                merged[key] = having[0][key]
            elif tokens > 0:
                merged[key] = sum(r[key] * r.get("local_tokens", 0.0) for r in having) / tokens
            else:
                merged[key] = having[0][key]
        steps.append(merged)
    summed = {"skipped_nonfinite", "micro_batches"}
    names = list(dict.fromkeys(k for step in steps for k in step))
    out = {}
    for key in names:
        values = [step[key] for step in steps if key in step]
        out[key] = sum(values) if key in summed or key.startswith("split/") else sum(values) / len(values)
    out["response_tokens"] = response_tokens
    out["optimizer_steps"] = float(len(steps)) - out.get("skipped_nonfinite", 0.0)
    return out


# --- leader and followers -----------------------------------------------------------------


class RankGroup:
    """The trainer's process group as rank 0 drives it (and as the followers answer it)."""

    def __init__(self, context: RankContext):
        self.context = context
        self.policy: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.reference: Any = None
        self._stopped = False

    @property
    def world_size(self) -> int:
        return self.context.world_size

    def attach(self, policy: Any, optimizer: torch.optim.Optimizer | None, reference: Any = None) -> None:
        """The shard this rank trains; on rank 0 the policy also announces its collectives through us."""
        self.policy, self.optimizer, self.reference = policy, optimizer, reference
        if self.context.is_leader:
            policy.announce = self.announce

    # --- messages -------------------------------------------------------------------------
    def announce(self, command: str, per_rank: list[Any] | None = None) -> Any:
        """Rank 0: tell every rank what comes next (`per_rank[r]` goes to rank r); returns rank 0's part."""
        payloads = per_rank if per_rank is not None else [None] * self.world_size
        messages = [(command, payload) for payload in payloads]
        received: list[Any] = [None]
        dist.scatter_object_list(received, messages, src=0)
        return received[0][1]

    def _receive(self) -> tuple[str, Any]:
        received: list[Any] = [None]
        dist.scatter_object_list(received, None, src=0)
        return received[0]

    def _gather(self, value: Any) -> list[Any] | None:
        out = [None] * self.world_size if self.context.is_leader else None
        dist.gather_object(value, out, dst=0)
        return out

    # --- commands, rank 0's side -----------------------------------------------------------
    def start(self, payload: dict[str, Any]) -> None:
        """Send the followers what to build (model folders), once, before any other command."""
        self.announce("start", [payload] * self.world_size)

    def ppo_update(
        self,
        policy: Any,
        optimizer: torch.optim.Optimizer,
        batch: Any,
        loss_config: Any,
        *,
        minibatches: int = 1,
        epochs: int = 1,
        max_grad_norm: float | None = 1.0,
        seed: int = 0,
        reference: Any = None,
        pack_tokens: int | None = None,
    ) -> dict[str, float]:
        """`rollhub.trainer.update.ppo_update` over all ranks: same shuffle, same loss, same result."""
        if minibatches < 1 or epochs < 1:
            raise ValueError("minibatches and epochs must be >= 1")
        if loss_config.kl_coef > 0 and reference is None:
            raise ValueError("loss.kl_coef > 0 needs a reference policy")
        sampled_kl = loss_config.kl_coef > 0 and loss_config.kl_estimator == "k3"
        reference_logprobs = reference.compute_logprobs(batch) if sampled_kl else None  # replicated: local
        single = minibatches == 1 and epochs == 1
        if loss_config.proximal == "behaviour":
            prox = batch.behaviour_logprobs * batch.response_mask
        elif single:
            prox = None
        else:
            prox = self.proximal_logprobs(batch)
        parts = plan_parts(batch, minibatches=minibatches, epochs=epochs, seed=seed, pack_tokens=pack_tokens)
        shards = shard_parts(
            batch, parts, self.world_size, prox=prox, reference=reference_logprobs, pack_tokens=pack_tokens
        )
        options = {"max_grad_norm": max_grad_norm, "loss_config": loss_config, "pack_tokens": pack_tokens}
        mine = self.announce("update", [(rank_parts, options) for rank_parts in shards])
        local = run_parts(
            policy,
            optimizer,
            mine[0],
            loss_config,
            max_grad_norm=max_grad_norm,
            reference=reference,
            pack_tokens=pack_tokens,
        )
        gathered = self._gather(local)
        return combine_results(gathered, float(batch.response_mask.sum()))

    def proximal_logprobs(self, batch: Any) -> torch.Tensor:
        """pi_prox of every row, each rank scoring its token-balanced share."""
        rows, shards = shard_rows(batch, self.world_size)
        mine = self.announce("prox", shards)
        gathered = self._gather(self.policy.compute_logprobs(mine))
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for rank_rows, logp in zip(rows, gathered):
            if rank_rows:
                width = min(logp.shape[1], out.shape[1])
                out[torch.as_tensor(rank_rows), :width] = logp[: len(rank_rows), :width]
        return out

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Full model and optimizer state on rank 0, in the single-process checkpoint format."""
        self.announce("checkpoint")
        return full_training_state(self.policy.model, self.optimizer)

    def reset_reference(self) -> None:
        """Every rank's KL anchor becomes the current (sharded) policy, gathered whole (loss.reference_reset_every)."""
        self.announce("reset_reference")
        reset_reference_weights(self.policy.model, self.reference)

    def load_reference(self, state: dict[str, torch.Tensor]) -> None:
        """A checkpoint's KL anchor (read on rank 0) into every rank's reference."""
        self.announce("load_reference", [state] * self.world_size)
        self.reference.model.load_state_dict(state)

    def load_state(self, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None) -> None:
        """A checkpoint's full state (read on rank 0) onto every rank's shard."""
        self.announce("load", [(model_state, optimizer_state)] * self.world_size)
        load_training_state(self.policy.model, self.optimizer, model_state, optimizer_state)

    def stop(self) -> None:
        """Release the followers (idempotent).

        The barrier after `stop` makes the last message complete on every rank before any rank
        destroys its group. (It did not, alone, end the rare exit abort of followers: that came
        after their group was destroyed, see `end_follower_process`.)
        """
        if not self._stopped and dist.is_initialized():
            self._stopped = True
            self.announce("stop")
            dist.barrier()

    # --- the followers -----------------------------------------------------------------------
    def serve(self, build: Callable[[dict[str, Any]], tuple[Any, Any, Any]]) -> None:
        """A follower's whole life: build the shard when told, then answer commands until `stop`."""
        while True:
            command, payload = self._receive()
            if command == "stop":
                dist.barrier()  # rank 0's side is in `stop`
                return
            if command == "start":
                self.attach(*build(payload))
            elif command == "update":
                parts, options = payload
                self._gather(
                    run_parts(
                        self.policy,
                        self.optimizer,
                        parts,
                        options["loss_config"],
                        max_grad_norm=options["max_grad_norm"],
                        reference=self.reference,
                        pack_tokens=options.get("pack_tokens"),
                    )
                )
            elif command == "prox":
                self._gather(self.policy.compute_logprobs(payload))
            elif command == "engine":
                self.policy.engine_state_dict()
            elif command == "checkpoint":
                full_training_state(self.policy.model, self.optimizer)
            elif command == "load":
                load_training_state(self.policy.model, self.optimizer, *payload)
            elif command == "reset_reference":
                reset_reference_weights(self.policy.model, self.reference)
            elif command == "load_reference":
                self.reference.model.load_state_dict(payload)
            else:
                raise RuntimeError(f"unknown trainer command {command!r} from rank 0")


# --- full state <-> shards ----------------------------------------------------------------


def _optimizer_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter name of each optimizer slot, in the order `optimizer.state_dict()` numbers them."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_training_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Collective: rank 0 gets full CPU model and optimizer state, numbered like a single process's.

    Because the format is the single-process one, a checkpoint written by N ranks resumes on
    any number of ranks (or on none), and a single-process checkpoint resumes on N ranks.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer if optimizer is not None else [], options=options)
    if dist.get_rank() != 0:
        return {}, {}
    if optimizer is None:
        return model_state, {}
    index = {name: i for i, name in enumerate(_optimizer_names(model, optimizer))}
    numbered = {
        "state": {index[name]: value for name, value in optim_state.get("state", {}).items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]} for group in optim_state["param_groups"]
        ],
    }
    return model_state, numbered


def reset_reference_weights(model: torch.nn.Module, reference: Any) -> None:
    """Collective: the full policy weights (all-gathered, on every rank) become this rank's
    unsharded reference policy."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    reference.model.load_state_dict(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))


def load_training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
) -> None:
    """Every rank: shard a full (single-process format) state into this rank's model and optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    options = StateDictOptions(full_state_dict=True)
    if optimizer is None or not optimizer_state:
        set_state_dict(model, [], model_state_dict=model_state, optim_state_dict={}, options=options)
        return
    names = _optimizer_names(model, optimizer)
    named = {
        "state": {names[int(i)]: value for i, value in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [names[int(i)] for i in group["params"]]} for group in optimizer_state["param_groups"]
        ],
    }
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=named, options=options)


# --- launching the ranks --------------------------------------------------------------------


def sharded_config(config: Any) -> Any:
    """`config` with model.fsdp on: with ranks the policy is always FSDP2-sharded (gradients are
    reduced by FSDP). A copy, so the run's saved config.json still says what the user chose."""
    import dataclasses

    return dataclasses.replace(config, model=dataclasses.replace(config.model, fsdp=True))


def _build_follower(config: Any, payload: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A follower's shard: the same policy, optimizer and reference rank 0 builds (rollhub.trainer.build)."""
    from pathlib import Path

    from rollhub.trainer.build import build_optimizer, build_policy, build_reference

    policy = build_policy(sharded_config(config), Path(payload["model_dir"]))
    optimizer = build_optimizer(policy, config)
    reference = build_reference(config, Path(payload["reference_dir"]), policy)
    return policy, optimizer, reference


def run_rank(config: Any, *, resume: bool, progress: bool = True, print_fn: Callable[[str], None] = print) -> Any:
    """This process as one trainer rank (launch variables set): rank 0 runs the job, the others serve it.

    Returns rank 0's TrainingSummary, None on the other ranks. On success rank 0 releases the
    followers; on an error it does not try to (they may be inside a collective that will never
    complete): its exit ends them (torchrun stops the group, local ranks die with their parent,
    the Ray driver kills the actor group).
    """
    import asyncio

    from rollhub.trainer.loop import run_training

    context = init_ranks(config.trainer.backend, config.trainer.collective_timeout_s, config.model.device)
    if config.trainer.world_size not in (1, context.world_size):
        raise UserError(
            f"trainer.world_size={config.trainer.world_size} but the launcher started {context.world_size} ranks; "
            "set one of them"
        )
    torch.set_num_threads(config.model.threads)
    group = RankGroup(context)
    if not context.is_leader:
        try:
            group.serve(lambda payload: _build_follower(config, payload))
        finally:
            dist.destroy_process_group()
        return None
    summary = asyncio.run(run_training(config, resume=resume, progress=progress, print_fn=print_fn, ranks=group))
    group.stop()
    dist.destroy_process_group()
    return summary


def end_follower_process(code: int = 0) -> None:
    """End a follower rank's process now, after its group was destroyed, skipping interpreter teardown.

    Why not a normal exit: gloo's C++ objects (store client, transport threads) are finalised
    with the interpreter, and a follower whose rank 0 has already gone occasionally dies there
    with `terminate called without an active exception` (SIGABRT, exit 134) although all its
    work, `destroy_process_group` included, had finished: seen once in ~90 two-rank runs on
    this machine, and once in CI. Nothing is left to finalise that matters, so stdio and
    logging are flushed and the process ends with `os._exit`.
    """
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the process that started it dies (even by SIGKILL)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable; a killed rank 0 leaves this rank to its timeout")


#: the followers' entry: a fresh interpreter (not a multiprocessing child, so rank 0 may itself
#: be a daemonic process); argv[1] is the run folder, only so that `ps` shows whose rank it is
_FOLLOWER_CODE = "from rollhub.trainer.distributed import local_follower_main; local_follower_main()"
PARENT_ENV = "ROLLHUB_RANK_PARENT"


def local_follower_main() -> None:
    """Entry of a follower process started by `train_with_local_ranks` (config pickled on stdin)."""
    import pickle
    import sys

    _die_with_parent()
    if str(os.getppid()) != os.environ.get(PARENT_ENV):  # the parent died before the death signal was armed
        os._exit(1)
    config = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run_rank(config, resume=False, progress=False)
    end_follower_process(0)


def train_with_local_ranks(config: Any, *, resume: bool, progress: bool = True, print_fn=print) -> Any:
    """`trainer.world_size: N` on one machine: this process is rank 0, N - 1 new processes follow.

    The followers are killed with this process whatever ends it (PR_SET_PDEATHSIG), so a
    SIGKILLed run leaves no rank behind; `rollhub train --resume` starts a new group.
    """
    import pickle
    import subprocess
    import sys

    world = config.trainer.world_size
    port = free_port()
    launch = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    followers = []
    for rank in range(1, world):
        env = {**os.environ, **launch, "RANK": str(rank), "LOCAL_RANK": str(rank), PARENT_ENV: str(os.getpid())}
        proc = subprocess.Popen(
            [sys.executable, "-c", _FOLLOWER_CODE, str(config.run_dir)], stdin=subprocess.PIPE, env=env
        )
        proc.stdin.write(pickle.dumps(config))
        proc.stdin.close()
        followers.append(proc)
    saved = {name: os.environ.get(name) for name in RANK_ENV}
    os.environ.update(launch, RANK="0", LOCAL_RANK="0")
    try:
        summary = run_rank(config, resume=resume, progress=progress, print_fn=print_fn)
        codes = [proc.wait(timeout=60) for proc in followers]
        if any(codes):
            raise RuntimeError(f"trainer ranks exited with {codes} (see their logs above)")
        return summary
    finally:
        for proc in followers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if dist.is_initialized():
            dist.destroy_process_group()


def train_on_ranks(config: Any, *, resume: bool, progress: bool = True, print_fn=print) -> Any:
    """`rollhub train` with ranks: under a launcher (torchrun, a Ray actor), or starting them itself.

    Returns rank 0's TrainingSummary, None on the other ranks.
    """
    if launched_ranks():
        return run_rank(config, resume=resume, progress=progress, print_fn=print_fn)
    if config.cluster.backend == "ray":
        from rollhub.trainer.ray_group import train_with_ray_actors

        return train_with_ray_actors(config, resume=resume)
    return train_with_local_ranks(config, resume=resume, progress=progress, print_fn=print_fn)
