#!/bin/bash
# Ensures the Hugging Face reference environment exists and prints its python as the last line.
#   Debian python3-torch (apt, CPU, torch 1.13) + a --system-site-packages venv at
#   ${CASCADE_REF_ENV:-/tmp/cascade-ref-env} with transformers==4.51.3, safetensors, tokenizers, numpy, jinja2 (apply_chat_template).
# Idempotent (only installs what is missing) and quiet on success; logs go to $ENV.log.
# transformers 4.51.3 needs a few torch stubs on 1.13: they live in grpo_reference.py (install_shim)
# and the smoke test below runs `grpo_reference.py --self-check`.
set -u
ENV="${CASCADE_REF_ENV:-/tmp/cascade-ref-env}"
ENV="${ENV%/}"
case "$ENV" in /*) ;; *) ENV="$PWD/$ENV" ;; esac
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SYS_PY=/usr/bin/python3          # Debian's python: the one python3-torch is built for (not pyenv's)
LOG="$ENV.log"
mkdir -p "$(dirname "$ENV")" || { echo "setup_ref_env: cannot create $(dirname "$ENV")" >&2; exit 1; }
: >"$LOG" 2>/dev/null || LOG=/dev/null

fail() {
  [ "$LOG" != /dev/null ] && [ -s "$LOG" ] && tail -n 15 "$LOG" >&2
  echo "setup_ref_env: $*" >&2
  exit 1
}

# Serialise concurrent runs on the same environment.
exec 9>"$ENV.lock" || fail "cannot open lock file $ENV.lock"
flock 9

# 1. Debian packages (only if missing).
apt_ok() {
  # libopenblas0-pthread: without it Debian's torch uses the reference BLAS and is ~10x slower (an unfair peer)
  dpkg -s python3-torch python3-venv libopenblas0-pthread >/dev/null 2>&1 &&
    "$SYS_PY" -c "import torch, ensurepip" >/dev/null 2>&1
}
if ! apt_ok; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "python3-torch/python3-venv missing and not root (no sudo)"
    SUDO="sudo -n"
  fi
  export DEBIAN_FRONTEND=noninteractive
  { $SUDO apt-get update && $SUDO apt-get install -y python3-torch python3-venv libopenblas0-pthread; } >>"$LOG" 2>&1 ||
    fail "apt-get install python3-torch python3-venv failed (log: $LOG)"
  apt_ok || fail "python3-torch installed but '$SYS_PY -c \"import torch\"' still fails (log: $LOG)"
fi

# 2. The venv (recreated only if it is there but broken).
PY="$ENV/bin/python"
venv_ok() {
  [ -x "$PY" ] && grep -qs '^include-system-site-packages *= *true' "$ENV/pyvenv.cfg" &&
    "$PY" -c "import torch" >/dev/null 2>&1
}
if ! venv_ok; then
  if [ -e "$ENV" ]; then
    [ -f "$ENV/pyvenv.cfg" ] || fail "$ENV exists and is not a venv; set CASCADE_REF_ENV to another path"
    rm -rf "$ENV" || fail "cannot remove broken venv $ENV"
  fi
  "$SYS_PY" -m venv --system-site-packages "$ENV" >>"$LOG" 2>&1 || fail "python3 -m venv $ENV failed (log: $LOG)"
  venv_ok || fail "venv $ENV cannot import Debian's torch (log: $LOG)"
fi

# 3. PyPI packages (only if missing). numpy stays < 2: Debian's torch 1.13 is built against numpy 1.x.
pkgs_ok() {
  "$PY" - >/dev/null 2>&1 <<'EOF'
import importlib.metadata as md
import numpy, safetensors, tokenizers, jinja2
assert md.version("transformers") == "4.51.3"
assert int(numpy.__version__.split(".")[0]) < 2
EOF
}
if ! pkgs_ok; then
  "$PY" -m pip install -q --disable-pip-version-check "transformers==4.51.3" safetensors tokenizers "numpy<2" \
    "jinja2>=3.1" >>"$LOG" 2>&1 \
    || fail "pip install transformers==4.51.3 safetensors tokenizers numpy jinja2 failed (log: $LOG)"
  pkgs_ok || fail "packages installed but still not importable in $PY (log: $LOG)"
fi

# 4. Smoke test: transformers (with the shim in grpo_reference.py) imports and builds a Qwen3 model.
if ! "$PY" "$HERE/grpo_reference.py" --self-check >>"$LOG" 2>&1; then
  fail "transformers does not import/build a model in $PY (shim in $HERE/grpo_reference.py) (log: $LOG)"
fi

echo "$PY"
