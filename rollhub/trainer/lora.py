"""LoRA adapters on the trained policy (`model.lora`), through `peft`.

Why a knob: full fine-tuning keeps fp32 gradients and two AdamW moments for every weight
(16 bytes per parameter, see rollhub.trainer.memory_plan); with LoRA only the low-rank
adapters A (rank x in) and B (out x rank) of the targeted linear layers train, the base stays
frozen, and the KL reference is the same model with its adapters switched off (no second copy).

The adapters are injected into the transformers model in place (`peft.get_peft_model`), so the
policy keeps one module tree whose decoder, head and layers are the ones every other trainer path
(split head, packing, prefix sharing, activation checkpointing) already knows; the `PeftModel`
wrapper is kept beside it for `disable_adapter` and the adapter files. Engines get the merged
weights (base + alpha / rank x B A) under the base model's names (`merged_state_dict`), computed
on a copy: the trainer never merges in place, so training goes on from unmerged adapters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollhub.core.errors import UserError

#: the linear layers of a Llama / Qwen / Mistral / SmolLM2 decoder layer: attention and MLP
DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTER_NAME = "default"
#: where an exported model folder keeps the adapter it was merged from (peft's layout)
ADAPTER_SUBDIR = "lora_adapter"


@dataclass
class LoraConfig:
    """`model.lora:` low-rank adapters instead of full fine-tuning (null = full fine-tuning)."""

    rank: int = 16  # r: the adapters' inner dimension
    alpha: float = 32.0  # the update is scaled by alpha / rank
    dropout: float = 0.0  # dropout on the adapter's input while training (0 keeps pi_prox and pi_theta alike)
    # module names (the last part of the name) that get adapters: linear layers of the decoder
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))

    def validate(self) -> None:
        if isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"model.lora.rank must be an integer >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(t, str) and t.strip() for t in self.target_modules):
            raise ValueError(
                f"model.lora.target_modules must list module names (e.g. q_proj, v_proj), got {self.target_modules!r}"
            )
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"model.lora.target_modules names a module twice: {self.target_modules}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def require_peft() -> Any:
    """The peft package, or a one-line error naming the extra that installs it."""
    try:
        import peft
    except ImportError:
        raise UserError(
            "model.lora needs the peft package: pip install 'rollhub[lora]' (or pip install peft)"
        ) from None
    return peft


def attach_lora(model: torch.nn.Module, config: LoraConfig) -> Any:
    """Inject adapters into `model` in place (only they stay trainable); returns peft's wrapper.

    Embedding and output-head layers are refused: the head may be tied to the input embedding,
    and a merged push must keep the two names one tensor."""
    peft = require_peft()
    special = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    names = {name.rsplit(".", 1)[-1]: module for name, module in model.named_modules() if name}
    for target in config.target_modules:
        if target in names and id(names[target]) in special:
            raise UserError(
                f"model.lora.target_modules: {target} is the model's embedding or output head; LoRA targets the "
                f"decoder's linear layers (e.g. {', '.join(DEFAULT_TARGETS)})"
            )
    linear = sorted({n for n, m in names.items() if isinstance(m, torch.nn.Linear) and id(m) not in special})
    missing = [t for t in config.target_modules if t not in linear]
    if missing:
        raise UserError(
            f"model.lora.target_modules: {', '.join(missing)} not among the model's linear layers ({', '.join(linear)})"
        )
    peft_config = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    wrapper = peft.get_peft_model(model, peft_config, adapter_name=ADAPTER_NAME)
    if wrapper.base_model.model is not model:  # the in-place injection this module relies on
        raise RuntimeError("peft did not inject the adapters into the model in place")
    return wrapper


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """Module name -> peft LoRA layer (whose `base_layer` holds the frozen weight)."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def is_adapter_key(name: str) -> bool:
    return ".lora_" in name


def base_name(name: str) -> str:
    """A state-dict key of the adapted model under the base model's name (`q_proj.base_layer.weight` ->
    `q_proj.weight`)."""
    return name.replace(".base_layer.", ".")


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the weights with every adapter folded in (W + alpha / rank x B A), under
    the base model's names: what an engine without adapter support loads. `model` is left unmerged."""
    deltas = {
        f"{name}.base_layer.weight": layer.get_delta_weight(ADAPTER_NAME) for name, layer in lora_layers(model).items()
    }
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if is_adapter_key(name):
            continue
        copy = tensor.detach().to("cpu", copy=True)
        if name in deltas:
            copy += deltas[name].to(copy.device, copy.dtype)
        out[base_name(name)] = copy
    return out


def tied_duplicates(model: torch.nn.Module) -> set[str]:
    """Base names of weights that share another's storage (a head tied to the input embedding): a saved
    model leaves them out, as transformers does, so the folder has the base model's own files."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    duplicates = set()
    for name, tensor in model.state_dict().items():
        key = (
            tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size(),
            tuple(tensor.shape),
        )
        if key in seen:
            duplicates.add(base_name(name))
        seen.add(key)
    return duplicates


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' weights (the trainable state), detached CPU copies under the model's own names."""
    return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items() if is_adapter_key(name)}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put saved adapter weights back; the names must be exactly this model's adapters (a
    checkpoint of a full fine-tuning run, or of another rank / target list, is refused)."""
    expected = {name for name in model.state_dict() if is_adapter_key(name)}
    if set(state) != expected:
        extra = sorted(set(state) - expected)[:2]
        missing = sorted(expected - set(state))[:2]
        raise UserError(
            "the checkpoint's weights are not this run's LoRA adapters (model.lora changed since it was saved?): "
            f"unexpected {extra}, missing {missing}"
        )
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise UserError(f"the checkpoint holds weights this model lacks: {result.unexpected_keys[:2]}")
    for name, tensor in model.state_dict().items():  # shapes were checked by load_state_dict
        if name in state and tensor.shape != state[name].shape:
            raise UserError(f"{name}: checkpoint shape {tuple(state[name].shape)}, model {tuple(tensor.shape)}")


def adapter_files(wrapper: Any, config: LoraConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The adapter in peft's saved layout (`adapter_model.safetensors` keys, `adapter_config.json`),
    the form SGLang's `/load_lora_adapter` and `PeftModel.from_pretrained` read."""
    from peft import get_peft_model_state_dict

    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in get_peft_model_state_dict(wrapper).items()}
    peft_config = wrapper.peft_config[ADAPTER_NAME].to_dict()
    peft_config["target_modules"] = sorted(config.target_modules)
    return tensors, json.loads(json.dumps(peft_config, default=str))


def write_adapter(folder: str | Path, tensors: dict[str, torch.Tensor], adapter_config: dict[str, Any]) -> None:
    """An adapter folder peft and SGLang load: adapter_model.safetensors + adapter_config.json."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1))


class LoraWeights(dict):
    """A weight push of a LoRA policy: the merged weights as the mapping (what every engine and
    pusher loads), and the adapter beside them (`adapter`, `adapter_config`) for engines that load
    adapters (rollhub.inference.weight_sync.LoraAdapterSync)."""

    def __init__(
        self, merged: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], adapter_config: dict[str, Any]
    ) -> None:
        super().__init__(merged)
        self.adapter = adapter
        self.adapter_config = adapter_config


class AdapterlessReference:
    """The KL reference of a LoRA policy: the same model with its adapters switched off (the frozen
    base, which is the warm-start), so no second copy of the weights is held."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    @property
    def temperature(self) -> float:
        return self.policy.temperature

    def token_logprobs(self, batch: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        kwargs.pop("prefix", None)  # a prefix computed with the adapters on is not the reference's
        with self.policy.adapters_disabled():
            return self.policy.token_logprobs(batch, **kwargs)

    def compute_logprobs(self, batch: Any, **kwargs: Any) -> torch.Tensor:
        with self.policy.adapters_disabled():  # its shared prefix is computed inside too
            return self.policy.compute_logprobs(batch, **kwargs)
