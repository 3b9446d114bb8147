#!/usr/bin/env bash
# GPU check: on a machine with one GPU, in under 10 minutes,
#   1. build a random-init model of Qwen3-0.6B's shape locally (no download; rollhub's own
#      tokenizer, so the vocabulary is 8k instead of Qwen's 151k: embeddings are smaller);
#   2. run the math recipe (configs/math_smollm2.yaml) on it for a few steps with
#      model.device=cuda and the in-process engine;
#   3. if `sglang` is importable, again with SGLang servers (engine.backend=server,
#      engine.launch=sglang, weights pushed over NCCL);
#   4. print generated tokens/s and the per-step split (waiting for generation / update +
#      weight push) of each run.
# Exits non-zero on any failure.
#
#   bash benchmarks/gpu_check.sh              # the GPU check
#   bash benchmarks/gpu_check.sh --dry-run    # the same steps on the CPU with a tiny shape (~2 min)
#   DEVICE=cpu bash benchmarks/gpu_check.sh   # same as --dry-run
# Environment: OUT (default runs/gpu_check), STEPS (default 3), PYTHON (default python3).
#
# A short SFT on Math-v0's expert answers comes first so the random model answers some problems
# right: without it every reward is 0, every GRPO advantage is 0 and no update would run, which
# would make the step split meaningless.
set -euo pipefail

DEVICE="${DEVICE:-cuda}"
if [[ "${1:-}" == "--dry-run" ]]; then
  DEVICE=cpu
elif [[ -n "${1:-}" ]]; then
  echo "usage: bash benchmarks/gpu_check.sh [--dry-run]" >&2
  exit 2
fi
OUT="${OUT:-runs/gpu_check}"
STEPS="${STEPS:-3}"
PYTHON="${PYTHON:-python3}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
cd "$(dirname "$0")/.."

if [[ "$DEVICE" == cpu ]]; then
  SHAPE=tiny
  EVAL_EPISODES=8
  SFT_LR=2.0e-3
else
  SHAPE=qwen3-0.6b
  EVAL_EPISODES=64
  SFT_LR=1.0e-4
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device (use --dry-run on a CPU machine)')"
fi
MODEL="$OUT/model-$SHAPE"
rm -rf "$OUT/inprocess" "$OUT/sglang"
mkdir -p "$OUT"

echo "== 1. random-init $SHAPE model -> $MODEL"
"$PYTHON" - "$MODEL" "$SHAPE" <<'PY'
import sys
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from rollhub.inference.models import build_tokenizer

torch.set_num_threads(1)
out, shape = Path(sys.argv[1]), sys.argv[2]
if (out / "config.json").is_file():
    print(f"reusing {out}")
    sys.exit(0)
# Qwen3-0.6B's published shape: 28 layers, hidden 1024, MLP 3072, 16 query / 8 KV heads of 128
dims = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    # rollhub's tiny-5m shape: small enough for the CPU, big enough to learn the answer tag from the SFT
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}[shape]
tokenizer = build_tokenizer()
config = Qwen3Config(
    vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1_000_000.0,
    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **dims,
)
torch.manual_seed(0)
model = Qwen3ForCausalLM(config)
model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
partial = out.with_name(out.name + ".partial")
model.save_pretrained(partial)
tokenizer.save_pretrained(partial)
partial.rename(out)
print(f"wrote {shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
PY

COMMON=(
  --set "model.path=$MODEL" --set "model.device=$DEVICE"
  --set "train.steps=$STEPS" --set train.max_wall_s=240 --set "eval.episodes=$EVAL_EPISODES"
  --set sft.enabled=true --set sft.episodes=400 --set "sft.lr=$SFT_LR" --set optim.lr=1.0e-5
  --set agent.max_new_tokens=16 --set engine.watchdog_timeout_s=120
)

echo "== 2. math recipe, in-process engine on $DEVICE"
"$PYTHON" -m rollhub.cli train configs/math_smollm2.yaml "${COMMON[@]}" --set engine.backend=inprocess \
  --set "run_dir=$OUT/inprocess"
RUNS=("$OUT/inprocess")

if "$PYTHON" -c "import sglang" 2>/dev/null; then
  if [[ "$DEVICE" == cpu ]]; then
    echo "== 3. sglang is importable, but SGLang needs a GPU: skipped in --dry-run"
  else
    echo "== 3. math recipe, SGLang server (engine.backend=server, launch=sglang, NCCL weight sync)"
    "$PYTHON" -m rollhub.cli train configs/math_smollm2.yaml "${COMMON[@]}" --set engine.backend=server \
      --set engine.launch=sglang --set engine.weight_sync=distributed --set "run_dir=$OUT/sglang"
    RUNS+=("$OUT/sglang")
  fi
else
  echo "== 3. sglang is not importable here: SGLang run skipped"
fi

echo "== 4. throughput and step split"
"$PYTHON" - "${RUNS[@]}" <<'PY'
import json
import sys
from pathlib import Path

for run in map(Path, sys.argv[1:]):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "time/step_s" in r]
    if not steps:
        sys.exit(f"gpu_check: {run} logged no RL step")
    print(f"{run.name}: {len(steps)} steps")
    # wait_gen: the trainer waiting for the batch (generation not hidden by the previous update);
    # update: loss, backward and optimizer; push: pausing the engine and loading the new weights
    print(f"  {'step':>4} {'step_s':>8} {'wait_gen_s':>10} {'update_s':>9} {'push_s':>7} {'gen_tok/s':>10} {'reward':>6}")
    for r in steps:
        push = r.get("weights/pause_s", 0.0) + r.get("weights/update_s", 0.0)
        print(
            f"  {r.get('step', '?'):>4} {r['time/step_s']:8.2f} {r['time/wait_for_batch_s']:10.2f} "
            f"{r['time/train_s'] - push:9.2f} {push:7.2f} "
            f"{r.get('rollout/generation_tokens_per_s', float('nan')):10.1f} {r.get('train/success_rate', 0.0):6.2f}"
        )
    if not any("train/loss" in r for r in steps):
        print("  note: no step had an advantage signal (every reward alike): no update ran, update_s is ~0")
    summary = json.loads((run / "summary.json").read_text())
    print(f"  phases_s: {json.dumps({k: round(v, 1) for k, v in summary.get('phases_s', {}).items()})}")
    print(f"  wall {summary['wall_s']:.0f} s")
PY
echo "gpu_check: OK ($DEVICE)"
