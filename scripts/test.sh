#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs what the tests need, then runs every
# test of the workspace on CPU. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
# NVRTC from the nvidia-cuda-nvrtc wheel, so that our CUDA kernels are compiled to PTX
# here (no GPU needed): a syntax error in a kernel fails the tests.
NVRTC_LIB=$(scripts/setup-nvrtc.sh | tail -1)
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CASCADE_REQUIRE_NVRTC=1
# The code sandbox runs model-generated Python with python3.
command -v python3 >/dev/null || { echo "python3 is required by the code-sandbox tests" >&2; exit 1; }
# The CUDA kernels also run on the CPU under a small C++20 emulation (tests/cuda_emu/, used by
# actor/tests/sampler_kernel_emulated.rs and shared/tests/flash_attn_kernel_emulated.rs), built
# with $CXX or c++.
if ! command -v "${CXX:-c++}" >/dev/null; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  echo "installing g++ (C++ compiler for the kernel emulation test)" >&2
  { $SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y g++; } >&2 ||
    { echo "no C++ compiler and apt-get install g++ failed" >&2; exit 1; }
fi
cargo test --workspace "$@"
# Every CUDA kernel to PTX (sampler, fused attention); the workspace's feature `cuda-kernels`
# adds only cudarc to the build above, so nothing else is rebuilt.
cargo test --workspace --features cuda-kernels,nccl --test ptx --test flash_attn_ptx --test nccl_cuda "$@"
