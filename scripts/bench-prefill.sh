#!/usr/bin/env bash
# The actors' prefill of one long prompt in one pass against the same prompt in chunks
# (CausalLm::extend: each chunk's queries over the paged cache), each setting in its own
# process: tokens/s, the ratio to one pass, and the process's peak RSS (the model's weights
# included). Model: 4 layers shaped like Qwen3-0.6B, f32, CPU.
#   scripts/bench-prefill.sh [LEN] [CHUNK ...]    (default: 8192 tokens; chunks 2048 and 512)
set -euo pipefail
cd "$(dirname "$0")/.."
LEN=${1:-8192}
shift || true
CHUNKS=("$@")
[ ${#CHUNKS[@]} -gt 0 ] || CHUNKS=(2048 512)
THREADS=${BENCH_THREADS:-$(nproc)}
export RAYON_NUM_THREADS=$THREADS
cargo build --release --bin cascade -q
BENCH=$(cargo bench -p cascade-shared --bench model --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)
[ -x "$BENCH" ] || { echo "bench-prefill: could not build the model bench" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/qwen3-0.6b-4l.json" <<JSON
{"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
 "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
 "max_position_embeddings": $LEN, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
 "tie_word_embeddings": true, "initializer_range": 0.02}
JSON
target/release/cascade init-model --config "$WORK/qwen3-0.6b-4l.json" --seed 1 --out "$WORK/m" >/dev/null
printf '%-8s %-8s %12s %10s %14s\n' tokens chunk "tokens/s" "vs 1 pass" "peak RSS MB"
base=""
for chunk in "$LEN" "${CHUNKS[@]}"; do
  out=$("$BENCH" "$WORK/m" --prefill="$LEN,$chunk" 2>/dev/null)
  python3 - "$out" "${base:-}" <<'PYEOF'
import json, sys
a = json.loads(sys.argv[1])
base = float(sys.argv[2]) if sys.argv[2] else a["tokens_per_s"]
print(f"{a['len']:<8} {a['chunk']:<8} {a['tokens_per_s']:12.1f} {a['tokens_per_s']/base:10.2f} {a['peak_rss_mb']:14.0f}")
PYEOF
  [ -n "$base" ] || base=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['tokens_per_s'])" "$out")
done
echo "threads: $THREADS"
