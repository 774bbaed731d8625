#!/usr/bin/env bash
# The main job: the whole cascade on the embedded tiny default, on CPU — two SFT stages, a
# reward model, then RL stage after stage (rlhf → if → math → code → swe) with one learner and
# one actor process, the held-out table at the end, and the report.
#   scripts/run-tiny.sh [RUN_DIR] [extra `cascade run` flags...]
# A stopped or crashed run continues with: target/release/cascade run --resume RUN_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${1:-runs/tiny-$(date +%Y%m%d-%H%M%S)}
shift || true
cargo build --release --bin cascade
exec target/release/cascade run --run-dir "$RUN_DIR" "$@"
