"""Disk weight pushes of a model whose checkpoint is sharded: the folder a server loads must name
only the files it holds (SGLang loads exactly the files a `*.index.json` names, when one is there)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rollhub.inference.weight_sync import write_version_folder


def _served_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """What SGLang's loader reads: every *.safetensors, filtered by the index's files when an index exists."""
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        named = set(json.loads(index.read_text())["weight_map"].values())
        assert named <= {f.name for f in files}, f"the index names files the folder lacks: {named}"
        files = [f for f in files if f.name in named]
    tensors = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            tensors |= {name: handle.get_tensor(name) for name in handle.keys()}
    return tensors


def test_a_push_of_a_sharded_model_is_loaded_whole(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="2MB")
    assert len(list(sharded.glob("*.safetensors"))) > 2 and (sharded / "model.safetensors.index.json").exists()

    state = {name: tensor + 0.25 for name, tensor in model.state_dict().items()}  # a new version
    folder, _ = write_version_folder(state, tmp_path / "weights", 3, sharded)
    served = _served_tensors(folder)
    expected = {k: v for k, v in state.items() if k != "lm_head.weight" or not model.config.tie_word_embeddings}
    assert set(served) == set(expected)
    assert all(torch.equal(served[name], expected[name]) for name in expected)
    reloaded = AutoModelForCausalLM.from_pretrained(folder)
    assert torch.equal(reloaded.model.embed_tokens.weight, state["model.embed_tokens.weight"])
