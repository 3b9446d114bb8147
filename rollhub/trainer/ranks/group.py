"""Data-parallel trainer ranks: rank 0 leads, the others follow its commands.

Rank 0 runs the whole job (rollhub.trainer.job: rollout, buffer, logging, checkpoints,
evaluation) exactly as a single process does. The other ranks hold only a shard of the
policy (FSDP2, `Policy(fsdp=True)`), its optimizer and a shard of the frozen reference policy,
and wait in `RankGroup.serve` for what rank 0 asks of them. Only rank 0 reads the checkpoint:
`attach`, which every rank calls once it has built its still empty shards, hands each rank its
part of the weights rank 0 read (`Policy.share_weights`). Every collective of the job is one command:

  update      rank 0 splits the step's batch across ranks, balanced by tokens, and scatters
              the shards (with the proximal/reference log-probs and the GLOBAL loss
              normaliser of each PPO mini-batch; rollhub.trainer.ranks.sharding); every rank
              runs the same `policy_update`
  prox        the no-grad proximal pass over each rank's shard, gathered back to rank 0
  ref         the same for the reference policy's log-probs (sampled KL estimators)
  engine      the full state dict for the weight push (`Policy.engine_state_dict`)
  checkpoint  full model and optimizer state on rank 0 (written in the single-process format)
  load        a checkpoint's full state scattered to every rank and sharded again
  stop        leave the loop

Why a leader: generation, envs and the buffer are a single stream; splitting them would make
rollout ordering (and so seeds, resume and logs) depend on the world size. Only the tensor
work is data parallel, and a run with N ranks draws the same tasks as a run with one.

Messages (commands and their payloads, results gathered back) travel as pickled objects over
a gloo group on the CPU: on the NCCL group torch would stage every pickled message on the
GPU, so a checkpoint's full state sent to N ranks would sit N times in GPU 0's memory. A
payload every rank gets alike (`start`, `load`) is pickled once and broadcast, not scattered
as N copies.

Gradient reduction: each rank's loss is its share of the global mean (the normaliser counts
the whole mini-batch), so the full-batch gradient is the SUM of the ranks' gradients; FSDP2
averages by default, and `Policy._wrap_fsdp2` sets the divide factor to 1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rollhub.core.errors import UserError
from rollhub.trainer.ranks.sharding import ShardPart, combine_results, score_shard, shard_parts, shard_rows

logger = logging.getLogger(__name__)

RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankContext:
    """Where this process stands in the trainer group."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    backend: str
    # every collective's timeout, the side group's too: followers wait in one while rank 0 alone runs SFT,
    # generates or evaluates, so it must cover the longest rank-0-only phase (trainer.collective_timeout_s)
    timeout_s: float = 86400.0

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


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
    if world > 1 and device.startswith("cuda:"):
        # every rank would build its shard on that one GPU (and NCCL refuses two ranks on one GPU)
        raise UserError(
            f"model.device={device} with {world} trainer ranks: each rank takes the GPU of its local rank; "
            "set model.device=cuda (and CUDA_VISIBLE_DEVICES to choose the GPUs)"
        )
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
    return RankContext(
        rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend, timeout_s=timeout_s
    )


def control_group(timeout_s: float = 86400.0) -> Any:
    """The group messages travel on: the default one when it is gloo, else a gloo group of the
    same ranks (collective: every rank must call it, in the same order). See the module docstring.
    It gets the default group's timeout: torch's own default for a new group (30 minutes) is
    shorter than a rank-0-only phase, and a follower waiting in it would be killed mid-run."""
    if not dist.is_initialized() or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


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
            micro_batches=part.micro_batches,
        )
        result["local_tokens"] = part.tokens
        results.append(result)
    return results


# --- leader and followers -----------------------------------------------------------------


class RankGroup:
    """The trainer's process group as rank 0 drives it (and as the followers answer it)."""

    def __init__(self, context: RankContext):
        self.context = context
        self.policy: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.reference: Any = None
        self._stopped = False
        self.control_group = control_group(
            context.timeout_s
        )  # collective: every rank builds its RankGroup at the same point

    @property
    def world_size(self) -> int:
        return self.context.world_size

    def attach(self, policy: Any, optimizer: torch.optim.Optimizer | None, reference: Any = None) -> None:
        """The shard this rank trains; on rank 0 the policy also announces its collectives through us.

        Collective the first time: every rank attaches its newly built policy and reference (rank 0
        after `start`, the followers when `start` reaches them), and each receives its shards of
        the weights rank 0 read. The reference is frozen: no gradient is ever asked of it.
        """
        for model in (policy, reference):
            share = getattr(model, "share_weights", None)
            if share is not None:
                share()
        if reference is not None:
            reference.model.requires_grad_(False)
        self.policy, self.optimizer, self.reference = policy, optimizer, reference
        if self.context.is_leader:
            policy.announce = self.announce

    # --- messages -------------------------------------------------------------------------
    def announce(self, command: str, per_rank: list[Any] | None = None) -> Any:
        """Rank 0: tell every rank what comes next (`per_rank[r]` goes to rank r); returns rank 0's part.

        One broadcast carries the command, and the payload when every rank gets the same object
        (`per_rank` None, or one object repeated): pickled once. Otherwise a scatter follows."""
        shared = per_rank is None or all(payload is per_rank[0] for payload in per_rank)
        header = [(command, shared, (per_rank[0] if per_rank else None) if shared else None)]
        dist.broadcast_object_list(header, src=0, group=self.control_group)
        if shared:
            return header[0][2]
        received: list[Any] = [None]
        dist.scatter_object_list(received, list(per_rank or []), src=0, group=self.control_group)
        return received[0]

    def _receive(self) -> tuple[str, Any]:
        header: list[Any] = [None]
        dist.broadcast_object_list(header, src=0, group=self.control_group)
        command, shared, payload = header[0]
        if shared:
            return command, payload
        received: list[Any] = [None]
        dist.scatter_object_list(received, None, src=0, group=self.control_group)
        return command, received[0]

    def _gather(self, value: Any) -> list[Any] | None:
        out = [None] * self.world_size if self.context.is_leader else None
        dist.gather_object(value, out, dst=0, group=self.control_group)
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
        """`rollhub.trainer.update.ppo_update` over all ranks: the same step plan, each mini-batch split
        across ranks; same shuffle, same loss, same result."""
        from rollhub.trainer.update import plan_step, proximal_logprobs

        plan = plan_step(
            batch,
            loss_config,
            minibatches=minibatches,
            epochs=epochs,
            seed=seed,
            pack_tokens=pack_tokens,
            micro_batch_size=policy.micro_batch_size,
            ranks=True,
        )
        if loss_config.kl_coef > 0 and reference is None:
            raise ValueError("loss.kl_coef > 0 needs a reference policy")
        sampled_kl = loss_config.kl_coef > 0 and loss_config.kl_estimator != "full"
        # scored as one process scores them: `Policy.compute_logprobs` with the step's packing
        reference_logprobs = self.reference_logprobs(batch, pack_tokens=pack_tokens) if sampled_kl else None
        prox = proximal_logprobs(plan, batch, lambda rows: self.proximal_logprobs(rows, pack_tokens=pack_tokens))
        shards = shard_parts(batch, plan, self.world_size, prox=prox, reference=reference_logprobs)
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

    def proximal_logprobs(self, batch: Any, *, pack_tokens: int | None = None) -> torch.Tensor:
        """pi_prox of every row, each rank scoring its token-balanced share."""
        return self._scored("prox", batch, pack_tokens)

    def reference_logprobs(self, batch: Any, *, pack_tokens: int | None = None) -> torch.Tensor:
        """The reference policy's log-probs of every row (sampled KL), each rank scoring its share."""
        if self.reference is None:
            raise ValueError("loss.kl_coef > 0 needs a reference policy (attach one)")
        return self._scored("ref", batch, pack_tokens)

    def _scored(self, command: str, batch: Any, pack_tokens: int | None = None) -> torch.Tensor:
        """No-grad log-probs of every row of `batch` by the policy ("prox") or the reference ("ref"),
        each rank scoring its share (`shard_rows`: padded rows, or packed micro-batches as the one
        process packs them, as many on every rank), gathered on rank 0."""
        rows, shards = shard_rows(batch, self.world_size, pack_tokens=pack_tokens)
        mine = self.announce(command, shards)
        model = self.policy if command == "prox" else self.reference
        gathered = self._gather(score_shard(model, mine))
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
                self._gather(score_shard(self.policy, payload))
            elif command == "ref":
                self._gather(score_shard(self.reference, payload))
            elif command == "engine":
                self.policy.engine_state_dict()
            elif command == "checkpoint":
                full_training_state(self.policy.model, self.optimizer)
            elif command == "load":
                load_training_state(self.policy.model, self.optimizer, *payload)
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
