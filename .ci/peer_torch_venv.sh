#!/usr/bin/env bash
# Builds .cache/peer-torch-venv: a second Python venv holding another torch release than ours
# (default 2.14.1, a CUDA build; the only other release this machine's wheel store carries) plus
# what `rollhub serve` imports, pinned to this environment's versions. It stands in for an SGLang
# server venv, whose torch is pinned apart from the trainer's: tests/inference/test_weight_sync_two_torches.py
# pushes weights into it over gloo and skips while it is absent.
#
# A CUDA wheel imports on a CPU-only machine once its nvidia-* dependency wheels are installed
# (~5.6 GB in all); no CPU wheel of another release is on the package index. The venv is marked
# complete only at the end, so an interrupted build is rebuilt, never half used. Rebuilt from
# scratch when TORCH_VERSION changes.
#
# Not part of .ci/run: it took 3.3 min on this 2-core machine at moderate load but 11.5 min at load
# average 13-18 (the wheels are on local disk; elsewhere ~3 GB are downloaded), and takes 5.7 GB in each
# clone; the test is marked slow for the same reason (~2 min, two imports of a CUDA build).
#
#   bash .ci/peer_torch_venv.sh                      # 3-12 min here (wheels on local disk)
#   TORCH_VERSION=2.12.0 bash .ci/peer_torch_venv.sh # another release (downloaded: ~3 GB); this
#                                                    # machine's pip constraints refuse releases above 2.14.1
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=${TORCH_VERSION:-2.14.1}
VENV=${ROLLHUB_PEER_VENV:-.cache/peer-torch-venv}
MARK="$VENV/.rollhub-complete"
say() { echo "== peer_torch_venv: $*"; }

ours=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')
if [ "$ours" = "$TORCH_VERSION" ]; then
    echo "peer_torch_venv: TORCH_VERSION=$TORCH_VERSION is this environment's own torch; pick another release" >&2
    exit 2
fi
if [ -f "$MARK" ] && [ "$(cat "$MARK")" = "torch==$TORCH_VERSION" ]; then
    say "$VENV is built (torch $TORCH_VERSION)"
    exit 0
fi

started=$(date +%s)
rm -rf "$VENV"
python3 -m venv "$VENV"
say "torch==$TORCH_VERSION (with its nvidia-* wheels) into $VENV"
"$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
# what `python -m rollhub.cli serve` imports, at the versions this environment runs
pins=$(python3 - <<'EOF'
from importlib.metadata import version
names = ["transformers", "tokenizers", "safetensors", "numpy", "aiohttp", "pyyaml", "rich", "tqdm"]
print(" ".join(f"{name}=={version(name)}" for name in names))
EOF
)
say "serve dependencies: $pins"
# shellcheck disable=SC2086  # one word per requirement
"$VENV/bin/python" -m pip install -q $pins
"$VENV/bin/python" -c "import torch, torch.distributed as d; assert d.is_gloo_available(); print('peer torch', torch.__version__)"
echo "torch==$TORCH_VERSION" > "$MARK"
say "built in $(( $(date +%s) - started )) s, $(du -sh "$VENV" | cut -f1)"
