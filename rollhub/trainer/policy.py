"""The trainable policy: a transformers causal LM and per-token log-probs of packed sequences.

A trajectory reaches the trainer as `PackedSequence`s (rollhub/rollout/types.py): the exact token
ids the engine saw, a response mask, and the behaviour log-prob and policy version of each
generated token. `collate` right-pads them into tensors together with per-token
advantages; `Policy.token_logprobs` returns log_softmax(logits / T) of every token given its
prefix, at the same temperature the engine sampled with, so pi_theta, pi_prox and mu are
comparable token by token.

Precision: the weights the optimizer updates are fp32 everywhere (at RL learning rates a
bf16 weight would round most updates away). On CPU everything runs in fp32; on a GPU the
decoder's forward and backward run in bf16: under FSDP2 by its MixedPrecisionPolicy (bf16
compute, fp32 gradient reduction), on one GPU by bf16 autocast around the decoder. The output
head and the log-softmax stay fp32 on every path: bf16 logits would round each log-prob the
importance ratios and the KL divide by, and the head runs on the response positions alone.
Ranks: with `fsdp=True` inside an initialised torch.distributed process group, each decoder
layer and then the root module are wrapped with FSDP2 (`torch.distributed.fsdp.fully_shard`);
parameters stay DTensors, the optimizer is built over them as usual, and
`engine_state_dict()` gathers full tensors for the weight push (rollhub.trainer.ranks
drives the ranks). With several ranks every rank builds the model on the meta device and
allocates its shards only; rank 0 alone reads the checkpoint, into host memory, and sends each
rank its shards (`share_weights`), so no device holds a whole weight outside a forward pass
(but rank 0's, one weight in transit), and a host running N ranks does not hold N copies of the
model. `gradient_checkpointing` recomputes each decoder layer in the backward pass instead of
keeping its activations.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from rollhub.core.errors import UserError

if TYPE_CHECKING:
    from rollhub.trainer.lora import LoraConfig
    from rollhub.trainer.prefix_kv import PrefixKV

logger = logging.getLogger(__name__)


@dataclass
class TokenBatch:
    """Right-padded training tensors, all [batch, time]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    token_versions: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def slice(self, start: int, stop: int) -> TokenBatch:
        """Rows [start, stop), trimmed to their longest real length (saves compute)."""
        length = int(self.attention_mask[start:stop].sum(-1).max().item()) if stop > start else 0
        length = max(length, 1)
        return TokenBatch(*(t[start:stop, :length] for t in self._tensors()))

    def select(self, rows: Sequence[int] | torch.Tensor) -> TokenBatch:
        """The given rows (e.g. a shuffled PPO mini-batch), trimmed like `slice`."""
        index = torch.as_tensor(rows, dtype=torch.long)
        picked = TokenBatch(*(t[index] for t in self._tensors()))
        return picked.slice(0, len(index))

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (
            self.input_ids,
            self.attention_mask,
            self.response_mask,
            self.behaviour_logprobs,
            self.advantages,
            self.token_versions,
        )

    def to(self, device: str | torch.device) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in self._tensors()))


def collate(sequences: Sequence[Any], token_advantages: Sequence[Sequence[float]], pad_token_id: int) -> TokenBatch:
    """Pad `PackedSequence`s (and one advantage per token, 0 outside the response) to a batch."""
    if len(sequences) != len(token_advantages):
        raise ValueError(f"{len(sequences)} sequences but {len(token_advantages)} advantage rows")
    if not sequences:
        raise ValueError("cannot collate an empty batch")
    width = max(len(s.input_ids) for s in sequences)
    batch = len(sequences)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    response = torch.zeros((batch, width), dtype=torch.float32)
    behaviour = torch.zeros((batch, width), dtype=torch.float32)
    advantages = torch.zeros((batch, width), dtype=torch.float32)
    versions = torch.full((batch, width), -1, dtype=torch.long)
    for row, (seq, adv) in enumerate(zip(sequences, token_advantages)):
        n = len(seq.input_ids)
        if len(adv) != n:
            raise ValueError(f"sequence {row}: {n} tokens but {len(adv)} advantages")
        input_ids[row, :n] = torch.tensor(seq.input_ids, dtype=torch.long)
        attention[row, :n] = 1
        response[row, :n] = torch.tensor(seq.response_mask, dtype=torch.float32)
        behaviour[row, :n] = torch.tensor(seq.behaviour_logprobs, dtype=torch.float32)
        advantages[row, :n] = torch.tensor(adv, dtype=torch.float32)
        versions[row, :n] = torch.tensor(seq.token_versions, dtype=torch.long)
    # the first token has no prefix and can never be trained
    response[:, 0] = 0.0
    return TokenBatch(input_ids, attention, response, behaviour, advantages, versions)


def default_device_and_dtype(device: str | None = None, dtype: str | None = None) -> tuple[str, torch.dtype]:
    """cuda + bf16 when a GPU is present, else cpu + fp32; `dtype` ("float32", "bfloat16";
    None or "auto" = that default) overrides the compute dtype on either device."""
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None or dtype == "auto":
        return device, torch.bfloat16 if device.startswith("cuda") else torch.float32
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"compute dtype must be auto, float32 or bfloat16, got {dtype!r}")
    return device, names[dtype]


def token_logprobs_from_logits(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(input_ids[:, t] | prefix) at position t (0 at t = 0), and optionally the entropy there."""
    shifted = logits[:, :-1].float() / temperature
    log_probs = F.log_softmax(shifted, dim=-1)
    picked = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    out = F.pad(picked, (1, 0), value=0.0)
    entropy = None
    if with_entropy:
        ent = -(log_probs.exp() * log_probs).sum(-1)
        entropy = F.pad(ent, (1, 0), value=0.0)
    return out, entropy


def logit_transform(model: Any) -> Any:
    """The transform a model applies to its head's output before returning logits, or None.

    The trainer projects only the response positions (`head(hidden)`), so it must repeat what the
    model's own forward does after its head: Granite divides by `logits_scaling`, Cohere multiplies by
    `logit_scale`, Gemma2/3 soft-cap with `final_logit_softcapping`. Whether this reproduces the
    model's logits is checked on the loaded model (`Policy._check_head_path`); a model whose forward
    does something else runs whole instead.
    """
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    scaling = getattr(config, "logits_scaling", None)
    if isinstance(scaling, (int, float)) and scaling != 1:
        return lambda logits: logits / scaling
    scale = getattr(config, "logit_scale", None)
    if isinstance(scale, (int, float)) and scale != 1 and "cohere" in str(getattr(config, "model_type", "")):
        return lambda logits: logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if isinstance(cap, (int, float)) and cap > 0:
        return lambda logits: torch.tanh(logits / cap) * cap
    return None


def response_positions(batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, position) of every prediction of a response token: token t is predicted at t - 1."""
    return (batch.response_mask[:, 1:] > 0).nonzero(as_tuple=True)


def _scattered(
    batch: TokenBatch,
    logits: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    *,
    with_entropy: bool,
    with_full: bool,
) -> tuple[torch.Tensor, ...]:
    """Log-probs (and entropy) of the response tokens from `logits` at `response_positions`,
    scattered back into the batch's [rows, width] layout (non-response positions are 0); with
    `with_full`, also the whole log-distribution at each response token."""
    log_probs = F.log_softmax(logits, dim=-1)
    picked = log_probs.gather(-1, batch.input_ids[:, 1:][rows, cols].unsqueeze(-1)).squeeze(-1)
    logp = torch.zeros(batch.input_ids.shape, dtype=picked.dtype, device=picked.device)
    logp = logp.index_put((rows, cols + 1), picked)
    entropy = None
    if with_entropy:
        ent = -(log_probs.exp() * log_probs).sum(-1)
        entropy = torch.zeros_like(logp).index_put((rows, cols + 1), ent)
    if with_full:
        return logp, entropy, log_probs
    return logp, entropy


# the model attribute through which the split path runs (see Policy._selected_logits)
_SELECTED_LOGITS = "rollhub_selected_logits"


class Policy:
    """A causal LM being trained, with the helpers the loop needs."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str | None = None,
        temperature: float = 1.0,
        micro_batch_size: int = 8,
        gradient_checkpointing: bool = False,
        fsdp: bool = False,
        dtype: str | None = None,
        share_prefix: bool = False,
        lora: LoraConfig | None = None,
    ):
        from rollhub.inference.models import load_model_and_tokenizer

        if temperature <= 0:
            raise ValueError("the trainer recomputes log_softmax(logits / T); temperature must be > 0")
        # `dtype` is the compute dtype; the parameters (the optimizer's master weights) are fp32
        self.device, self.dtype = default_device_and_dtype(device, dtype)
        # sharded over several ranks: every rank builds the model on the meta device and allocates
        # its shards only; in `share_weights` (collective; RankGroup.attach calls it on every rank)
        # rank 0 alone reads the weights, into host memory, and sends each rank its shards, so no
        # device, rank 0's included, holds more than its shards and one weight in transit, and
        # rank 0's host holds one whole model at a time (not the policy's and the reference's)
        self._weights_pending = fsdp and _world_size() > 1
        if self._weights_pending:
            self.model, self.tokenizer = _model_skeleton(model_path)
            self._logit_transform = logit_transform(self.model)
            self._split_head = True  # until `share_weights` probes the loaded model (on rank 0)
        else:
            self.model, self.tokenizer = load_model_and_tokenizer(model_path, dtype=torch.float32, device=self.device)
            self._logit_transform = logit_transform(self.model)
            # before any wrapper: whether decoder + head (+ the known transform) give the model's own logits
            self._split_head = self._check_head_path()
        if self._split_head:
            setattr(self.model, _SELECTED_LOGITS, self._selected_logits)
        # LoRA (model.lora): adapters injected in place, base frozen; `self.model` stays the same module
        # tree, `self.peft` is peft's wrapper around it (adapter files, switching the adapters off)
        self.lora, self.peft = lora, None
        if lora is not None:
            if fsdp:
                raise UserError("model.lora runs on one trainer process: set trainer.world_size=1 and model.fsdp=false")
            from rollhub.trainer.lora import attach_lora

            self.peft = attach_lora(self.model, lora)
        self.model.train()
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.model_path = Path(model_path)
        self.fsdp = False
        # a batch's common opening runs once per step (rollhub.trainer.prefix_kv); a checkpointed
        # layer would replay its cache update in the backward pass, so the two do not combine
        self.share_prefix = share_prefix and not gradient_checkpointing
        if self.share_prefix:
            from rollhub.trainer.prefix_kv import refuse_length_dependent_rope

            refuse_length_dependent_rope(self.model)
        # rank 0 of a trainer group sets this (RankGroup.attach): it tells the other ranks
        # which collective comes next before this rank enters it
        self.announce: Any = None
        if gradient_checkpointing:
            self._checkpoint_layers()
        if fsdp:
            self._wrap_fsdp2()
            if self._weights_pending:
                self.model.to_empty(device=self.device)  # this rank's shards (and buffers), uninitialised
        elif self.dtype != torch.float32:
            self._autocast_forward()

    @torch.no_grad()
    def _check_head_path(self, model: Any = None) -> bool:
        """Whether `token_logprobs`' fast path (the decoder, then the head on the response positions
        only, then `logit_transform`) reproduces the model's own forward on a probe; if not, the
        trainer runs the whole model, so its log-probs are always those of the model's logits path
        (the engine's), whatever the model does after its head. `model`: the loaded model when it is
        not `self.model` (rank 0 of sharded ranks probes the copy it reads the weights into)."""
        model = self.model if model is None else model
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        head = model.get_output_embeddings()
        if decoder is None or head is None:
            return False
        vocab = int(head.weight.shape[0])
        probe = (torch.arange(1, 9, device=head.weight.device) * 7919 % vocab).unsqueeze(0)
        mask = torch.ones_like(probe)
        model.eval()
        try:
            full = model(input_ids=probe, attention_mask=mask, use_cache=False).logits.float()
            hidden = decoder(input_ids=probe, attention_mask=mask, use_cache=False).last_hidden_state
            split = self._project(head, hidden)
        except Exception as exc:  # an architecture whose decoder takes other arguments
            logger.warning("the trainer runs the whole %s forward: %r", type(model).__name__, exc)
            return False
        finally:
            model.train()
        gap = float((full - split).abs().max())
        if gap > 1e-3 * max(1.0, float(full.abs().max())):
            logger.warning(
                "%s transforms its logits after the head in a way the trainer does not know (gap %.3g): the "
                "trainer runs the whole model's forward, projecting every position (slower, exact)",
                type(model).__name__,
                gap,
            )
            return False
        return True

    def _project(self, head: Any, hidden: torch.Tensor) -> torch.Tensor:
        """The model's logits (fp32, before temperature) from the decoder's last hidden states."""
        logits = head(hidden.to(head.weight.dtype)).float()
        return logits if self._logit_transform is None else self._logit_transform(logits)

    def _selected_logits(self, inputs: dict[str, torch.Tensor], where: Any) -> torch.Tensor:
        """The model's logits (fp32, before temperature) at `where` of the decoder's output only.

        Installed on the model as `_SELECTED_LOGITS`; under FSDP2 it is registered as a forward
        method of the root, so the root's parameters are all-gathered around it, and the head,
        an FSDP module of its own, all-gathers its weight when it is called on the subset.
        """
        hidden = self.model.get_decoder()(**inputs, use_cache=False).last_hidden_state
        return self._project(self.model.get_output_embeddings(), hidden[where])

    def _decoder_layers(self) -> Any:
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        if layers is None:
            raise RuntimeError(f"{type(self.model).__name__} has no model.layers (decoder layers) to wrap")
        return layers

    @contextlib.contextmanager
    def at_temperature(self, temperature: float) -> Iterator[None]:
        """Score at `temperature` inside the block, at the policy's own temperature after it (SFT
        fits demos at 1 whatever temperature RL samples and scores at)."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        before, self.temperature = self.temperature, temperature
        try:
            yield
        finally:
            self.temperature = before

    def _checkpoint_layers(self) -> None:
        """Activation checkpointing per decoder layer: keep only its input, recompute it in backward.

        The layer's `forward` is replaced on the instance (names and state-dict keys unchanged,
        so FSDP2 and the weight push see the same module tree). Non-reentrant checkpointing
        gives parameter gradients even when the layer's input needs none (frozen embeddings).
        """
        import functools

        from torch.utils.checkpoint import checkpoint

        for layer in self._decoder_layers():
            layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)

    def _autocast_forward(self) -> None:
        """Without FSDP: fp32 parameters, bf16 compute (autocast around decoder and head), on one
        GPU or on the CPU (where AMX makes bf16 matrix products faster than fp32 ones)."""
        modules = [self.model]
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        # the head is left in fp32 (it runs on the response positions alone, see token_logprobs):
        # bf16 logits would round every log-prob the importance ratios and the KL use by ~0.03 nat
        modules += [decoder] if decoder is not None else []
        device_type = torch.device(self.device).type
        for module in modules:
            module.forward = torch.autocast(device_type, dtype=self.dtype)(module.forward)

    # --- distributed ------------------------------------------------------------------
    def _wrap_fsdp2(self) -> None:
        """Shard every decoder layer, then the root (FSDP2). Needs torch.distributed initialised."""
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        if not (dist.is_available() and dist.is_initialized()):
            raise UserError(
                "model.fsdp needs trainer ranks: launch with 'torchrun --nproc-per-node N -m rollhub train ...' "
                "or set trainer.world_size: N"
            )
        mp = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
        for layer in self._decoder_layers():
            fully_shard(layer, mp_policy=mp)
        head = self.model.get_output_embeddings()
        if head is not None:
            # the head (and its input) in fp32, as `_autocast_forward` leaves it without FSDP: bf16
            # logits round every log-prob the importance ratios and the KL use. A head tied to the
            # input embedding shares its parameter, so both are one FSDP group (a lookup in fp32
            # costs nothing; the layers cast its output to the compute dtype)
            embedding = self.model.get_input_embeddings()
            tied = embedding is not None and getattr(embedding, "weight", None) is head.weight
            full = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
            fully_shard([embedding, head] if tied else head, mp_policy=full)
        fully_shard(self.model, mp_policy=mp)
        # the root's own parameters (norm, an untied embedding) are all-gathered by its forward
        # hooks, which run for `forward` alone unless a method is registered: the split path
        # (decoder, then the head on the needed positions only) runs through this one
        if self._split_head:
            register_fsdp_forward_method(self.model, _SELECTED_LOGITS)
        # each rank's loss is its share of the GLOBAL mean (the loss normaliser counts every
        # rank's tokens), so the full gradient is the sum over ranks, not FSDP's default mean;
        # sum-reduction with no pre-scaling is also the one gloo can do (it has no PREMUL_SUM)
        from torch.distributed.fsdp import FSDPModule

        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        self.fsdp = True

    @torch.no_grad()
    def share_weights(self) -> None:
        """Collective over the trainer ranks: rank 0 sends every rank (itself too) its shards of the weights.

        Nothing (and no collective) when there is nothing to share: one rank, no FSDP, or shared
        already. Rank 0 reads the checkpoint here, into host memory (and probes the head path
        on it, see `_check_head_path`); each parameter goes by `scatter`, one at a time, each
        rank receiving its own dim-0 chunk (the one `fully_shard` keeps) and nothing more;
        torch's `set_model_state_dict(..., broadcast_from_rank0=True)` would broadcast each
        WHOLE tensor to every rank before sharding it. Buffers (replicated by
        FSDP2, small) are broadcast whole, the non-persistent ones too (the rotary `inv_freq` is
        in no state dict, and built on the meta device it is uninitialised memory after
        `to_empty`). A header first carries rank 0's parameter names and shapes, checked here,
        so ranks that built different models stop with an error instead of exchanging
        misaligned tensors.
        """
        import torch.distributed as dist

        if not self._weights_pending:
            return
        from rollhub.inference.models import load_model_and_tokenizer

        rank, world = dist.get_rank(), dist.get_world_size()
        params = list(self.model.named_parameters())
        buffers = list(self.model.named_buffers())
        layout = ([(name, tuple(p.shape)) for name, p in params], [(name, tuple(b.shape)) for name, b in buffers])
        full: dict[str, torch.Tensor] = {}  # rank 0's weights, on the host
        if rank == 0:
            source = load_model_and_tokenizer(self.model_path, dtype=torch.float32, device="cpu")[0]
            self._split_head = self._check_head_path(source)
            full = {name: t.detach() for name, t in [*source.named_parameters(), *source.named_buffers()]}
            del source
        header = [(self._split_head, layout) if rank == 0 else None]
        dist.broadcast_object_list(header, src=0, device=torch.device(self.device))
        split_head, expected = header[0]
        if expected != layout:
            raise RuntimeError(
                f"rank {rank} built a model whose parameters or buffers differ from rank 0's; every rank must "
                "load the same model folder"
            )
        self._split_head = bool(split_head)
        for name, param in params:
            local = param.to_local() if hasattr(param, "to_local") else param
            rows = param.shape[0]
            chunk = -(-rows // world)  # torch.chunk's size, as FSDP2 splits dim 0
            mine = max(0, min(rows, (rank + 1) * chunk) - rank * chunk)
            if tuple(local.shape) != (mine, *param.shape[1:]):
                raise RuntimeError(f"{name}: rank {rank} holds a {tuple(local.shape)} shard, expected {mine} rows")
            received = torch.empty((chunk, *param.shape[1:]), dtype=local.dtype, device=local.device)
            chunks = None
            if rank == 0:  # one weight at a time on the device, in chunks (views where no copy is needed)
                chunks = []
                for r in range(world):
                    piece = full[name][r * chunk : (r + 1) * chunk]
                    if piece.shape[0] == chunk and piece.device == received.device and piece.is_contiguous():
                        chunks.append(piece)
                    else:
                        chunks.append(received.new_zeros(received.shape))
                        chunks[-1][: piece.shape[0]].copy_(piece)
            dist.scatter(received, chunks, src=0)
            local.copy_(received[:mine])
            del chunks, received
        for name, buffer in buffers:
            if rank == 0:
                buffer.copy_(full[name])
            dist.broadcast(buffer, src=0)
        self._weights_pending = False

    def _check_weights(self) -> None:
        if self._weights_pending:
            raise RuntimeError(
                "this sharded policy has not received its weights from rank 0 yet: every rank calls "
                "RankGroup.attach (Policy.share_weights) before using it"
            )

    # --- log-probs --------------------------------------------------------------------
    def prefix_kv(self, batch: TokenBatch) -> PrefixKV | None:
        """The opening every row of `batch` shares, run once (with gradient if enabled by the caller),
        for `token_logprobs(prefix=...)`; None where it would not pay or the model runs otherwise
        (sharded ranks, a head the split path does not reproduce, a short common opening)."""
        from rollhub.trainer.prefix_kv import MIN_SHARED_TOKENS, PrefixKV, shared_length

        if not self.share_prefix or self.fsdp or not self._split_head:
            return None
        length = shared_length(batch.input_ids, batch.attention_mask, batch.response_mask)
        if length < MIN_SHARED_TOKENS:
            return None
        return PrefixKV.compute(self.model.get_decoder(), batch.input_ids.to(self.device), length)

    def token_logprobs(
        self,
        batch: TokenBatch,
        *,
        with_entropy: bool = False,
        with_full: bool = False,
        packed: bool = False,
        prefix: PrefixKV | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Log-probs (with gradient if enabled by the caller) of every response token of `batch`.

        Only positions that predict a response token go through the output projection: on
        agent prompts the response is a small fraction of the sequence, and the vocabulary
        projection is a large share of a small model's compute. Non-response positions are 0.
        With `with_full`, a third tensor holds the whole log-distribution [n_response, vocab]
        at each response token, in `response_positions(batch)` order (the exact KL needs it).
        With `packed`, the sequences run packed (rollhub.trainer.packing: laid end to end in rows
        as long as the longest, position ids restart per sequence, a block-diagonal causal mask
        keeps them apart, a sequence whose needed tokens another holds runs once): no compute on
        padding, and the outputs keep the padded layout, so the loss code is unchanged.
        With `prefix` (`prefix_kv` of a batch whose rows these are), the rows run from the end of
        their shared opening on, reading its keys and values; the outputs are the same.
        """
        self._check_weights()
        batch = batch.to(self.device)
        if prefix is not None:  # `prefix_kv` gives one only where the split path runs
            rows, cols = response_positions(batch)
            inputs = prefix.inputs(batch.input_ids, batch.attention_mask)
            logits = getattr(self.model, _SELECTED_LOGITS)(inputs, (rows, cols - prefix.length)) / self.temperature
            return _scattered(batch, logits, rows, cols, with_entropy=with_entropy, with_full=with_full)
        if packed:
            return self._packed_token_logprobs(batch, with_entropy=with_entropy, with_full=with_full)
        if not self._split_head:
            # an architecture whose logits the split path does not reproduce: all positions are projected
            out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
            logp, entropy = token_logprobs_from_logits(out.logits, batch.input_ids, self.temperature, with_entropy)
            if not with_full:
                return logp * batch.response_mask, entropy
            rows, cols = response_positions(batch)
            full = F.log_softmax(out.logits[:, :-1][rows, cols].float() / self.temperature, dim=-1)
            return logp * batch.response_mask, entropy, full
        rows, cols = response_positions(batch)
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        # position t predicts token t + 1; response_positions' columns stop before the last one
        logits = getattr(self.model, _SELECTED_LOGITS)(inputs, (rows, cols)) / self.temperature
        return _scattered(batch, logits, rows, cols, with_entropy=with_entropy, with_full=with_full)

    def _packed_token_logprobs(
        self, batch: TokenBatch, *, with_entropy: bool, with_full: bool
    ) -> tuple[torch.Tensor, ...]:
        """`token_logprobs` with the rows packed (see rollhub.trainer.packing)."""
        from rollhub.trainer.packing import pack_rows, packed_model_inputs, shared_prefixes

        # rows whose needed tokens another row already holds run once (exact, see SharedPrefixes)
        shared = shared_prefixes(batch.input_ids, batch.attention_mask, batch.response_mask)
        hosts = torch.as_tensor(shared.hosts, dtype=torch.long, device=batch.input_ids.device)
        needed = torch.as_tensor(shared.needed, dtype=torch.long, device=batch.input_ids.device)
        width = batch.input_ids.shape[1]
        keep = torch.arange(width, device=needed.device).unsqueeze(0) < needed.unsqueeze(1)
        # rows as long as the longest sequence, as a padded micro-batch's: the dense mask's
        # attention cost per row stays what padding costs, the padding itself is filled. Under
        # flash-attention, one row: transformers splits a row into its sequences by the restarting
        # position ids only at batch size 1 (with more rows, a row's sequences would see each
        # other), and the varlen kernel's cost is per sequence, not per row
        flash = str(getattr(self.model.config, "_attn_implementation", "") or "").startswith("flash_attention")
        packed = pack_rows(batch.input_ids[hosts], keep.long(), row_tokens=None if flash else int(needed.max()))
        slot = torch.full((len(batch),), -1, dtype=torch.long, device=hosts.device)
        slot[hosts] = torch.arange(len(hosts), device=hosts.device)
        host_of = slot[torch.as_tensor(shared.host, dtype=torch.long, device=hosts.device)]
        rows, cols = response_positions(batch)
        where = packed.packed_index(host_of[rows], cols)
        if not self._split_head:  # as in the padded path
            out = self.model(**packed_model_inputs(packed, self.model), use_cache=False)
            logits = out.logits[where].float() / self.temperature
        else:
            inputs = packed_model_inputs(packed, self.model.get_decoder())
            logits = getattr(self.model, _SELECTED_LOGITS)(inputs, where) / self.temperature
        return _scattered(batch, logits, rows, cols, with_entropy=with_entropy, with_full=with_full)

    @torch.no_grad()
    def compute_logprobs(
        self, batch: TokenBatch, *, pack_tokens: int | None = None, micro_batches: list[list[int]] | None = None
    ) -> torch.Tensor:
        """Log-probs of the whole batch without gradient, micro-batched (the proximal and the
        reference passes, in one process and on every trainer rank alike).

        With `pack_tokens`, micro-batches are packed to that many tokens (rollhub.trainer.packing)
        instead of `micro_batch_size` padded rows; the result is the same [batch, time] tensor.
        `micro_batches`: the packed plan's rows per micro-batch (None plans them here); a trainer
        rank passes one padded to the count every rank runs, as FSDP2 gathers in every forward.
        """
        width = batch.input_ids.shape[1]
        if pack_tokens is not None:
            from rollhub.trainer.packing import plan_packed_micro_batches, sequence_lengths

            out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
            if micro_batches is None:
                micro_batches = plan_packed_micro_batches(sequence_lengths(batch.attention_mask), pack_tokens)
            for group in micro_batches:
                logp, _ = self.token_logprobs(batch.select(group), packed=True)
                out[torch.as_tensor(group), : logp.shape[1]] = logp.float().cpu()
            return out
        rows = []
        prefix = self.prefix_kv(batch)
        for start in range(0, len(batch), self.micro_batch_size):
            part = batch.slice(start, min(start + self.micro_batch_size, len(batch)))
            logp, _ = self.token_logprobs(part, prefix=prefix)
            rows.append(F.pad(logp.float().cpu(), (0, width - logp.shape[1]), value=0.0))
        return torch.cat(rows, dim=0)

    # --- LoRA ------------------------------------------------------------------------
    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """The base model inside the block (the LoRA policy's KL reference); nothing changes without LoRA."""
        if self.peft is None:
            yield
            return
        with self.peft.disable_adapter():
            yield

    def training_state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps of the model: every weight, or with LoRA the adapters alone (the base
        is the warm-start folder the run reloads)."""
        if self.peft is None:
            return self.model.state_dict()
        from rollhub.trainer.lora import adapter_state_dict

        return adapter_state_dict(self.model)

    def load_training_state(self, state: dict[str, torch.Tensor]) -> None:
        """Put back what `training_state` saved."""
        if self.peft is None:
            self.model.load_state_dict(state)
            return
        from rollhub.trainer.lora import load_adapter_state

        load_adapter_state(self.model, state)

    # --- weights ----------------------------------------------------------------------
    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """Detached CPU copies of the weights (HF names), as the inference engine loads them.

        Under FSDP this is a collective: every rank calls it (rank 0 of a trainer group tells
        the others to, through `announce`), the shards are gathered, and rank 0 gets the full
        state dict while the other ranks get {}. Only rank 0 pushes weights to the engines.
        With LoRA: the merged weights under the base names, the adapter beside them (`LoraWeights`).
        """
        self._check_weights()
        if self.peft is not None:
            from rollhub.trainer.lora import LoraWeights, adapter_files, merged_state_dict

            return LoraWeights(merged_state_dict(self.model), *adapter_files(self.peft, self.lora))
        if self.announce is not None:
            self.announce("engine")
        keep = not self.fsdp or _rank() == 0
        full = {}
        for name, tensor in self.model.state_dict().items():
            if hasattr(tensor, "full_tensor"):  # FSDP2 DTensor: every rank takes part in the gather
                tensor = tensor.full_tensor()
            if keep:
                full[name] = tensor.detach().to("cpu", copy=True)
        return full

    def parameters(self):
        return self.model.parameters()

    def save_pretrained(self, out_dir: str | Path) -> None:
        """An HF checkpoint dir (model + tokenizer) that the engine or `rollhub train` can load.

        Written into a temporary sibling, fsynced and renamed into place (`staged_dir`): a kill
        mid-save leaves the previous folder or none, never a half-written one whose config.json
        would make it look loadable. The folder is replaced as a whole, so one that holds anything
        but a model is refused rather than deleted.
        """
        from rollhub.trainer.checkpoint import staged_dir

        out = Path(out_dir)
        if out.is_dir() and any(out.iterdir()) and not (out / "config.json").is_file():
            raise ValueError(f"{out} is not empty and holds no model; refusing to replace it with one")
        if self.peft is not None:  # the merged model, and the adapter it came from in a subfolder
            from rollhub.trainer.lora import ADAPTER_SUBDIR, tied_duplicates, write_adapter

            state = self.engine_state_dict()
            tied = tied_duplicates(self.model)
            with staged_dir(out) as tmp:
                self.model.save_pretrained(tmp, state_dict={k: v for k, v in state.items() if k not in tied})
                self.tokenizer.save_pretrained(tmp)
                write_adapter(tmp / ADAPTER_SUBDIR, state.adapter, state.adapter_config)
            return
        if self.fsdp:  # gather the shards (collective); rank 0 writes the full weights
            state = self.engine_state_dict()
            if _rank() != 0:
                return
            with staged_dir(out) as tmp:
                self.model.save_pretrained(tmp, state_dict=state)
                self.tokenizer.save_pretrained(tmp)
            return
        with staged_dir(out) as tmp:
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)


def _rank() -> int:
    """This process's rank in the torch.distributed group (0 without one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world_size() -> int:
    """The torch.distributed group's size (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _model_skeleton(model_path: str | Path) -> tuple[Any, Any]:
    """The model of `model_path` on the meta device (shapes, no memory, weights not read) and its tokenizer,
    set up as `load_model_and_tokenizer` sets it up: a follower rank's starting point."""
    from rollhub.inference.models import load_model_and_tokenizer

    return load_model_and_tokenizer(model_path, weights=False)
