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
#   6. probes of what only a GPU shows (benchmarks/gpu_check/probes.py): a gloo push into device
#      memory and its GiB/s, the memory plan against the allocator for Qwen2.5-1.5B/3B shapes, and the
#      version-0 log-prob gap between the in-process engine and the trainer in bf16;
#   7. print generated tokens/s, the per-step split and the push latency of each run.
# Every step runs under a time budget (the whole check fits 10 minutes) and ends OK, FAIL or
# SKIPPED with its reason; a skipped step is never reported as passed. Exits non-zero on any FAIL.
#
#   bash benchmarks/gpu_check.sh                      # the GPU check, with the python found here
#   bash benchmarks/gpu_check.sh --wheels DIR         # first install DIR's wheels into a venv over the
#                                                     # machine's own torch (no index, no dependencies)
#   bash benchmarks/gpu_check.sh --prepare-wheels DIR # on a connected machine: rollhub and its pure-Python
#                                                     # dependencies as wheels (torch and numpy left out)
#   bash benchmarks/gpu_check.sh --prepare-wheels DIR --target py312-cu130
#                                                     # only what that box lacks, tagged for its Python; the
#                                                     # repository and the wheels must fit 64 MiB (checked)
#   bash benchmarks/gpu_check.sh --dry-run            # the same steps on the CPU with a tiny shape
#   bash benchmarks/gpu_check.sh --dry-run --target py312-cu130  # also packs that box's wheels and checks the size
#   DEVICE=cpu bash benchmarks/gpu_check.sh           # same as --dry-run
# Environment: OUT (default runs/gpu_check), STEPS (default 3), PYTHON (default python3), SGLANG_PYTHON.
#
# A short SFT on Math-v0's expert answers comes first so the random model answers some problems
# right: without it every reward is 0, every GRPO advantage is 0 and no update would run, which
# would make the step split meaningless.
set -euo pipefail

DEVICE="${DEVICE:-cuda}"
WHEELS=""
TARGET=""
PREPARE=""
CARRY_LIMIT_MIB=64
usage() {
  echo "usage: bash benchmarks/gpu_check.sh [--dry-run] [--wheels DIR] [--target T] | --prepare-wheels DIR [--target T]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DEVICE=cpu; shift ;;
    --wheels) [[ $# -ge 2 ]] || usage; WHEELS="$(cd "$2" && pwd)"; shift 2 ;;
    --target) [[ $# -ge 2 ]] || usage; TARGET="$2"; shift 2 ;;
    --prepare-wheels) [[ $# -ge 2 ]] || usage; PREPARE="$2"; shift 2 ;;
    *) usage ;;
  esac
done
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# wheels for a bare box: every runtime dependency (no target), or only what target T lacks, tagged for it
prepare_wheels() {
  local dest="$1"
  mkdir -p "$dest"; dest="$(cd "$dest" && pwd)"
  if [[ -z "$TARGET" ]]; then
    "$PYTHON" benchmarks/gpu_check/wheels.py > "$dest/requirements.txt"
    "$PYTHON" -m pip download --no-deps --only-binary=:all: -d "$dest" -r "$dest/requirements.txt"
    "$PYTHON" -m pip wheel --no-deps --no-build-isolation -w "$dest" .
    echo "gpu_check: wheels in $dest ($(du -sh "$dest" | cut -f1)); copy the folder and the repository to the GPU machine"
    return 0
  fi
  local flags
  flags=$("$PYTHON" benchmarks/gpu_check/wheels.py --pip-flags "$TARGET") || { echo "gpu_check: unknown target $TARGET" >&2; exit 2; }
  "$PYTHON" benchmarks/gpu_check/wheels.py --target "$TARGET" > "$dest/requirements.txt"
  # shellcheck disable=SC2086  # the flags are words
  "$PYTHON" -m pip download --no-deps --only-binary=:all: $flags -d "$dest" -r "$dest/requirements.txt"
  # the repository travels with the wheels: rollhub itself runs from it (python -m rollhub.cli)
  local wheels_kib repo_kib total_mib
  wheels_kib=$(du -sk "$dest" | cut -f1)
  repo_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
  total_mib=$(( (wheels_kib + repo_kib + 1023) / 1024 ))
  echo "gpu_check: pack for $TARGET: $(ls "$dest"/*.whl | wc -l) wheels $(( wheels_kib / 1024 )) MiB + repository $(( repo_kib / 1024 )) MiB = $total_mib MiB of $CARRY_LIMIT_MIB MiB"
  if (( total_mib > CARRY_LIMIT_MIB )); then
    echo "gpu_check: the pack is over the $CARRY_LIMIT_MIB MiB a device run carries" >&2
    exit 1
  fi
}

if [[ -n "$PREPARE" ]]; then
  prepare_wheels "$PREPARE"
  exit 0
fi
OUT="${OUT:-runs/gpu_check}"
STEPS="${STEPS:-3}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ -n "$TARGET" ]]; then
  echo "== pack: the wheels $TARGET lacks"
  prepare_wheels "$OUT/wheels-$TARGET"
fi

# each step under its budget; the summary lists OK / FAIL / SKIPPED (with the reason) per step
declare -a RESULTS=()
FAILED=0
# the budgets add up to 10 minutes on a GPU box; a CPU dry run on a shared 2-core machine gets BUDGET_SCALE x
if [[ "$DEVICE" == cpu ]]; then BUDGET_SCALE="${BUDGET_SCALE:-6}"; else BUDGET_SCALE="${BUDGET_SCALE:-1}"; fi
step() {  # step NAME BUDGET_S COMMAND...
  local name="$1" budget=$(( $2 * BUDGET_SCALE )); shift 2
  local started=$SECONDS rc=0
  timeout --kill-after=10 "$budget" "$@" || rc=$?
  local took=$(( SECONDS - started ))
  if (( rc == 0 )); then
    RESULTS+=("$name: OK (${took} s of ${budget} s)")
  elif (( rc == 124 || rc == 137 )); then
    RESULTS+=("$name: FAIL (over its ${budget} s budget)"); FAILED=1
  else
    RESULTS+=("$name: FAIL (exit $rc after ${took} s)"); FAILED=1
  fi
  return 0
}
skip() { RESULTS+=("$1: SKIPPED ($2)"); echo "== $1: SKIPPED ($2)"; }

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
step "1. model" 90 "$PYTHON" - "$MODEL" "$SHAPE" <<'PY'
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
step "2. in-process engine" 150 "$PYTHON" -m rollhub.cli train configs/math_smollm2.yaml "${COMMON[@]}" \
  --set engine.backend=inprocess --set "run_dir=$OUT/inprocess"
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
step "3. rollhub serve" 150 "$PYTHON" -m rollhub.cli train configs/math_smollm2.yaml "${COMMON[@]}" "${SERVE[@]}" \
  --set "run_dir=$OUT/serve"
RUNS+=("$OUT/serve")

RANKS=2
if [[ "$DEVICE" == cuda ]]; then RANKS=$(( GPUS < 2 ? GPUS : 2 )); fi
echo "== 4. one FSDP2 step, bf16 compute and fp32 master weights, $RANKS rank(s) on $DEVICE"
step "4. FSDP2 step" 60 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$RANKS" \
  benchmarks/gpu_check/fsdp_step.py "$MODEL" "$DEVICE"

SGLANG="${SGLANG_PYTHON:-}"
if [[ -z "$SGLANG" ]] && "$PYTHON" -c "import sglang" 2>/dev/null; then SGLANG="$PYTHON"; fi
if [[ -z "$SGLANG" ]]; then
  skip "5. SGLang server" "no SGLANG_PYTHON and sglang is not importable here"
elif [[ "$DEVICE" == cpu ]]; then
  skip "5. SGLang server" "SGLang needs a GPU"
else
  echo "== 5. math recipe, SGLang server ($SGLANG)"
  SGL=(--set engine.backend=server --set engine.launch=sglang --set engine.weight_sync=distributed
       --set "engine.server_python=$SGLANG")
  if [[ "$GPUS" -lt 2 ]]; then SGL+=(--set engine.share_gpu=true); fi
  step "5. SGLang server" 150 "$PYTHON" -m rollhub.cli train configs/math_smollm2.yaml "${COMMON[@]}" "${SGL[@]}" \
    --set "run_dir=$OUT/sglang"
  RUNS+=("$OUT/sglang")
fi

echo "== 6. probes: gloo push into device memory, memory plan vs allocator, log-prob gap in the compute dtype"
step "6. probes" 150 "$PYTHON" benchmarks/gpu_check/probes.py "$DEVICE" "$MODEL"

echo "== 7. throughput, step split and push latency"
DONE_RUNS=()
for run in "${RUNS[@]}"; do [[ -f "$run/summary.json" ]] && DONE_RUNS+=("$run"); done
step "7. step split" 30 "$PYTHON" - "${DONE_RUNS[@]}" <<'PY'
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
echo "== summary"
printf '  %s\n' "${RESULTS[@]}"
SKIPPED=$(printf '%s\n' "${RESULTS[@]}" | grep -c ': SKIPPED' || true)
if (( FAILED )); then
  echo "gpu_check: FAILED ($DEVICE)"
  exit 1
fi
echo "gpu_check: OK ($DEVICE)$( (( SKIPPED )) && echo ", $SKIPPED step(s) SKIPPED: see the summary")"
