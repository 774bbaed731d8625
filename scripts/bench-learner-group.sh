#!/usr/bin/env bash
# A learner group's overhead on the CPU (issue 17): the same SFT work (STEPS steps of 8 packed
# rows, micro_batch 1, a model of HIDDEN × LAYERS with the tiny tokenizer) by 1 learner process
# and by 2 and 3 processes over the TCP collectives, each process with one compute thread.
# Prints wall-clock per step and the ratio against 1 process, plus the bytes every rank sends
# per step (ZeRO: reduce-scatter of the gradients + all-gather of the weights, f32).
#
#   scripts/bench-learner-group.sh            (STEPS=6 HIDDEN=256 LAYERS=4 by default)
#
# No goal: on a machine with fewer cores than ranks the ranks share cores, and the figure is
# the cost of the collectives and of the idle ranks, for the record.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-6}
HIDDEN=${HIDDEN:-256}
LAYERS=${LAYERS:-4}
cargo build --release -q --bin cascade
BIN=${CARGO_TARGET_DIR:-target}/release/cascade
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
TOK=$PWD/tests/fixtures/chat/tiny-tokenizer/tokenizer.json
cat >"$WORK/model.json" <<EOF
{ "model_type": "qwen3", "vocab_size": 320, "hidden_size": $HIDDEN, "intermediate_size": $((HIDDEN * 3)),
  "num_hidden_layers": $LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": $((HIDDEN / 4)),
  "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false, "initializer_range": 0.02 }
EOF
for i in $(seq 0 63); do
  words=$(for k in $(seq 0 $((i % 20 + 10))); do printf 'w%d ' $(((i * 7 + k) % 50)); done)
  printf '{"messages": [{"role": "user", "content": "repeat %d"}, {"role": "assistant", "content": "%s"}], "mode": "no_think"}\n' "$i" "$words"
done >"$WORK/sft.jsonl"
cat >"$WORK/run.toml" <<EOF
[model]
init = { config = "model.json", tokenizer = "$TOK", seed = 1 }
dtype = "f32"
[learner]
micro_batch = 1
publish_every = 1000
threads = 1
[[stages]]
name = "sft"
kind = "sft"
dataset = "sft.jsonl"
steps = $STEPS
lr = 1e-4
batch_prompts = 8
token_budget = 256
EOF
params=$(python3 -c "
h,l,v=$HIDDEN,$LAYERS,320
per=h*h*2 + h*(h//2)*2 + 3*h*h*3 + 2*h + 2*(h//4)
print(2*v*h + l*per + h)")
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
step_s() { # mean step_s of the sft_step events in $1/metrics.jsonl
  python3 -c "
import json,sys
s=[json.loads(l)['step_s'] for l in open('$1/metrics.jsonl') if '\"sft_step\"' in l]
print(sum(s)/len(s))"
}
printf '%-6s %10s %9s %16s\n' ranks "step s" "vs 1" "sent MB/step"
base=""
for world in 1 2 3; do
  dir=$WORK/w$world
  mkdir -p "$dir"
  if [ "$world" = 1 ]; then
    "$BIN" learner --run-dir "$dir" --config "$WORK/run.toml" 2>"$dir.log"
  else
    addr=127.0.0.1:$(port)
    pids=()
    for r in $(seq 0 $((world - 1))); do
      "$BIN" learner --run-dir "$dir" --config "$WORK/run.toml" --rank "$r" --world-size "$world" \
        --rendezvous "$addr" 2>"$dir.$r.log" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
  fi
  s=$(step_s "$dir")
  [ -n "$base" ] || base=$s
  # Per step each rank sends its full f32 gradient (reduce-scatter) and its shard (all-gather);
  # with 1 rank nothing is sent.
  sent=$(python3 -c "print(0 if $world == 1 else round(4 * $params * (1 + 1 / $world) / 1e6, 1))")
  printf '%-6s %10.3f %9.2f %16s\n' "$world" "$s" "$(python3 -c "print($s / $base)")" "$sent"
done
echo "parameters: $params; one process = 1 compute thread; $(nproc) cores"
