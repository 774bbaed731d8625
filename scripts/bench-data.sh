#!/bin/bash
# Dataset reading speed and memory: rows/s of reading + schema mapping for a generated JSONL and
# Parquet file (veRL layout: `prompt` message list, `reward_model.ground_truth`, `data_source`,
# `extra_info`), cascade (`cascade data inspect --show 0`: index, read, map to canonical rows,
# count) against Python in the same run (`json.loads` per line / `pyarrow` record batches,
# taking the same fields into the same canonical dicts), and cascade's peak RSS at two file sizes
# (streaming: it should not grow with the file).
#   scripts/bench-data.sh [ROWS]      (default 1000000; the small size is ROWS/10)
# Each figure is the best of REPEAT runs (default 3) on each side, the two sides alternating.
# Needs a release build (cargo build --release; CASCADE_BIN=PATH to use another) and pyarrow (the venv of
# scripts/gen-dataset-fixtures.py, created if missing). Files go to ${BENCH_DIR:-/tmp/cascade-bench-data}.
set -euo pipefail
ROWS="${1:-1000000}"
SMALL=$((ROWS / 10))
REPEAT="${REPEAT:-3}"
DIR="${BENCH_DIR:-/tmp/cascade-bench-data}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${CASCADE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/cascade}"
VENV="${CASCADE_DATASETS_VENV:-/tmp/cascade-datasets-venv}"
[ -x "$BIN" ] || { echo "bench-data: build first: cargo build --release ($BIN missing)" >&2; exit 1; }
if ! "$VENV/bin/python" -c "import pyarrow" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "pyarrow==21.0.0"
fi
PY="$VENV/bin/python"
mkdir -p "$DIR"

"$PY" - "$DIR" "$ROWS" "$SMALL" <<'PYEOF'
import json, os, sys
import pyarrow as pa, pyarrow.parquet as pq
out, rows, small = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
MSG = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
schema = pa.schema([("data_source", pa.string()), ("prompt", MSG), ("ability", pa.string()),
                    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
                    ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())]))])
def row(i):
    return {"data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"Problem {i}: a shop sells {i % 97} apples at {i % 13} each. How much in total? Think step by step."}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str((i % 97) * (i % 13))},
            "extra_info": {"split": "train", "index": i}}
for n in (rows, small):
    base = os.path.join(out, f"verl-{n}")
    if os.path.exists(base + ".parquet") and os.path.exists(base + ".jsonl"):
        continue
    with open(base + ".jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps(row(i)) + "\n")
    w = pq.ParquetWriter(base + ".parquet", schema, compression="snappy")
    for s in range(0, n, 100000):
        w.write_table(pa.Table.from_pylist([row(i) for i in range(s, min(n, s + 100000))], schema=schema), row_group_size=10000)
    w.close()
PYEOF

# Python: the same fields into the same canonical dicts.
py_bench() {
  "$PY" - "$1" <<'PYEOF'
import json, sys, time
import pyarrow.parquet as pq
path = sys.argv[1]
def canon(r):
    return {"messages": r["prompt"], "answer": r["reward_model"]["ground_truth"].strip(),
            "data_source": r["data_source"], "extra_info": r["extra_info"], "domain": "math"}
t = time.perf_counter(); n = 0
if path.endswith(".jsonl"):
    with open(path) as f:
        for line in f:
            canon(json.loads(line)); n += 1
else:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=10000):
        for r in batch.to_pylist():
            canon(r); n += 1
dt = time.perf_counter() - t
print(f"{n} {dt:.3f}")
PYEOF
}

# cascade on `--threads $2` (JSONL lines are parsed in batches by that many threads; 1 = the
# caller's thread alone, as Python's loop).
rust_bench() {
  local t0 t1 rss
  t0=$(date +%s.%N)
  rss=$( { /usr/bin/time -f "%M" "$BIN" data inspect "$1" --show 0 --domain math --threads "$2" >/dev/null; } 2>&1 | tail -1)
  t1=$(date +%s.%N)
  echo "$(echo "$t1 - $t0" | bc) $rss"
}

THREADS="${THREADS:-$(nproc)}"
echo "cascade: $BIN (1 thread, and $THREADS parse threads for JSONL); python: $("$PY" -c 'import sys, pyarrow; print(sys.version.split()[0] + ", pyarrow " + pyarrow.__version__)')"
printf "%-10s %-8s %12s %12s %12s %8s %8s %14s\n" format rows "cascade r/s" "c. Nt r/s" "python r/s" speedup "Nt" "cascade RSS KB"
for fmt in jsonl parquet; do
  for n in "$SMALL" "$ROWS"; do
    f="$DIR/verl-$n.$fmt"
    # Best of REPEAT runs on each side (the machine may be shared); the largest peak RSS.
    rs="" rn="" ps="" rss=0
    for _ in $(seq "$REPEAT"); do
      read -r t r < <(rust_bench "$f" 1)
      rss=$(( r > rss ? r : rss ))
      if [ "$fmt" = jsonl ]; then
        read -r tn r < <(rust_bench "$f" "$THREADS")
        rss=$(( r > rss ? r : rss ))
      else
        tn=$t   # Parquet batches are decoded by the parquet crate; --threads does not apply
      fi
      read -r _n p < <(py_bench "$f")
      rs=$(awk -v a="$rs" -v b="$t" 'BEGIN { print (a == "" || b < a) ? b : a }')
      rn=$(awk -v a="$rn" -v b="$tn" 'BEGIN { print (a == "" || b < a) ? b : a }')
      ps=$(awk -v a="$ps" -v b="$p" 'BEGIN { print (a == "" || b < a) ? b : a }')
    done
    awk -v f="$fmt" -v n="$n" -v rs="$rs" -v rn="$rn" -v ps="$ps" -v rss="$rss" \
      'BEGIN { printf "%-10s %-8d %12.0f %12.0f %12.0f %7.2fx %7.2fx %14d\n", f, n, n / rs, n / rn, n / ps, ps / rs, ps / rn, rss }'
  done
done
