"""Under FSDP2 the output head projects only the positions whose log-probs are needed, and in fp32.

One process, a gloo group of world size 1 on CPU: the same hooks, mixed-precision casts and
all-gathers as on GPUs, so which positions reach the head and in which dtype is checked here.
"""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    from rollhub.rollout.types import PackedSequence
    from rollhub.trainer.policy import Policy, collate, response_positions

    model_dir = sys.argv[1]
    rows = []
    for prompt, answer in (([5, 6, 7, 8, 11, 12, 13], [9, 10]), ([21, 22, 23], [24, 25, 26, 27])):
        seq = PackedSequence()
        seq.extend(prompt, mask=False, turn_index=-1)
        seq.extend(answer, mask=True, turn_index=0, logprobs=[-1.0] * len(answer), versions=[0] * len(answer))
        rows.append(seq)
    batch = collate(rows, [[0.0] * len(s.input_ids) for s in rows], 0)
    n_response = len(response_positions(batch)[0])

    plain = Policy(model_dir, device="cpu")
    plain_logp, _ = plain.token_logprobs(batch)
    (-plain_logp.sum()).backward()
    plain_grad = plain.model.get_output_embeddings().weight.grad.clone()
    reference = plain_logp.detach()

    def watch(policy):
        seen = []
        head = policy.model.get_output_embeddings()
        head.register_forward_hook(lambda _m, args, out: seen.append((tuple(args[0].shape), out.dtype)))
        return seen

    sharded = Policy(model_dir, device="cpu", fsdp=True)
    seen = watch(sharded)
    logp, _ = sharded.token_logprobs(batch)
    hidden = sharded.model.config.hidden_size
    print("HEAD-INPUT", seen, n_response)
    assert [shape for shape, _ in seen] == [(n_response, hidden)], (seen, n_response)
    assert torch.allclose(logp.detach(), reference, atol=1e-5), (logp, reference)
    (-logp.sum()).backward()
    grad = sharded.model.get_output_embeddings().weight.grad
    grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    assert torch.allclose(grad, plain_grad, atol=1e-5), float((grad - plain_grad).abs().max())
    seen.clear()
    packed, _ = sharded.token_logprobs(batch, packed=True)
    assert [shape for shape, _ in seen] == [(n_response, hidden)], (seen, n_response)
    assert torch.allclose(packed, reference, atol=1e-5)
    print("FSDP-SUBSET-OK")

    # bf16 compute: the decoder layers in bf16, the head and its log-softmax in fp32
    single = Policy(model_dir, device="cpu", dtype="bfloat16")
    with torch.no_grad():
        single_error = float((single.token_logprobs(batch)[0] - reference).abs().max())
    low = Policy(model_dir, device="cpu", fsdp=True, dtype="bfloat16")
    seen = watch(low)
    head = low.model.get_output_embeddings()
    calls = []
    head.register_forward_hook(lambda _m, args, out: calls.append((args[0].detach(), out.detach())))
    with torch.no_grad():
        low_logp, _ = low.token_logprobs(batch)
    error = float((low_logp - reference).abs().max())
    # the head's own share of the error: its log-softmax against an fp32 projection of the same input
    (head_input, head_output), = calls
    master = plain.model.get_output_embeddings().weight.detach()  # the same fp32 weights, unsharded
    exact = torch.nn.functional.linear(head_input.float(), master)
    head_error = float(
        (torch.log_softmax(head_output.float(), -1) - torch.log_softmax(exact, -1)).abs().max()
    )
    print("BF16-ERROR", "fsdp", error, "single-process", single_error, "head", head_error, seen)
    assert seen and all(dtype == torch.float32 for _, dtype in seen), seen
    assert low_logp.dtype == torch.float32
    assert head_error < 1e-5, head_error
    assert error < 2 * single_error, (error, single_error)
    print("FSDP-BF16-OK")
    dist.destroy_process_group()
    """
)


def test_fsdp2_head_projects_response_positions_in_fp32(tiny_model_dir, tmp_path):
    script = tmp_path / "fsdp_head_check.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(30500 + os.getpid() % 1000)}
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir)], capture_output=True, text=True, env=env, timeout=600
    )
    assert "FSDP-SUBSET-OK" in done.stdout and "FSDP-BF16-OK" in done.stdout, (done.stdout + done.stderr)[-4000:]
