"""Train the byte-level BPE tokenizer of the tiny test models, from text on this machine.

The trained `tokenizer.json` is committed under `rollhub/inference/data/` so model builds are
deterministic; this module documents (and can redo) how it was made. The corpus mixes
Python standard-library sources (code, docstrings, English prose) with synthetic text in
the shapes our envs produce: grid renderings, arithmetic word problems, action tags and
tool calls. No network, no downloads.
"""

from __future__ import annotations

import logging
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
DEFAULT_VOCAB_SIZE = 8192

_WORDS = (
    "the agent box goal wall player push move up down left right step reward episode answer "
    "number total each how many apples more less than sum product remaining cost price tool "
    "call file test patch error function return value room take open close go to look inventory "
    "put in on from with a an is are was were you your it its this that there what which state"
).split()


def _synthetic_env_text(rng: random.Random) -> str:
    """One snippet in the style of an env observation or a model answer."""
    kind = rng.randrange(5)
    if kind == 0:  # grid puzzle rendering
        height, width = rng.randint(4, 9), rng.randint(4, 9)
        rows = []
        for row in range(height):
            cells = []
            for col in range(width):
                border = row in (0, height - 1) or col in (0, width - 1)
                cells.append("#" if border else rng.choice("  __..$@OX#*+"))
            rows.append("".join(cells))
        return "Current state:\n" + "\n".join(rows) + "\nWhich move? Answer with <action>up|down|left|right</action>."
    if kind == 1:  # arithmetic word problem with a worked answer
        a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(1, 9)
        return (
            f"A shop sells {a} apples on Monday and {b} more each day for {c} days. How many apples in total?\n"
            f"Reasoning: {a} + {b} * {c} = {a + b * c}. <answer>{a + b * c}</answer>"
        )
    if kind == 2:  # action answers
        action = rng.choice(["up", "down", "left", "right", "go to desk 1", "take mug 2", "open drawer 3"])
        return f"I think the best move is {action}. <action>{action}</action>"
    if kind == 3:  # tool calls
        path = rng.choice(["src/app.py", "tests/test_core.py", "README.md", "setup.cfg"])
        return (
            '<tool_call>{"name": "bash", "arguments": '
            f'{{"command": "cat {path} | head -n {rng.randint(5, 80)}"}}}}</tool_call>'
        )
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 40))).capitalize() + "."


def training_corpus(max_bytes: int = 5_000_000, seed: int = 0) -> Iterator[str]:
    """Yield ≈max_bytes of text: ~70% stdlib sources, ~30% synthetic env text."""
    rng = random.Random(seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))
    budget_code = int(max_bytes * 0.7)
    used = 0
    for path in files:
        if used >= budget_code:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        used += len(text)
        yield text
    used_synthetic = 0
    while used_synthetic < max_bytes - used:
        snippet = _synthetic_env_text(rng)
        used_synthetic += len(snippet)
        yield snippet


def train_tokenizer(out_path: Path, vocab_size: int = DEFAULT_VOCAB_SIZE, max_bytes: int = 5_000_000) -> Path:
    """Train a byte-level BPE on `training_corpus()` and write `tokenizer.json`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(max_bytes), trainer=trainer)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_path))
    logger.info("trained tokenizer with %d tokens -> %s", tokenizer.get_vocab_size(), out_path)
    return out_path


if __name__ == "__main__":  # python -m rollhub.inference.tokenizer_training
    train_tokenizer(Path(__file__).parent / "data" / "tokenizer.json")
