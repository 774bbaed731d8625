#!/usr/bin/env bash
# Model throughput against PyTorch (transformers, same weights, same shapes, same thread count)
# in the same script run, printed as a table of ratios (ours / PyTorch; > 1 means faster).
#   scripts/bench-model.sh             the rows below
#   scripts/bench-model.sh CONFIG.json ...   train 4x128 and decode of each config (eager attention)
# The peer is PyPI's current torch (../shared/tools/torch-current/setup.sh: MKL, oneDNN, fused
# SDPA attention), not Debian's torch 1.13 (reference BLAS unless OpenBLAS is installed, no
# fused attention). BENCH_TORCH=ref measures against the latter instead.
#
# Rows (train = forward + backward of the summed token log-probs, the LM head over every
# position; decode = greedy steps after a 16-token prompt):
#   tiny-model, bench-25m (22M)   train 4 x 128, decode batch 1 and 8; torch eager attention
#   bench-qwen3-0.6b-2l           train 1 x 4096: ours with the fused attention and activation
#                                 checkpointing on every layer, torch with SDPA and
#                                 torch.utils.checkpoint on every layer
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${BENCH_TORCH:-current}" = ref ]; then
  PY=$(scripts/setup-torch-ref.sh | tail -1)
else
  PY=$(../shared/tools/torch-current/setup.sh | tail -1)
fi
THREADS=${BENCH_THREADS:-$(nproc)}
export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS BENCH_THREADS=$THREADS
cargo build --release --bin cascade -q
BENCH=$(cargo bench -p cascade-shared --bench model --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)
[ -x "$BENCH" ] || { echo "bench-model: could not build the model bench" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# row CONFIG BATCH LEN OURS_FLAGS TORCH_FLAGS
row() {
  local cfg=$1 batch=$2 len=$3 ours_flags=$4 torch_flags=$5 name
  name=$(basename "$cfg" .json)
  [ -d "$WORK/$name" ] || target/release/cascade init-model --config "$cfg" --seed 1 --out "$WORK/$name" >/dev/null
  local ours theirs
  # shellcheck disable=SC2086
  ours=$("$BENCH" "$WORK/$name" "$batch" "$len" $ours_flags 2>/dev/null)
  # shellcheck disable=SC2086
  theirs=$("$PY" scripts/bench_model_torch.py "$WORK/$name" "$batch" "$len" $torch_flags 2>/dev/null)
  paste <(echo "$ours") <(echo "$theirs") | while IFS=$'\t' read -r a b; do
    python3 - "$name" "$a" "$b" "$ours_flags" "$torch_flags" <<'PYEOF'
import json, sys
name, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
if a["bench"] == "train":
    label = f"train {a['batch']}x{a['len']}"
    notes = f"ours {sys.argv[4] or '-'}; torch {b.get('attn')} {sys.argv[5].replace('--attn=' + b.get('attn', ''), '').strip() or ''}".strip()
else:
    label, notes = f"decode b={a['batch']}", ""
print(f"{name:<22} {label:<14} {a['tokens_per_s']:12.1f} {b['tokens_per_s']:12.1f} {a['tokens_per_s']/b['tokens_per_s']:7.2f}  {notes}")
PYEOF
  done
}

printf '%-22s %-14s %12s %12s %7s  %s\n' model bench "ours tok/s" "torch tok/s" ratio notes
if [ $# -gt 0 ]; then
  for cfg in "$@"; do row "$cfg" 4 128 "" "--attn=eager"; done
else
  for cfg in configs/tiny-model.json configs/bench-25m.json; do row "$cfg" 4 128 "" "--attn=eager"; done
  row configs/bench-qwen3-0.6b-2l.json 1 4096 "--checkpoint=1 --train-only" "--attn=sdpa --checkpoint --train-only"
fi
echo "threads: $THREADS (candle via rayon, torch via set_num_threads); torch $("$PY" -c 'import torch; print(torch.__version__)')"
