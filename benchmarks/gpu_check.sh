#!/usr/bin/env bash
# GPU check: on a bare, air-gapped machine with one or more GPUs, in under 10 minutes,
#   0. report the torch already there (never reinstalled: a CUDA build of torch, often older than
#      ours, and numpy are the machine's), its GPUs, and that FSDP2 is available;
#   1. build a random-init model of Qwen3-0.6B's shape locally (no download; rollhub's own
#      tokenizer, so the vocabulary is 8k instead of Qwen's 151k: embeddings are smaller);
#   2. run the math recipe (configs/math_smollm2.yaml) on it for a few steps with
#      model.device=cuda and the in-process engine;
#   3. again with a launched `rollhub serve` on CUDA (engine.backend=server) and distributed
#      weight pushes between the two processes: NCCL when the server has a GPU of its own (2+
#      GPUs), else gloo with the server sharing GPU 0 (NCCL refuses two ranks on one GPU);
#   4. one trainer step with FSDP2, bf16 compute and fp32 master weights, on every GPU (torchrun);
#   5. with SGLANG_PYTHON (the python of an SGLang venv, see README) or an importable sglang,
#      the recipe with SGLang servers;
#   6. print generated tokens/s, the per-step split and the push latency of each run.
# Exits non-zero on any failure.
#
#   bash benchmarks/gpu_check.sh                      # the GPU check, with the python found here
#   bash benchmarks/gpu_check.sh --wheels DIR         # first install DIR's wheels into a venv over the
#                                                     # machine's own torch (no index, no dependencies)
#   bash benchmarks/gpu_check.sh --prepare-wheels DIR # on a connected machine: rollhub and its pure-Python
#                                                     # dependencies as wheels (torch and numpy left out)
#   bash benchmarks/gpu_check.sh --dry-run            # the same steps on the CPU with a tiny shape
#   DEVICE=cpu bash benchmarks/gpu_check.sh           # same as --dry-run
# Environment: OUT (default runs/gpu_check), STEPS (default 3), PYTHON (default python3), SGLANG_PYTHON.
#
# A short SFT on Math-v0's expert answers comes first so the random model answers some problems
# right: without it every reward is 0, every GRPO advantage is 0 and no update would run, which
# would make the step split meaningless.
set -euo pipefail

DEVICE="${DEVICE:-cuda}"
WHEELS=""
usage() {
  echo "usage: bash benchmarks/gpu_check.sh [--dry-run] [--wheels DIR] | --prepare-wheels DIR" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DEVICE=cpu; shift ;;
    --wheels) [[ $# -ge 2 ]] || usage; WHEELS="$(cd "$2" && pwd)"; shift 2 ;;
    --prepare-wheels)
      [[ $# -eq 2 ]] || usage
      mkdir -p "$2"; DEST="$(cd "$2" && pwd)"
      cd "$(dirname "$0")/.."
      "${PYTHON:-python3}" benchmarks/gpu_check/wheels.py > "$DEST/requirements.txt"
      "${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: -d "$DEST" -r "$DEST/requirements.txt"
      "${PYTHON:-python3}" -m pip wheel --no-deps --no-build-isolation -w "$DEST" .
      echo "gpu_check: wheels in $DEST ($(du -sh "$DEST" | cut -f1)); copy the folder and the repository to the GPU machine"
      exit 0 ;;
    *) usage ;;
  esac
done
OUT="${OUT:-runs/gpu_check}"
STEPS="${STEPS:-3}"
PYTHON="${PYTHON:-python3}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
cd "$(dirname "$0")/.."

if [[ -n "$WHEELS" ]]; then
  echo "== 0. wheels from $WHEELS into $OUT/venv, over this machine's torch"
  "$PYTHON" -m venv --system-site-packages "$OUT/venv"
  "$OUT/venv/bin/python" -m pip install --no-index --no-deps --quiet "$WHEELS"/*.whl
  PYTHON="$OUT/venv/bin/python"
fi

echo "== 0. environment"
GPUS=$("$PYTHON" - "$DEVICE" <<'PY'
import sys

import torch

device = sys.argv[1]
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401  FSDP2 (torch >= 2.6)
except ImportError:
    sys.exit(f"gpu_check: torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard); torch >= 2.6")
count = torch.cuda.device_count() if device == "cuda" else 0
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device (use --dry-run on a CPU machine)")
names = ", ".join(torch.cuda.get_device_name(i) for i in range(count)) or "none"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), GPUs: {names}", file=sys.stderr)
print(count)
PY
)

if [[ "$DEVICE" == cpu ]]; then
  SHAPE=tiny
  EVAL_EPISODES=8
  SFT_LR=2.0e-3
else
  SHAPE=qwen3-0.6b
  EVAL_EPISODES=64
  SFT_LR=1.0e-4
fi
MODEL="$OUT/model-$SHAPE"
rm -rf "$OUT/inprocess" "$OUT/serve" "$OUT/sglang"
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

SERVE=(--set engine.backend=server --set engine.launch=rollhub --set engine.weight_sync=distributed)
if [[ "$DEVICE" == cuda && "$GPUS" -lt 2 ]]; then
  SERVE+=(--set engine.share_gpu=true)
  echo "== 3. math recipe, rollhub serve sharing the one GPU (weights over gloo: NCCL refuses two ranks on one GPU)"
elif [[ "$DEVICE" == cuda ]]; then
  echo "== 3. math recipe, rollhub serve on GPU 1 (weights over NCCL between the two processes)"
else
  echo "== 3. math recipe, rollhub serve on the CPU (weights over gloo between the two processes)"
fi
"$PYTHON" -m rollhub.cli train configs/math_smollm2.yaml "${COMMON[@]}" "${SERVE[@]}" --set "run_dir=$OUT/serve"
RUNS+=("$OUT/serve")

RANKS=2
if [[ "$DEVICE" == cuda ]]; then RANKS=$(( GPUS < 2 ? GPUS : 2 )); fi
echo "== 4. one FSDP2 step, bf16 compute and fp32 master weights, $RANKS rank(s) on $DEVICE"
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$RANKS" benchmarks/gpu_check/fsdp_step.py \
  "$MODEL" "$DEVICE"

SGLANG="${SGLANG_PYTHON:-}"
if [[ -z "$SGLANG" ]] && "$PYTHON" -c "import sglang" 2>/dev/null; then SGLANG="$PYTHON"; fi
if [[ -z "$SGLANG" ]]; then
  echo "== 5. no SGLANG_PYTHON and sglang is not importable here: SGLang run skipped"
elif [[ "$DEVICE" == cpu ]]; then
  echo "== 5. SGLang needs a GPU: skipped in --dry-run"
else
  echo "== 5. math recipe, SGLang server ($SGLANG)"
  SGL=(--set engine.backend=server --set engine.launch=sglang --set engine.weight_sync=distributed
       --set "engine.server_python=$SGLANG")
  if [[ "$GPUS" -lt 2 ]]; then SGL+=(--set engine.share_gpu=true); fi
  "$PYTHON" -m rollhub.cli train configs/math_smollm2.yaml "${COMMON[@]}" "${SGL[@]}" --set "run_dir=$OUT/sglang"
  RUNS+=("$OUT/sglang")
fi

echo "== 6. throughput, step split and push latency"
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
