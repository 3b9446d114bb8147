"""The FSDP2 code path of Policy: one-process gloo group on CPU here; bf16 on a GPU where lent."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    from rollhub.rollout.types import PackedSequence
    from rollhub.trainer.policy import Policy, collate
    model_dir = sys.argv[1]
    seq = PackedSequence()
    seq.extend([5, 6, 7, 8], mask=False, turn_index=-1)
    seq.extend([9, 10], mask=True, turn_index=0, logprobs=[-1.0, -1.0], versions=[0, 0])
    batch = collate([seq], [[0, 0, 0, 0, 1, 1]], 0)
    plain = Policy(model_dir, device="cpu").compute_logprobs(batch)
    sharded = Policy(model_dir, device="cpu", fsdp=True)
    logp, _ = sharded.token_logprobs(batch)
    (-logp.sum()).backward()
    assert type(next(sharded.model.parameters())).__name__ == "DTensor"
    assert torch.allclose(logp.detach(), plain, atol=1e-5), (logp, plain)
    state = sharded.engine_state_dict()
    assert all(not hasattr(t, "full_tensor") for t in state.values())
    print("FSDP2-OK", len(state))
    dist.destroy_process_group()
    """
)


def test_fsdp2_single_process_matches_plain_policy(tiny_model_dir, tmp_path):
    script = tmp_path / "fsdp_check.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000)}
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir)], capture_output=True, text=True, env=env, timeout=600
    )
    assert "FSDP2-OK" in done.stdout, done.stderr[-3000:]


@pytest.mark.gpu
def test_policy_uses_bf16_on_gpu(tiny_model_dir):
    """fp32 master weights, bf16 compute (autocast on one GPU)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from rollhub.trainer.policy import Policy

    policy = Policy(tiny_model_dir)
    assert policy.device == "cuda" and next(policy.model.parameters()).dtype == torch.float32
    assert policy.dtype == torch.bfloat16
    seen = []
    policy.model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    with torch.no_grad():
        policy.model(input_ids=torch.tensor([[5, 6, 7]], device="cuda"))
    assert seen == [torch.bfloat16]  # the matmuls run in bf16
