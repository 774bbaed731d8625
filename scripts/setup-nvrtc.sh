#!/usr/bin/env bash
# Install NVRTC (CUDA 13.0) from the `nvidia-cuda-nvrtc` PyPI wheel so that the sampler's CUDA
# kernels can be compiled to PTX on a machine without a GPU or CUDA toolkit (CI does this to
# catch kernel compile errors). Idempotent: a finished install is detected by its stamp file.
#
# Usage:  scripts/setup-nvrtc.sh            # prints the lib dir on the last line of stdout
#         export LD_LIBRARY_PATH=$(scripts/setup-nvrtc.sh | tail -1):$LD_LIBRARY_PATH
# Env:    NVRTC_DIR (default <repo>/target/nvrtc), PYTHON (default python3)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${NVRTC_DIR:-$REPO/target/nvrtc}
PY=${PYTHON:-python3}
# Pinned to the GPU host's CUDA 13.0 (driver 580): cudarc's `cuda-13000` feature looks for
# libnvrtc.so.13, and PTX from a newer NVRTC could use an ISA that the 580 driver rejects.
PKG=nvidia-cuda-nvrtc==13.0.88
STAMP="$DIR/.stamp"

find_lib() {
  # CUDA 13 wheels put everything under nvidia/cu13/; older layouts use nvidia/cuda_nvrtc/.
  for d in "$DIR"/unpacked/nvidia/cu13/lib "$DIR"/unpacked/nvidia/cuda_nvrtc/lib; do
    if ls "$d"/libnvrtc.so.* >/dev/null 2>&1; then echo "$d"; return 0; fi
  done
  return 1
}

if [ "$(cat "$STAMP" 2>/dev/null || true)" = "$PKG" ] && LIB=$(find_lib); then
  echo "nvrtc already installed ($PKG)" >&2
  echo "$LIB"
  exit 0
fi

echo "== downloading $PKG into $DIR/wheels" >&2
mkdir -p "$DIR/wheels"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
  -d "$DIR/wheels" "$PKG" >&2
WHL=$(ls "$DIR"/wheels/nvidia_cuda_nvrtc-13.0.88-*.whl | head -1)

echo "== unpacking $(basename "$WHL")" >&2
rm -rf "$DIR/unpacked"
mkdir -p "$DIR/unpacked"
unzip -oq "$WHL" -d "$DIR/unpacked"
LIB=$(find_lib) || { echo "error: no libnvrtc.so.* found in $WHL" >&2; exit 1; }
# cudarc's loader also tries the unversioned name.
[ -e "$LIB/libnvrtc.so" ] || ln -s "$(cd "$LIB" && ls libnvrtc.so.13* | head -1)" "$LIB/libnvrtc.so"
echo "$PKG" > "$STAMP"
echo "$LIB"
