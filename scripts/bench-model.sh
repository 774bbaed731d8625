#!/usr/bin/env bash
# Model throughput against PyTorch (transformers, same weights, same shapes, same thread count)
# in the same script run, printed as a table of ratios (ours / PyTorch; > 1 means faster).
#   scripts/bench-model.sh [CONFIG.json ...]   (default: configs/tiny-model.json configs/bench-25m.json)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(scripts/setup-torch-ref.sh | tail -1)
THREADS=${BENCH_THREADS:-$(nproc)}
export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS BENCH_THREADS=$THREADS
cargo build --release --bin cascade -q
cargo bench -p cascade-shared --bench model --no-run -q 2>/dev/null
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/tiny-model.json configs/bench-25m.json)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
printf '%-22s %-16s %14s %14s %8s\n' model bench "ours tok/s" "torch tok/s" ratio
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .json)
  target/release/cascade init-model --config "$cfg" --seed 1 --out "$WORK/$name" >/dev/null
  ours=$(cargo bench -p cascade-shared --bench model -q -- "$WORK/$name" 4 128 2>/dev/null)
  theirs=$("$PY" scripts/bench_model_torch.py "$WORK/$name" 4 128 2>/dev/null)
  paste <(echo "$ours") <(echo "$theirs") | while IFS=$'\t' read -r a b; do
    python3 - "$name" "$a" "$b" <<'PYEOF'
import json, sys
name, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
label = f"{a['bench']} b={a['batch']}"
print(f"{name:<22} {label:<16} {a['tokens_per_s']:14.1f} {b['tokens_per_s']:14.1f} {a['tokens_per_s']/b['tokens_per_s']:8.2f}")
PYEOF
  done
done
echo "threads: $THREADS (candle via rayon, torch via set_num_threads)"
