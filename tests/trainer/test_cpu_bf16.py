"""bf16 on the CPU (model.dtype / engine.dtype): close to fp32, the head in fp32, bad values refused."""

import asyncio

import pytest
import torch
from test_policy import _batch, _sample_trajectories

from rollhub.core.config import load_config
from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.build import EngineConfig
from rollhub.trainer.config import RunConfig
from rollhub.trainer.policy import Policy


async def _engine_logprobs(model_dir, dtype, prompts):
    from rollhub.inference.engines.hf import HFEngine

    engine = HFEngine(model_dir, threads=1, max_batch_size=8, seed=3, dtype=dtype)
    try:
        params = SamplingParams(max_new_tokens=1, temperature=0.0)
        gens = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
        return engine, [g.token_ids[0] for g in gens], [g.logprobs[0] for g in gens]
    finally:
        await engine.close()


def test_bf16_trainer_logprobs_stay_near_fp32_and_the_head_stays_fp32(tiny_model_dir):
    trajectories = asyncio.run(_sample_trajectories(tiny_model_dir, temperature=1.0))
    fp32 = Policy(tiny_model_dir, device="cpu", micro_batch_size=2)
    bf16 = Policy(tiny_model_dir, device="cpu", micro_batch_size=2, dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    batch = _batch(trajectories, fp32)
    mask = batch.response_mask.bool()
    exact = fp32.compute_logprobs(batch)[mask]
    approx = bf16.compute_logprobs(batch)[mask]
    gap = (exact - approx).abs()
    # bf16 products move log-probs a little, never to another distribution
    assert 0 < gap.max() < 0.1, gap.max()
    assert gap.mean() < 0.02
    # the head is not autocast: its logits are fp32 products of the decoder's output
    head = bf16.model.get_output_embeddings()
    assert head.forward.__class__.__name__ == "method", "the head must not be wrapped in autocast"
    assert next(bf16.model.parameters()).dtype == torch.float32  # master weights stay fp32
    # a gradient flows through the bf16 decoder into fp32 parameters
    logp, _ = bf16.token_logprobs(batch)
    (logp * batch.response_mask).sum().backward()
    grads = [p.grad for p in bf16.model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def test_bf16_engine_projects_in_fp32_and_agrees_with_the_fp32_engine(tiny_model_dir):
    from rollhub.inference.models import load_model_and_tokenizer

    _, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    prompts = [tokenizer.encode(f"#__P_#\n#O_X{i}_#\n") for i in range(6)]
    _, tokens32, lp32 = asyncio.run(_engine_logprobs(tiny_model_dir, None, prompts))
    engine16, tokens16, lp16 = asyncio.run(_engine_logprobs(tiny_model_dir, "bfloat16", prompts))
    assert engine16.dtype == torch.bfloat16
    assert engine16._decoder is not None and engine16._decoder._head.dtype == torch.float32
    # the log-probs the fp32 trainer will divide by, from a bf16 engine: close to the fp32 engine's
    agree = [abs(a - b) for a, b, s, t in zip(lp32, lp16, tokens32, tokens16) if s == t]
    assert len(agree) >= 4
    assert max(agree) < 0.1, agree


def test_dtype_options_are_checked_and_sft_takes_the_engine_threads(tmp_path):
    config = load_config(RunConfig, overrides=["model.threads=1", "engine.threads=1"])
    assert config.sft.torch_threads(config) == 2  # no engine generates during SFT
    config = load_config(RunConfig, overrides=["model.threads=1", "sft.threads=3"])
    assert config.sft.torch_threads(config) == 3
    for bad in ("model.dtype=float16", "engine.dtype=half", "sft.threads=0"):
        with pytest.raises(Exception) as caught:
            load_config(RunConfig, overrides=[bad])
        assert bad.split("=")[0] in str(caught.value)
    EngineConfig(backend="server", dtype="bfloat16").validate()  # launched `rollhub serve` takes --dtype
    EngineConfig(backend="server", dtype="bfloat16", launch="sglang").validate()  # and SGLang's --dtype
    for refused in ({"urls": ["http://127.0.0.1:1"]}, {"launch": "python3 -m my_server --port {port}"}):
        with pytest.raises(ValueError, match="engine.dtype"):  # attached, or a template without {dtype}
            EngineConfig(backend="server", dtype="bfloat16", **refused).validate()
    EngineConfig(dtype="bfloat16").validate()
