#!/usr/bin/env bash
# Learner memory against sequence length: one SFT step (forward, backward, AdamW) of a 2-layer
# model shaped like Qwen3-0.6B (hidden 1024, 16 heads, 8 kv heads, head_dim 128, intermediate
# 3072, vocab 151 936, tied embeddings; f32, CPU) on one conversation of N tokens, each in a
# process of its own (learner/examples/sft_step_memory.rs), with activation checkpointing on
# (every layer) and off.
#
#   scripts/bench-learner-memory.sh [TOKENS ...]      (default: 1024 2048 4096 8192 16384)
#   BENCH_CHECKPOINT="1 0" (the settings to run, default both)
#   BENCH_PROFILE=dev (default release; memory does not depend on it, time does)
#
# Columns: peak RSS of the forward + backward; the fixed state (weights, gradients, AdamW
# moments: 16 bytes per parameter); activations = peak − fixed − the process before the model;
# per token = activations / tokens; slope = growth of activations per added token against the
# previous row (linear growth: a constant slope); live MiB = the peak of bytes allocated and not
# yet freed during the forward + backward (counted by the example's allocator: what the tensors
# need, without the pages an allocator keeps or fragments). The optimizer update's own peak is
# printed too (independent of the length). Goal (issue 16): activations under 4 GB at 16 384 tokens
# (≤ 250 KB per token) and linear growth.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=("$@")
[ ${#tokens[@]} -gt 0 ] || tokens=(1024 2048 4096 8192 16384)
settings=(${BENCH_CHECKPOINT:-1 0})
PROFILE=${BENCH_PROFILE:-release}
cargo build --profile "$PROFILE" -q --workspace --example sft_step_memory
DIR=$PROFILE
[ "$PROFILE" = dev ] && DIR=debug
BIN=${CARGO_TARGET_DIR:-target}/$DIR/examples/sft_step_memory
printf '%-10s %7s %11s %10s %13s %11s %12s %10s %12s %9s\n' checkpoint tokens "peak MiB" "fixed MiB" "activ. MiB" "KB/token" "slope KB/tok" "live MiB" "optim MiB" "step s"
for ck in "${settings[@]}"; do
  prev=""
  for n in "${tokens[@]}"; do
    if ! line=$("$BIN" --tokens "$n" --checkpoint "$ck" 2>/dev/null); then
      printf '%-10s %7s %s\n' "$ck" "$n" "failed (out of memory?)"
      continue
    fi
    prev=$(python3 - "$line" "$prev" <<'PYEOF'
import json, sys
r = json.loads(sys.argv[1])
act = r["peak_fwd_bwd_mb"] - r["fixed_mb"] - r["base_rss_mb"]
per = act * 1024 / r["tokens"]
slope = "-"
if sys.argv[2]:
    p_tokens, p_act = map(float, sys.argv[2].split())
    slope = f"{(act - p_act) * 1024 / (r['tokens'] - p_tokens):.1f}"
ck = {0: "off"}.get(r["checkpoint"], f"every {r['checkpoint']}")
print(f"{ck:<10} {r['tokens']:7d} {r['peak_fwd_bwd_mb']:11.0f} {r['fixed_mb']:10.0f} {act:13.0f} {per:11.1f} {slope:>12} {r['live_peak_fwd_bwd_mb']:10.0f} {r['peak_step_mb']:12.0f} {r['fwd_bwd_s'] + r['optimizer_s']:9.1f}", file=sys.stderr)
print(r["tokens"], act)
PYEOF
)
  done
done 2>&1
