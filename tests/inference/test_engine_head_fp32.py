"""The in-process engine projects a low-precision model's logits in fp32 on every device.

bf16 logits would round every behaviour log-prob the trainer's importance ratios divide by; on a
GPU the head runs on one position per row, so fp32 costs little there too. No GPU here: the
model is moved to the meta device (shapes and dtypes without data), which is not the CPU either.
"""

import torch


def test_fast_decoder_head_is_fp32_off_the_cpu(tiny_model_dir):
    from rollhub.inference.engines.fast_decoder import FastDecoder
    from rollhub.inference.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(tiny_model_dir, dtype=torch.bfloat16)
    model = model.to("meta")
    decoder = FastDecoder(model)
    decoder._pack()
    assert decoder._head.device.type == "meta"
    assert decoder._head.dtype == torch.float32
