#!/usr/bin/env bash
# Actor engine decode throughput (continuous batching + CPU sampler, T = 1) against Hugging Face
# transformers (KV-cached decode + multinomial sampling, same weights, same lengths, same thread
# count) in the same run, at batch 1 / 8 / 64. Prints a table of ratios (ours / torch).
#   scripts/bench-engine.sh [CONFIG.json ...]   (default: configs/tiny-model.json if present, and
#   a ~0.6B-shaped Qwen3 with 4 layers written here)
set -euo pipefail
cd "$(dirname "$0")/.."
# The peer is PyPI's current torch (../shared/tools/torch-current/setup.sh); BENCH_TORCH=ref
# measures against Debian's torch 1.13 (scripts/setup-torch-ref.sh) instead.
if [ "${BENCH_TORCH:-current}" = ref ]; then
  PY=$(scripts/setup-torch-ref.sh | tail -1)
else
  PY=$(../shared/tools/torch-current/setup.sh | tail -1)
fi
THREADS=${BENCH_THREADS:-$(nproc)}
STEPS=${BENCH_STEPS:-32}
export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS BENCH_THREADS=$THREADS
cargo build --release --bin cascade -q
cargo bench -p cascade-actor --bench engine --no-run -q 2>/dev/null
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/qwen3-0.6b-4l.json" <<'JSON'
{"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
 "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
 "max_position_embeddings": 4096, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
 "tie_word_embeddings": true, "initializer_range": 0.02}
JSON
cat > "$WORK/tiny.json" <<'JSON'
{"model_type": "qwen3", "vocab_size": 264, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "max_position_embeddings": 512, "initializer_range": 0.02}
JSON
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=("$WORK/tiny.json" "$WORK/qwen3-0.6b-4l.json")
printf '%-22s %-8s %14s %14s %8s\n' model batch "ours tok/s" "torch tok/s" ratio
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .json)
  target/release/cascade init-model --config "$cfg" --seed 1 --out "$WORK/$name" >/dev/null
  ours=$(cargo bench -p cascade-actor --bench engine -q -- "$WORK/$name" "$STEPS" 2>/dev/null)
  theirs=$("$PY" scripts/bench_engine_torch.py "$WORK/$name" "$STEPS" 2>/dev/null)
  paste <(echo "$ours") <(echo "$theirs") | while IFS=$'\t' read -r a b; do
    python3 - "$name" "$a" "$b" <<'PYEOF'
import json, sys
name, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(f"{name:<22} {a['batch']:<8} {a['tokens_per_s']:14.1f} {b['tokens_per_s']:14.1f} {a['tokens_per_s']/b['tokens_per_s']:8.2f}")
PYEOF
  done
done
echo "threads: $THREADS, steps: $STEPS (candle via rayon, torch via set_num_threads); torch $("$PY" -c 'import torch; print(torch.__version__)')"
echo
echo "GRPO groups, whole generations (4 prompts x 8 samples, 16 slots, 16 new tokens): the samples"
echo "of a prompt sharing its KV cache against each sample prefilled on its own (ours, same run)"
printf '%-22s %-8s %12s %12s %8s %16s\n' model prompt "shared s" "alone s" speedup "prefill tokens"
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .json)
  cargo bench -p cascade-actor --bench engine -q -- "$WORK/$name" --groups 2>/dev/null | while read -r a; do
    python3 - "$name" "$a" <<'PYEOF'
import json, sys
name, a = sys.argv[1], json.loads(sys.argv[2])
print(f"{name:<22} {a['prompt']:<8} {a['shared_s']:12.3f} {a['alone_s']:12.3f} {a['alone_s']/a['shared_s']:8.2f} {a['shared_prefill_tokens']:>7} / {a['alone_prefill_tokens']:<7}")
PYEOF
  done
done
