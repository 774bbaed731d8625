#!/usr/bin/env bash
# The main job on the embedded tiny default, on CPU. Until `cascade run` (the orchestrator) lands
# this runs what exists end to end: a seeded tiny Qwen3 checkpoint with the project's own byte
# tokenizer, a chat-template generation in both modes, and per-token log-probs.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${1:-runs/tiny}
cargo build --release --bin cascade
BIN=target/release/cascade
if [ ! -f "$RUN_DIR/model/model.safetensors" ]; then
  $BIN init-model --config configs/tiny-model.json --seed 0 --out "$RUN_DIR/model"
fi
for mode in think no_think; do
  echo "--- generate ($mode)"
  $BIN inspect generate --model "$RUN_DIR/model" --prompt "What is 2 + 3?" --mode $mode \
    --max-new-tokens 24 --temperature 1.0 --top-p 0.95 --seed 7 --json
done
echo "--- logprobs"
$BIN inspect logprobs --model "$RUN_DIR/model" --text "The answer is \\boxed{5}."
