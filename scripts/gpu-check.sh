#!/usr/bin/env bash
# Runs on the GPU host (no Rust, no network) with what scripts/build-gpu.sh packed into DIR:
# the CUDA test binaries (sampler, engine, fused attention, paged decode attention and the
# learner's SFT gradients against the CPU; the NCCL collectives and the sharded optimizer's steps
# on device buffers), the GPU sampler, engine, fused-attention, paged-attention and learner-step
# benchmarks, then a short `cascade run` (the tiny default, 3 steps a stage) with learner and
# actor on cuda:0. Writes results.md, gpu-check.log and logs.tar.gz (every step's log and table)
# under $OUT: the device tool brings back at most 8 files.
# Budget: under 8 minutes (GPU_CHECK_BUDGET_S, default 450 s, caps every step's timeout: a step
# that would start past it is skipped and reported; logs.tar.gz is refreshed after each step,
# so what ran comes back even if the device tool stops the script).
# Usage: bash scripts/gpu-check.sh .gpu
set -uo pipefail

DIR=$(cd "${1:-.gpu}" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu-out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
LOGS=$WORK/logs
mkdir -p "$LOGS"
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
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET_S:-450}))
step() {  # step NAME TIMEOUT_S DIR CMD...
  local name=$1 limit=$2 dir=$3; shift 3
  local t0=$SECONDS rc left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 15 ]; then
    echo "== $name: skipped (time budget spent)"
    echo "| $name | SKIPPED (time budget) | 0 |" >> "$RESULTS"
    FAILED=1
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "== $name (timeout ${limit}s)"
  (cd "$REPO/$dir" && timeout "$limit" "$@") > "$LOGS/$name.log" 2>&1
  rc=$?
  tail -n 40 "$LOGS/$name.log"
  local verdict=ok
  [ $rc -eq 0 ] || { verdict="FAILED (rc $rc)"; FAILED=1; }
  echo "| $name | $verdict | $((SECONDS - t0)) |" >> "$RESULTS"
  tar czf "$OUT/logs.tar.gz" -C "$WORK" logs 2>/dev/null || true
}

# xz where the host has it, else Python's lzma.
unxz_to() { xz -dc "$1" > "$2" 2>/dev/null || python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$1" "$2"; }
unxz_to "$DIR/cascade.xz" "$WORK/cascade" && chmod +x "$WORK/cascade"
echo "== binary needs:"; ldd "$WORK/cascade" | grep -E "not found|cuda|cublas|curand" || true
step cascade-help 30 . "$WORK/cascade" --help

while IFS=$'\t' read -r name crate; do
  unxz_to "$DIR/tests/$name.xz" "$WORK/$name" && chmod +x "$WORK/$name"
  step "$name" 240 "$crate" "$WORK/$name" --test-threads=1
done < "$DIR/tests.list"

# GPU sampler benchmark (an ignored test in sampler_cuda): its table goes into results.md.
if [ -x "$WORK/sampler_cuda" ]; then
  export SAMPLER_BENCH_OUT=$LOGS/sampler_gpu.md
  step sampler-gpu-bench 180 actor "$WORK/sampler_cuda" --ignored --exact gpu_sampler_benchmark --nocapture
  [ -f "$LOGS/sampler_gpu.md" ] && { echo; cat "$LOGS/sampler_gpu.md"; } >> "$RESULTS"
fi

# GPU engine benchmark (an ignored test in engine_cuda): decode tokens/s with the CUDA
# sampler against host sampling; its table goes into results.md.
if [ -x "$WORK/engine_cuda" ]; then
  export ENGINE_BENCH_OUT=$LOGS/engine_gpu.md
  step engine-gpu-bench 240 actor "$WORK/engine_cuda" --ignored --exact gpu_engine_benchmark --nocapture
  [ -f "$LOGS/engine_gpu.md" ] && { echo; cat "$LOGS/engine_gpu.md"; } >> "$RESULTS"
fi

# Fused attention on the GPU (an ignored test in flash_attn_cuda): forward and forward+backward
# times against the H200's bf16 FLOP bound; its table goes into results.md.
if [ -x "$WORK/flash_attn_cuda" ]; then
  export FLASH_ATTN_BENCH_OUT=$LOGS/flash_attn_gpu.md
  step flash-attn-gpu-bench 180 shared "$WORK/flash_attn_cuda" --ignored --exact gpu_flash_attn_benchmark --nocapture
  [ -f "$LOGS/flash_attn_gpu.md" ] && { echo; cat "$LOGS/flash_attn_gpu.md"; } >> "$RESULTS"
fi

# Paged decode attention on the GPU (an ignored test in paged_attn_cuda): one decode step's
# attention of the Qwen3-8B heads against the memory bound of reading K and V once; its table
# goes into results.md.
if [ -x "$WORK/paged_attn_cuda" ]; then
  export PAGED_ATTN_BENCH_OUT=$LOGS/paged_attn_gpu.md
  step paged-attn-gpu-bench 120 shared "$WORK/paged_attn_cuda" --ignored --exact gpu_paged_attn_benchmark --nocapture
  [ -f "$LOGS/paged_attn_gpu.md" ] && { echo; cat "$LOGS/paged_attn_gpu.md"; } >> "$RESULTS"
fi

# One learner SFT step of the Qwen3-0.6B shape in bf16 at 8K and 32K tokens (an ignored test in
# learner_cuda): wall time and the device memory peak; its table goes into results.md.
if [ -x "$WORK/learner_cuda" ]; then
  export LEARNER_BENCH_OUT=$LOGS/learner_gpu.md
  step learner-gpu-bench 200 learner "$WORK/learner_cuda" --ignored --exact gpu_learner_step_benchmark --nocapture
  [ -f "$LOGS/learner_gpu.md" ] && { echo; cat "$LOGS/learner_gpu.md"; } >> "$RESULTS"
fi

# The whole cascade on the GPU, short: the embedded tiny default with 3 steps a stage, learner
# and actor on cuda:0 (bf16), held-out table and report included. About 2 minutes on 2 CPU cores.
SHORT=(--set reward_model.steps=5 --set eval.max_prompts=8 --set eval.samples=1
       --set stages.sft1.warmup_steps=1 --set "stages.math.curriculum_steps=[2]")
for stage in sft1 sft2 rlhf if math code swe; do SHORT+=(--set "stages.$stage.steps=3"); done
step cascade-run-cuda 300 . "$WORK/cascade" run --run-dir "$WORK/run" \
  --learner-device cuda:0 --actor-devices cuda:0 "${SHORT[@]}"
if [ -f "$WORK/run/heldout.json" ]; then
  { echo; echo "cascade run on cuda:0 (3 steps a stage), held-out table:"; echo '```';
    sed -n '/^after stage/,/^held-out evaluation/p' "$LOGS/cascade-run-cuda.log"; echo '```'; } >> "$RESULTS"
  cp "$WORK/run/heldout.json" "$LOGS/"
  cp -r "$WORK/run/logs" "$LOGS/run-logs" 2>/dev/null || true
fi

echo; cat "$RESULTS"
tar czf "$OUT/logs.tar.gz" -C "$WORK" logs
rm -rf "$WORK"
exit $FAILED
