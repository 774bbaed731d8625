#!/usr/bin/env bash
# Runs on the GPU host (no Rust, no network) with what scripts/build-gpu.sh packed into DIR:
# the CUDA test binaries, the GPU sampler benchmark and the GPU engine benchmark. Writes
# results.md and logs under $OUT.
# Budget: under 8 minutes. Usage: bash scripts/gpu-check.sh .gpu
set -uo pipefail

DIR=$(cd "${1:-.gpu}" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu-out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
RESULTS=$OUT/results.md
exec > >(tee "$OUT/gpu-check.log") 2>&1

echo "== environment"
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
if [ -n "$SP" ] && [ -d "$SP/nvidia" ]; then
  export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:$(ls -d "$SP"/nvidia/*/lib 2>/dev/null | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  ls "$SP/nvidia"
fi
ldd --version | head -1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "nvidia-smi unavailable"

{
  echo "# GPU check ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "| step | result | seconds |"
  echo "|---|---|---|"
} > "$RESULTS"
FAILED=0
step() {  # step NAME TIMEOUT_S DIR CMD...
  local name=$1 limit=$2 dir=$3; shift 3
  local t0=$SECONDS rc
  echo "== $name"
  (cd "$REPO/$dir" && timeout "$limit" "$@") > "$OUT/$name.log" 2>&1
  rc=$?
  tail -n 40 "$OUT/$name.log"
  local verdict=ok
  [ $rc -eq 0 ] || { verdict="FAILED (rc $rc)"; FAILED=1; }
  echo "| $name | $verdict | $((SECONDS - t0)) |" >> "$RESULTS"
}

gunzip -c "$DIR/cascade.gz" > "$WORK/cascade" && chmod +x "$WORK/cascade"
echo "== binary needs:"; ldd "$WORK/cascade" | grep -E "not found|cuda|cublas|curand" || true
step cascade-help 30 . "$WORK/cascade" --help

while IFS=$'\t' read -r name crate; do
  gunzip -c "$DIR/tests/$name.gz" > "$WORK/$name" && chmod +x "$WORK/$name"
  step "$name" 240 "$crate" "$WORK/$name" --test-threads=1
done < "$DIR/tests.list"

# GPU sampler benchmark (an ignored test in sampler_cuda): table into $OUT/sampler_gpu.md.
if [ -x "$WORK/sampler_cuda" ]; then
  export SAMPLER_BENCH_OUT=$OUT/sampler_gpu.md
  step sampler-gpu-bench 180 actor "$WORK/sampler_cuda" --ignored --exact gpu_sampler_benchmark --nocapture
  [ -f "$OUT/sampler_gpu.md" ] && { echo; cat "$OUT/sampler_gpu.md"; } >> "$RESULTS"
fi

# GPU engine benchmark (an ignored test in engine_cuda): decode tokens/s with the CUDA
# sampler against host sampling, into $OUT/engine_gpu.md.
if [ -x "$WORK/engine_cuda" ]; then
  export ENGINE_BENCH_OUT=$OUT/engine_gpu.md
  step engine-gpu-bench 240 actor "$WORK/engine_cuda" --ignored --exact gpu_engine_benchmark --nocapture
  [ -f "$OUT/engine_gpu.md" ] && { echo; cat "$OUT/engine_gpu.md"; } >> "$RESULTS"
fi

echo; cat "$RESULTS"
rm -rf "$WORK"
exit $FAILED
