#!/usr/bin/env bash
# The same tiny cascade twice: asynchronous (the default staleness bound) and strictly on-policy
# (--max-staleness 0, the paper's setting); the report of the first compares both wall-clocks.
#   scripts/async-vs-onpolicy.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/async-vs-onpolicy-$(date +%Y%m%d-%H%M%S)}
cargo build --release --bin cascade
BIN=target/release/cascade
$BIN run --run-dir "$OUT/async"
$BIN run --run-dir "$OUT/onpolicy" --max-staleness 0
$BIN report "$OUT/async" --compare "$OUT/onpolicy"
