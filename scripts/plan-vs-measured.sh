#!/usr/bin/env bash
# `cascade plan` against what the learner and the actors measure (issue 17): for three CPU configs
# of different shapes and lengths (one of them a 2-rank learner group), the plan's memory of a
# learner process in an SFT stage, and the peaks the learner logs for its steps: the heap's
# (`peak_heap_mb`, the bytes its allocations held at once) and the resident set size's
# (`peak_rss_mb`), each run in a fresh process.
#
#   scripts/plan-vs-measured.sh             # learners, then actors
#   ONLY=actor scripts/plan-vs-measured.sh  # the actors only
#   ONLY=learner scripts/plan-vs-measured.sh  # the learners only
#
# The plan counts what the learner holds (weights, optimizer state, gradients, activations,
# the collectives' buffers): the heap peak is that figure, measured. The RSS adds the process
# itself (binary, tokenizer, dataset index) and the pages the allocator keeps after frees
# (mimalloc with purging off, `cascade_shared::device::keep_freed_memory`: faster, but the RSS
# stays at its high-water mark and grows when sizes change). Goal (issue 17): heap within 15 %.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q --bin cascade
BIN=${CARGO_TARGET_DIR:-target}/release/cascade
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
TOK=$PWD/tests/fixtures/chat/tiny-tokenizer/tokenizer.json

# name hidden layers heads kv head_dim intermediate vocab budget rows micro ranks
CONFIGS=(
  "wide-short 512 2 8 4 64 1536 32000 512 4 2 1"
  "deep-long 256 8 4 2 64 768 16000 2048 2 1 1"
  "group-2 384 4 6 2 64 1152 24000 1024 4 1 2"
)
if [ "${ONLY:-}" = actor ]; then CONFIGS=(); fi
printf '%-11s %6s %10s %7s %9s %9s %7s %9s %7s\n' config ranks parameters tokens "plan MB" "heap MB" "ratio" "RSS MB" "ratio"
for spec in "${CONFIGS[@]}"; do
  read -r name hidden layers heads kv hd inter vocab budget rows micro ranks <<<"$spec"
  dir=$WORK/$name
  mkdir -p "$dir/run"
  cat >"$dir/model.json" <<EOF
{ "model_type": "qwen3", "vocab_size": $vocab, "hidden_size": $hidden, "intermediate_size": $inter,
  "num_hidden_layers": $layers, "num_attention_heads": $heads, "num_key_value_heads": $kv, "head_dim": $hd,
  "max_position_embeddings": $((budget * 2)), "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false, "initializer_range": 0.02 }
EOF
  # Conversations about as long as the packing budget, so that each row is nearly full.
  python3 - "$dir/sft.jsonl" "$budget" <<'PY'
import json, sys
path, budget = sys.argv[1], int(sys.argv[2])
with open(path, "w") as f:
    for i in range(64):
        words = " ".join(f"w{(i * 7 + k) % 50}" for k in range(budget // 6))
        f.write(json.dumps({"messages": [{"role": "user", "content": f"repeat {i}"},
                                         {"role": "assistant", "content": words}],
                            "mode": "no_think"}) + "\n")
PY
  cat >"$dir/run.toml" <<EOF
[model]
init = { config = "model.json", tokenizer = "$TOK", seed = 1 }
dtype = "f32"
[devices]
learner_ranks = $ranks
[learner]
micro_batch = $micro
publish_every = 1000
threads = 2
[[stages]]
name = "sft"
kind = "sft"
dataset = "sft.jsonl"
steps = 3
lr = 1e-4
batch_prompts = $rows
token_budget = $budget
EOF
  "$BIN" plan --config "$dir/run.toml" --device-memory 1TB >"$dir/plan.txt"
  plan_line=$(grep -E '^  learner( rank 0)? on cpu:' "$dir/plan.txt" | head -1)
  plan_mb=$(python3 -c "
import re, sys
m = re.search(r':\s*([0-9.]+)\s*(GB|MB|KB|B)\b', '''$plan_line''')
v, u = float(m.group(1)), m.group(2)
print(round(v * {'GB': 1e3, 'MB': 1, 'KB': 1e-3, 'B': 1e-6}[u] / 1.048576, 1))")
  if [ "$ranks" = 1 ]; then
    "$BIN" learner --run-dir "$dir/run" --config "$dir/run.toml" 2>"$dir/learner.log" || { cat "$dir/learner.log"; exit 1; }
  else
    addr=127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    pids=()
    for r in $(seq 0 $((ranks - 1))); do
      "$BIN" learner --run-dir "$dir/run" --config "$dir/run.toml" --rank "$r" --world-size "$ranks" \
        --rendezvous "$addr" 2>"$dir/learner.$r.log" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
  fi
  read -r heap rss tokens < <(python3 - "$dir/run/metrics.jsonl" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
steps = [e for e in ev if e["event"] == "sft_step"]
heap = max(e.get("peak_heap_mb") or 0 for e in steps)
rss = max(e.get("peak_rss_mb") or 0 for e in ev if e["event"] in ("sft_step", "learner_exit"))
toks = max(e.get("train_tokens") or 0 for e in steps)
print(round(heap, 1), round(rss, 1), toks)
PY
)
  params=$(head -1 "$dir/plan.txt" | grep -oE '[0-9]+ parameters' | cut -d' ' -f1)
  printf '%-11s %6s %10s %7s %9s %9s %7.2f %9s %7.2f\n' "$name" "$ranks" "$params" "$tokens" "$plan_mb" "$heap" \
    "$(python3 -c "print($heap / $plan_mb)")" "$rss" "$(python3 -c "print($rss / $plan_mb)")"
done
echo "MB = MiB; plan: the learner (rank 0) line of the SFT stage with --device-memory 1TB; heap and RSS: rank 0's peaks over its steps (RSS also at exit)"

# Actors: the math stage on the tiny math prompts, three shapes (f32, CPU): the KV cache of
# gen_batch × G sequences of prompt + response tokens, the weights and the decode temporaries.
# `cascade run` generates for ACTOR_SECONDS (default 60) and is then stopped; the actor's peaks
# (the largest `peak_heap_mb` and `peak_rss_mb` of its `actor` events) against the plan's
# actor line, planned with --prompt-tokens 64 (the tiny math prompts are shorter).
# name hidden layers heads kv head_dim intermediate vocab gen_batch group response_tokens
ACTORS=(
  "math-45m 512 4 8 4 64 1536 32000 8 4 256"
  "wide-batch 256 2 4 2 64 768 32000 32 8 128"
  "deep-long 384 8 6 2 64 1152 16000 4 2 512"
)
if [ "${ONLY:-}" = learner ]; then ACTORS=(); fi
printf '\n%-11s %10s %9s %9s %7s %9s %7s\n' actor groups "plan MB" "heap MB" ratio "RSS MB" ratio
for spec in "${ACTORS[@]}"; do
  read -r name hidden layers heads kv hd inter vocab gen_batch group response <<<"$spec"
  dir=$WORK/actor-$name
  mkdir -p "$dir"
  "$BIN" data tiny --out "$dir/data" >/dev/null
  cat >"$dir/model.json" <<EOF
{ "model_type": "qwen3", "vocab_size": $vocab, "hidden_size": $hidden, "intermediate_size": $inter,
  "num_hidden_layers": $layers, "num_attention_heads": $heads, "num_key_value_heads": $kv, "head_dim": $hd,
  "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false, "initializer_range": 0.02 }
EOF
  cat >"$dir/run.toml" <<EOF
[model]
init = { config = "model.json", tokenizer = "data/tokenizer/tokenizer.json", seed = 1 }
dtype = "f32"
[devices]
learner = "cpu"
actors = ["cpu"]
num_actors = 1
[actor]
gen_batch = $gen_batch
threads = 1
reward_workers = 1
[learner]
micro_batch = 4
threads = 1
publish_every = 1000
[[stages]]
name = "math"
kind = "math"
dataset = "data/math.jsonl"
steps = 3
lr = 1e-5
batch_prompts = $gen_batch
group_size = $group
max_response_tokens = $response
EOF
  "$BIN" plan --config "$dir/run.toml" --device-memory 1TB --prompt-tokens 64 >"$dir/plan.txt"
  plan_line=$(grep -E '^  actor 0 on cpu:' "$dir/plan.txt" | head -1)
  plan_mb=$(python3 -c "
import re
m = re.search(r':\s*([0-9.]+)\s*(GB|MB|KB|B)\b', '''$plan_line''')
v, u = float(m.group(1)), m.group(2)
print(round(v * {'GB': 1e3, 'MB': 1, 'KB': 1e-3, 'B': 1e-6}[u] / 1.048576, 1))")
  # In a session of its own, so that the run, its learner and its actor stop together.
  setsid "$BIN" run --config "$dir/run.toml" --run-dir "$dir/run" >"$dir/run.log" 2>&1 &
  run_pid=$!
  sleep "${ACTOR_SECONDS:-60}"
  kill -KILL -- "-$run_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  read -r heap rss groups < <(python3 - "$dir/run/metrics.jsonl" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
act = [e for e in ev if e.get("event") == "actor"]
if not act:
    sys.exit("no actor event was logged: " + sys.argv[1])
print(round(max(e.get("peak_heap_mb") or 0 for e in act), 1),
      round(max(e.get("peak_rss_mb") or 0 for e in act), 1),
      max(e.get("groups") or 0 for e in act))
PY
)
  printf '%-11s %10s %9s %9s %7.2f %9s %7.2f\n' "$name" "$groups" "$plan_mb" "$heap" \
    "$(python3 -c "print($heap / $plan_mb)")" "$rss" "$(python3 -c "print($rss / $plan_mb)")"
done
echo "actor: the plan's actor line with --prompt-tokens 64; heap and RSS: the actor's peaks over ${ACTOR_SECONDS:-60} s of generation"
