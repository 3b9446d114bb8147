"""How much GPU memory a run needs, worked out from the model's config before anything loads.

An out-of-memory error minutes into a run (after the model loaded, the engine started and the
first batch was generated) costs the user those minutes and says nothing about which knob to
turn. The plan adds up, per trainer GPU, what the run will hold at its peak:

* weights, gradients and AdamW's two moments: parameters and optimiser state stay fp32 here
  (the compute autocasts), so full-parameter training costs 4 + 4 + 8 = 16 bytes per trainable
  parameter, the figure the ZeRO paper gives for mixed-precision Adam; FSDP ranks split all
  three evenly;
* with LoRA (`model.lora`) gradients and AdamW moments only for the adapters (rank x (in + out)
  per targeted linear layer, fp32) beside the frozen fp32 base;
* the frozen KL reference (only with `loss.kl_coef > 0`), sharded like the policy; none with LoRA,
  whose reference is the same model with its adapters off;
* the activations one micro-batch keeps for the backward pass (every layer's, or with
  activation checkpointing only each layer's input plus one layer's), and its logits;
* an engine sharing the GPU (`engine.share_gpu`): SGLang's static share of the whole card,
  or the in-process engine's weights plus its KV cache at full batch and context;
* one weight-push bucket, and the CUDA context.

A plan that does not fit is refused with the knobs that would make it fit, each tried alone
and then together. The numbers are estimates: the activation term is calibrated against the
tensors autograd really saves (tests compare it on the CPU), the rest is exact arithmetic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.trainer.lora import DEFAULT_TARGETS

GIB = 1024**3
#: CUDA context, cuBLAS workspaces and the allocator's slack, per process
CUDA_OVERHEAD_BYTES = int(1.0 * GIB)
#: a plan must leave this share of the card free for fragmentation
FRAGMENTATION_MARGIN = 0.05
#: the LoRA rank a plan that does not fit tries (with the default target modules)
DEFAULT_LORA_RANK = 16
#: the card a plan assumes when none is present and `trainer.gpu_memory_gib` is unset (H100 80 GB)
DEFAULT_GPU_MEMORY_GIB = 79.6


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that set its memory, from its config.json."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False  # Qwen3 normalises each head's query and key

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """Llama, Qwen2/2.5/3, Mistral and SmolLM2 configs (the `text_config` of a multimodal one)."""
        config = config.get("text_config", config)
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            return cls(
                layers=int(config["num_hidden_layers"]),
                hidden=hidden,
                intermediate=int(config["intermediate_size"]),
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                vocab=int(config["vocab_size"]),
                tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
                qk_norm=config.get("model_type") == "qwen3",
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"the model config lacks a decoder dimension the memory plan needs: {exc}") from None

    @classmethod
    def read(cls, model_dir: str | Path) -> ModelShape:
        path = Path(model_dir) / "config.json"
        try:
            return cls.from_config(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read {path} for the memory plan: {exc}") from None

    def parameters(self) -> int:
        """Parameter count: embeddings, per layer attention + SwiGLU MLP + two norms, final norm, head."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        if self.attention_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        per_layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * per_layer + self.hidden + head

    def lora_parameters(self, rank: int, targets: tuple[str, ...]) -> int:
        """Adapter parameters: rank x (in + out) for each targeted linear layer of every decoder layer
        (names this shape does not know count nothing)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        dims = {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        return self.layers * sum(rank * sum(dims[t]) for t in set(targets) if t in dims)

    def layer_activation_elements(self) -> int:
        """Elements one token keeps for the backward pass in one decoder layer: the two norms'
        inputs and outputs, q/k/v before and after rotary embedding, attention's output, and the
        MLP's gate, up, activation and product (calibrated against autograd's saved tensors)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 4 * self.hidden + 4 * q + 4 * kv + 5 * self.intermediate

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class PlanInputs:
    """The knobs of a run that move its memory; `memory_plan_inputs` reads them from a RunConfig."""

    shape: ModelShape
    gpu_memory_bytes: int
    ranks: int = 1
    trainable_fraction: float = 1.0  # share of parameters the optimiser updates (frozen embeddings)
    compute_bytes: int = 2  # activations: 2 under bf16 autocast, 4 in fp32
    micro_batch_rows: int = 16
    context_tokens: int = 2048
    packed_tokens: int | None = None  # optim.pack_tokens: tokens per forward instead of rows x context
    # sampled tokens per row (the head runs on these positions only); null = every position
    response_tokens: int | None = None
    gradient_checkpointing: bool = False
    kl_reference: bool = False
    lora_rank: int | None = None  # model.lora.rank; None = full fine-tuning
    lora_targets: tuple[str, ...] = ()
    engine: str = "none"  # none | sglang_shared | inprocess
    engine_mem_fraction: float = 0.3
    engine_batch: int = 64
    push_bucket_bytes: int = 0


@dataclass
class MemoryPlan:
    inputs: PlanInputs
    items: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.items.values())

    @property
    def capacity_bytes(self) -> int:
        return int(self.inputs.gpu_memory_bytes * (1 - FRAGMENTATION_MARGIN))

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def table(self) -> str:
        i = self.inputs
        lines = [
            f"memory plan per GPU ({i.shape.parameters() / 1e9:.2f}B parameters, {i.ranks} trainer rank(s), "
            f"{i.gpu_memory_bytes / GIB:.1f} GiB card):"
        ]
        lines += [f"  {name:<28} {nbytes / GIB:8.2f} GiB" for name, nbytes in self.items.items()]
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(
            f"  {'total':<28} {self.total_bytes / GIB:8.2f} GiB of {self.capacity_bytes / GIB:.2f} usable: {verdict}"
        )
        return "\n".join(lines)


def plan_memory(inputs: PlanInputs) -> MemoryPlan:
    """Peak bytes per trainer GPU, by component (see the module docstring for each term)."""
    shape, ranks = inputs.shape, inputs.ranks
    params = shape.parameters()
    trainable = int(params * inputs.trainable_fraction)
    plan = MemoryPlan(inputs)
    plan.items["weights (fp32)"] = math.ceil(4 * params / ranks)
    if inputs.lora_rank is not None:  # the base frozen: gradients and moments of the adapters alone
        trainable = shape.lora_parameters(inputs.lora_rank, inputs.lora_targets)
        plan.items["LoRA adapters (fp32)"] = math.ceil(4 * trainable / ranks)
    plan.items["gradients (fp32)"] = math.ceil(4 * trainable / ranks)
    plan.items["AdamW moments (fp32)"] = math.ceil(8 * trainable / ranks)
    if inputs.kl_reference and inputs.lora_rank is None:  # LoRA's reference: its adapters switched off
        plan.items["KL reference (fp32)"] = math.ceil(4 * params / ranks)
    tokens = inputs.packed_tokens or inputs.micro_batch_rows * inputs.context_tokens
    per_layer = tokens * shape.layer_activation_elements() * inputs.compute_bytes
    if inputs.gradient_checkpointing:  # each layer's input kept, one layer recomputed at a time
        activations = shape.layers * tokens * shape.hidden * 4 + per_layer
    else:
        activations = shape.layers * per_layer
    plan.items["activations (micro-batch)"] = activations
    # the head runs on the sampled positions only: their logits in the compute dtype, the fp32
    # log-softmax and its gradient
    scored = tokens
    if inputs.response_tokens is not None:
        scored = min(tokens, inputs.response_tokens * (1 if inputs.packed_tokens else inputs.micro_batch_rows))
    plan.items["logits (micro-batch)"] = scored * shape.vocab * (inputs.compute_bytes + 8)
    if inputs.engine == "sglang_shared":
        plan.items["SGLang static share"] = int(inputs.engine_mem_fraction * inputs.gpu_memory_bytes)
    elif inputs.engine == "inprocess":
        plan.items["engine weights (bf16)"] = 2 * params
        plan.items["engine KV cache"] = (
            inputs.engine_batch * inputs.context_tokens * shape.kv_cache_bytes_per_token(inputs.compute_bytes)
        )
    if inputs.push_bucket_bytes:
        plan.items["weight-push bucket"] = inputs.push_bucket_bytes
    plan.items["CUDA context and workspaces"] = CUDA_OVERHEAD_BYTES
    return plan


Remedy = tuple[str, Callable[[PlanInputs], PlanInputs]]


def _remedies(inputs: PlanInputs) -> list[Remedy]:
    """Knobs tried when a plan does not fit: what to set, and how it changes the inputs."""
    options: list[Remedy] = []
    if not inputs.gradient_checkpointing:
        options.append(("model.gradient_checkpointing=true", lambda i: replace(i, gradient_checkpointing=True)))
    if inputs.packed_tokens is None and inputs.micro_batch_rows > 1:
        options.append(("optim.micro_batch_size=1", lambda i: replace(i, micro_batch_rows=1)))
    if inputs.trainable_fraction > 0.5 and inputs.lora_rank is None:
        options.append(
            ("optim.train_embeddings=false", lambda i: replace(i, trainable_fraction=_without_embeddings(i.shape)))
        )
    if inputs.engine == "sglang_shared" and inputs.engine_mem_fraction > 0.15:
        options.append(("engine.mem_fraction=0.15", lambda i: replace(i, engine_mem_fraction=0.15)))
    # last: LoRA changes what the run learns (adapters on a frozen base), not only how it computes
    if inputs.lora_rank is None and inputs.ranks == 1:
        options.append(
            (
                f"model.lora.rank={DEFAULT_LORA_RANK}",
                lambda i: replace(i, lora_rank=DEFAULT_LORA_RANK, lora_targets=tuple(DEFAULT_TARGETS)),
            )
        )
    return options


def _without_embeddings(shape: ModelShape) -> float:
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2)
    return max(0.0, 1 - embeddings / shape.parameters())


def knobs_that_fit(inputs: PlanInputs, *, max_ranks: int = 8) -> list[str]:
    """The knobs whose plan fits, or [] when none does: each single-GPU knob alone first, then
    all of them together, then ranks (GPUs of their own) added to that, smallest group first."""
    remedies = _remedies(inputs)
    for name, change in remedies:
        if plan_memory(change(inputs)).fits:
            return [name]
    combined, names = inputs, []
    for name, change in remedies:
        combined, names = change(combined), [*names, name]
        if plan_memory(combined).fits:
            return _needed(inputs, remedies, names)
    # ranks: LoRA trains on one process, so the groups tried are without it
    sharded, sharded_names = inputs, []
    for name, change in remedies:
        if not name.startswith("model.lora"):
            sharded, sharded_names = change(sharded), [*sharded_names, name]
    ranks = inputs.ranks * 2
    while ranks <= max_ranks and inputs.lora_rank is None:
        for base, base_names in ((inputs, []), (sharded, sharded_names)):
            if plan_memory(replace(base, ranks=ranks)).fits:
                return [*base_names, f"trainer.world_size={ranks}"]
        ranks *= 2
    return []


def _needed(inputs: PlanInputs, remedies: list[Remedy], names: list[str]) -> list[str]:
    """`names` without the knobs the others make unneeded (frozen embeddings once LoRA freezes every weight)."""
    changes = dict(remedies)

    def fits(chosen: list[str]) -> bool:
        changed = inputs
        for name in chosen:
            changed = changes[name](changed)
        return plan_memory(changed).fits

    kept = list(names)
    for name in names:
        if fits([n for n in kept if n != name]):
            kept.remove(name)
    return kept


def refuse_unless_fits(plan: MemoryPlan) -> None:
    """A UserError naming the knobs that would make the run fit, when it does not."""
    if plan.fits:
        return
    knobs = knobs_that_fit(plan.inputs)
    if knobs:
        fix = "it fits with " + " ".join(f"--set {k}" for k in knobs)
        if any(k.startswith("trainer.world_size") for k in knobs):
            fix += " (each rank on a GPU of its own)"
    else:
        fix = (
            "no combination of activation checkpointing, a smaller micro-batch, LoRA, frozen embeddings, a "
            "smaller engine share and up to 8 ranks fits it: use a smaller model or a shorter context"
        )
    raise UserError(
        f"{plan.table()}\nthis run needs {plan.total_bytes / GIB:.1f} GiB per GPU and "
        f"{plan.capacity_bytes / GIB:.1f} GiB is usable; {fix}"
    )


def run_targets_gpu(device: str) -> bool:
    """`model.device` names a GPU, or is auto on a machine that has one."""
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def gpu_memory_bytes(device: str, declared_gib: float | None) -> tuple[int, str]:
    """The card to plan against, and where its size came from."""
    if declared_gib is not None:
        return int(declared_gib * GIB), "trainer.gpu_memory_gib"
    import torch

    if torch.cuda.is_available():
        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory, f"cuda:{index}"
    return int(DEFAULT_GPU_MEMORY_GIB * GIB), f"no GPU here: an {DEFAULT_GPU_MEMORY_GIB:g} GiB card assumed"


def memory_plan_inputs(config: Any, shape: ModelShape, gpu_bytes: int) -> PlanInputs:
    """A RunConfig's knobs that move memory (duck-typed: the trainer config imports this module)."""
    from rollhub.inference.engines.launcher import SHARED_MEM_FRACTION
    from rollhub.inference.weight_sync import DistributedWeightSync

    engine = config.engine
    if engine.backend == "inprocess":
        engine_kind = "inprocess"
    elif engine.share_gpu:
        engine_kind = "sglang_shared"
    else:
        engine_kind = "none"  # servers on GPUs of their own
    return PlanInputs(
        shape=shape,
        gpu_memory_bytes=gpu_bytes,
        ranks=config.trainer.world_size,
        trainable_fraction=1.0 if config.optim.train_embeddings else _without_embeddings(shape),
        compute_bytes=4 if config.model.dtype == "float32" else 2,
        micro_batch_rows=config.optim.micro_batch_size,
        context_tokens=config.agent.max_context_tokens,
        packed_tokens=config.optim.pack_tokens,
        response_tokens=(
            min(config.agent.max_context_tokens, config.agent.max_new_tokens * config.agent.max_turns)
            if config.agent.max_turns
            else None
        ),
        gradient_checkpointing=config.model.gradient_checkpointing,
        kl_reference=config.loss.kl_coef > 0,
        lora_rank=config.model.lora.rank if config.model.lora is not None else None,
        lora_targets=tuple(config.model.lora.target_modules) if config.model.lora is not None else (),
        engine=engine_kind,
        engine_mem_fraction=engine.mem_fraction if engine.mem_fraction is not None else SHARED_MEM_FRACTION,
        engine_batch=engine.max_batch_size,
        push_bucket_bytes=DistributedWeightSync.bucket_bytes if engine.weight_sync == "distributed" else 0,
    )


def check_run_memory(
    config: Any, model_dir: str | Path | None = None, *, print_fn: Callable[[str], None] = print
) -> MemoryPlan | None:
    """Print the plan of a GPU run, and refuse one that cannot fit.

    Runs once the model folder is known (`model_dir`, default `model.path`) and before the run
    folder, the weights or the engine are touched. CPU runs have no plan."""
    if not run_targets_gpu(config.model.device):
        return None
    folder = Path(model_dir if model_dir is not None else config.model.path)
    if not (folder / "config.json").is_file():
        return None
    gpu_bytes, source = gpu_memory_bytes(config.model.device, config.trainer.gpu_memory_gib)
    plan = plan_memory(memory_plan_inputs(config, ModelShape.read(folder), gpu_bytes))
    refuse_unless_fits(plan)
    if plan.inputs.engine == "sglang_shared" and gpu_bytes and source.startswith("cuda"):
        # the server's static share is taken when it starts, after the policy loaded: the trainer's
        # caching allocator must not grow into it later (the engine share plus the fragmentation margin)
        import torch

        index = int(source.split(":")[1])
        torch.cuda.set_per_process_memory_fraction(1 - plan.inputs.engine_mem_fraction - FRAGMENTATION_MARGIN, index)
    print_fn(f"{plan.table()}\n  (card size: {source})")
    return plan
