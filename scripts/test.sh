#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs what the tests need, then runs every
# test of the workspace on CPU. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
# NVRTC from the nvidia-cuda-nvrtc wheel, so that the CUDA sampler kernels are compiled to PTX
# here (no GPU needed): a syntax error in a kernel fails the tests.
NVRTC_LIB=$(scripts/setup-nvrtc.sh | tail -1)
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CASCADE_REQUIRE_NVRTC=1
# The code sandbox runs model-generated Python with python3.
command -v python3 >/dev/null || { echo "python3 is required by the code-sandbox tests" >&2; exit 1; }
cargo test --workspace "$@"
cargo test -p cascade-actor --features cuda-kernels --test ptx "$@"
