#!/usr/bin/env bash
# Build, on a CPU-only x86-64 machine, everything the GPU host runs: the `cascade` release
# binary with `--features cuda` and the CUDA test binaries, into .gpu/ (git-ignored), xz-compressed
# to fit the 64 MiB that travels. The CUDA toolkit comes from the CUDA 13.0 PyPI wheels (the
# GPU host has driver 580 / CUDA 13.0; see ../shared/GPU.md), plus a link-time-only libcuda
# stub that is never carried. Idempotent: wheels, toolkit tree and cargo builds are reused.
#
# Usage:  scripts/build-gpu.sh            # full build (~15+ min on 2 cores the first time)
#         SKIP_BUILD=1 scripts/build-gpu.sh   # only assemble the toolchain and print versions
# Env:    CASCADE_CUDA_ROOT (toolkit + wheels, default <repo>/target/cuda13),
#         CARGO_TARGET_DIR (default <repo>/target/gpu, apart from CPU builds so that neither
#         invalidates the other), CUDA_COMPUTE_CAP (default 90, H100/H200), PYTHON.
# Convention: integration tests whose name contains "cuda" are the GPU tests (actor/tests/
# sampler_cuda.rs, engine_cuda.rs, shared/tests/flash_attn_cuda.rs, paged_attn_cuda.rs, ...);
# each is carried with the directory of its crate (cargo runs tests from there) and run by
# scripts/gpu-check.sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=${CASCADE_CUDA_ROOT:-$REPO/target/cuda13}
CUDA=$ROOT/cuda
WHEELS=$ROOT/wheels
PY=${PYTHON:-python3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target/gpu}
GPU_DIR=$REPO/.gpu
LIMIT_BYTES=$((60 * 1024 * 1024))

# Pinned to CUDA 13.0: nvcc 13.1+ emits PTX that the 580 driver rejects.
PKGS=(
  nvidia-cuda-nvcc==13.0.88     # bin/nvcc, ptxas, fatbinary, nvlink, cudafe++
  nvidia-cuda-crt==13.0.88      # include/crt/* needed by nvcc
  nvidia-nvvm==13.0.88          # nvvm/bin/cicc, libdevice
  nvidia-cuda-runtime==13.0.96  # cuda.h, cuda_runtime.h, libcudart.so.13
  nvidia-cuda-nvrtc==13.0.88    # libnvrtc.so.13
  nvidia-cuda-cccl==13.0.85     # cub / thrust / libcu++ headers
  nvidia-curand==10.4.0.35      # libcurand.so.10 + headers
  nvidia-cublas==13.0.2.14      # libcublas(Lt).so.13 + headers
)

echo "== [1/5] CUDA 13.0 wheels into $WHEELS"
mkdir -p "$WHEELS"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$WHEELS" "${PKGS[@]}"

echo "== [2/5] toolkit tree in $CUDA"
STAMP=$(printf '%s\n' "${PKGS[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$CUDA/.stamp" 2>/dev/null || true)" != "$STAMP" ]; then
  rm -rf "$CUDA" "$ROOT/unz"
  mkdir -p "$ROOT/unz"
  for p in "${PKGS[@]}"; do
    name=${p%%==*}; ver=${p##*==}
    whl=$(ls "$WHEELS"/"${name//-/_}"-"$ver"-*.whl | head -1)
    unzip -oq "$whl" -d "$ROOT/unz"
  done
  mv "$ROOT/unz/nvidia/cu13" "$CUDA"   # every CUDA 13 wheel installs under nvidia/cu13/
  rm -rf "$ROOT/unz"
  echo "$STAMP" > "$CUDA/.stamp"
fi

echo "== [3/5] dev symlinks, lib64, libcuda link stub"
(
  cd "$CUDA/lib"
  for l in cudart cublas cublasLt nvrtc; do ln -sfn "lib$l.so.13" "lib$l.so"; done
  ln -sfn libcurand.so.10 libcurand.so
)
ln -sfn lib "$CUDA/lib64"
chmod +x "$CUDA"/bin/* "$CUDA"/nvvm/bin/* 2>/dev/null || true
if [ ! -f "$CUDA/lib/stubs/libcuda.so" ]; then
  # Link-time stand-in for the driver (the real libcuda.so.1 is the GPU host's): every entry
  # point of cuda.h and of cudarc's bindings returns 34 = CUDA_ERROR_STUB_LIBRARY.
  mkdir -p "$CUDA/lib/stubs"
  {
    grep -hoE 'CUDAAPI[[:space:]]+cu[A-Za-z0-9_]+[[:space:]]*\(' "$CUDA/include/cuda.h" \
      | sed -E 's/CUDAAPI[[:space:]]+//; s/[[:space:]]*\(//'
    grep -hoE '#define[[:space:]]+cu[A-Za-z0-9_]+[[:space:]]+cu[A-Za-z0-9_]+' "$CUDA/include/cuda.h" \
      | awk '{print $3}'
    cat "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19*/src/driver/sys/mod.rs 2>/dev/null \
      | grep -hoE '^pub unsafe fn cu[A-Za-z0-9_]+' | sed 's/pub unsafe fn //' || true
  } | sort -u | awk '{print "int " $1 "(void){return 34;}"}' > "$ROOT/cuda_stub.c"
  gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$CUDA/lib/stubs/libcuda.so" "$ROOT/cuda_stub.c"
fi

if [ ! -f "$CUDA/lib/stubs/libnccl.so" ]; then
  # Link-time stand-in for NCCL (the real libnccl.so.2 is the GPU host's, from its Python
  # wheels): `--features cuda,nccl` links it, and no CUDA 13 toolkit wheel ships it. Every entry
  # point of cudarc's NCCL bindings returns 3 = ncclInternalError.
  mkdir -p "$CUDA/lib/stubs"
  cat "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19*/src/nccl/sys/mod.rs \
    | grep -hoE 'pub (unsafe )?fn nccl[A-Za-z0-9_]+' | sed -E 's/pub (unsafe )?fn //' | sort -u \
    | awk '{print "int " $1 "(void){return 3;}"}' > "$ROOT/nccl_stub.c"
  gcc -shared -fPIC -O1 -Wl,-soname,libnccl.so.2 -o "$CUDA/lib/stubs/libnccl.so" "$ROOT/nccl_stub.c"
fi

export CUDA_ROOT=$CUDA CUDA_PATH=$CUDA CUDA_HOME=$CUDA NVCC=$CUDA/bin/nvcc
export PATH=$CUDA/bin:$PATH
export LIBRARY_PATH=$CUDA/lib:$CUDA/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}
export CUDARC_CUDA_VERSION=13000
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
nvcc --version | tail -2
cargo --version
echo "CARGO_TARGET_DIR=$CARGO_TARGET_DIR CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  echo "toolchain ready (SKIP_BUILD=1)"
  exit 0
fi

cd "$REPO"
echo "== [4/5] cargo build --release --features cuda (binary) and CUDA test binaries"
cargo build --release --locked --features cuda --bin cascade
cargo test --release --locked --features cuda --workspace --no-run --message-format=json \
  > "$CARGO_TARGET_DIR/gpu-tests.json"
# The NCCL collectives' test without candle's CUDA backend: NCCL loaded at run time from the GPU
# host's wheels. Listed after the `cuda` build's (empty) nccl_cuda, so that it replaces it.
cargo test --release --locked -p cascade-shared --features nccl --test nccl_cuda --no-run \
  --message-format=json >> "$CARGO_TARGET_DIR/gpu-tests.json"
# The learner's GPU tests with NCCL on the device's buffers (the sharded optimizer's tensor
# collectives): `cuda,nccl` links libnccl (the stub above at build time, the host's at run time).
# Listed after the `cuda` build's learner_cuda, so that it replaces it.
cargo test --release --locked -p cascade-learner --features cuda,nccl --test learner_cuda --no-run \
  --message-format=json >> "$CARGO_TARGET_DIR/gpu-tests.json"

echo "== [5/5] pack into $GPU_DIR"
rm -rf "$GPU_DIR"
mkdir -p "$GPU_DIR/tests"
# Stripped (backtraces lose function names) and xz-compressed: candle's embedded kernels make
# each binary ~50 MB, which gzip only halves; xz -9 takes them to about a fifth, so that the
# binary and every CUDA test binary travel in one call.
pack() { strip -o "$GPU_DIR/.tmp" "$1" && xz -9 -T0 -c "$GPU_DIR/.tmp" > "$2" && rm "$GPU_DIR/.tmp"; }
pack "$CARGO_TARGET_DIR/release/cascade" "$GPU_DIR/cascade.xz"
# "name<TAB>crate dir (relative to the repo)<TAB>executable" for every test target named *cuda*.
"$PY" - "$CARGO_TARGET_DIR/gpu-tests.json" "$REPO" > "$GPU_DIR/tests.tsv" <<'PYEOF'
import json, os, sys
repo = sys.argv[2]
found = {}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    name = m["target"]["name"]
    if "cuda" not in name or "test" not in m["target"]["kind"]:
        continue
    crate_dir = os.path.relpath(os.path.dirname(m["manifest_path"]), repo)
    found[name] = f"{name}\t{crate_dir}\t{m['executable']}"
for row in found.values():
    print(row)
PYEOF
while IFS=$'\t' read -r name crate exe; do
  pack "$exe" "$GPU_DIR/tests/$name.xz"
  echo "  test $name ($crate): $(stat -c %s "$exe") bytes"
done < "$GPU_DIR/tests.tsv"
cut -f1,2 "$GPU_DIR/tests.tsv" > "$GPU_DIR/tests.list"
rm "$GPU_DIR/tests.tsv"
echo "runtime libraries the binary needs (from the GPU host's driver and Python wheels):"
readelf -d "$CARGO_TARGET_DIR/release/cascade" | grep NEEDED || true
SIZE=$(du -sb "$GPU_DIR" | cut -f1)
echo "$GPU_DIR: $SIZE bytes"
if [ "$SIZE" -gt "$LIMIT_BYTES" ]; then
  echo "error: $GPU_DIR is over $LIMIT_BYTES bytes; it would not travel" >&2
  exit 1
fi
echo "next: run with carry [\".gpu\"]: bash scripts/gpu-check.sh .gpu"
