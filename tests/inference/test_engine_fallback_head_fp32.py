"""The in-process engine's transformers path (no fast path) projects a bf16 model's logits in fp32.

The behaviour log-probs the engine reports are what the trainer's importance ratios divide by:
from bf16 logits they would be off by the rounding of every logit. The fast path keeps an fp32
head; this is the other path (models it does not cover, or `fast_path=False`). Checked on the
tiny model loaded in bf16 on the CPU: the hidden state the head receives is captured, and the
reported log-prob must be the fp32 projection of exactly that hidden state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine
from rollhub.inference.models import load_model_and_tokenizer

PROMPT = [1, 45, 200, 301, 17, 88, 9, 143, 77, 5]


async def test_fallback_path_logprobs_come_from_an_fp32_head(tiny_model_dir):
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, dtype=torch.bfloat16)
    head = model.get_output_embeddings()
    hidden_seen: list[torch.Tensor] = []
    head.register_forward_hook(lambda _module, args, _out: hidden_seen.append(args[0].detach().clone()))
    engine = HFEngine(model, tokenizer, dtype=torch.bfloat16, fast_path=False, device="cpu")
    try:
        assert engine._decoder is None  # the transformers forward, not FastDecoder
        generation = await engine.generate(
            PROMPT, SamplingParams(max_new_tokens=4, temperature=1.0, seed=5, stop_token_ids=(10**9,))
        )
    finally:
        await engine.close()
    assert len(hidden_seen) == 4 and head.weight.dtype == torch.bfloat16
    assert "forward" not in head.__dict__  # the caller's model is left as it was
    worst_bf16 = 0.0
    for hidden, token, reported in zip(hidden_seen, generation.token_ids, generation.logprobs):
        last = hidden[0, -1]
        assert last.dtype == torch.bfloat16  # the decoder itself runs in bf16
        with torch.no_grad():
            fp32 = F.log_softmax(F.linear(last.float(), head.weight.float()), dim=-1)[token]
            bf16 = F.log_softmax(F.linear(last, head.weight).float(), dim=-1)[token]
        assert abs(reported - float(fp32)) < 1e-5, (reported, float(fp32), float(bf16))
        worst_bf16 = max(worst_bf16, abs(float(bf16) - float(fp32)))
    assert worst_bf16 > 1e-4  # the check can tell the two heads apart on this model
