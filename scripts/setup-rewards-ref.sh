#!/bin/bash
# Ensures the Python reference environment for the math and IFEval verifiers exists and prints its
# python as the last line. Used only to regenerate the committed fixtures
# (scripts/gen-math-fixtures.py, scripts/gen-ifeval-fixtures.py); `cargo test` does not need it.
#   venv at ${CASCADE_REWARDS_REF:-/tmp/cascade-rewards-ref} (python3 from PATH) with, from PyPI:
#   math-verify (+ latex2sympy2_extended, sympy, antlr4 runtime), lm-eval (no deps: only its IFEval
#   module is used; importing it runs lm_eval/tasks/__init__.py, which needs numpy, pyyaml, jinja2,
#   requests, datasets, sacrebleu, typing_extensions; the module itself needs nltk, immutabledict,
#   langdetect, packaging), nvidia-mmath (no deps:
#   only its MATH-500/AIME JSON files are used) and llama-index-core (no deps: only its bundled NLTK
#   punkt data is used, so nothing is downloaded at run time).
# Idempotent (installs only what is missing) and quiet on success; logs go to $ENV.log.
set -u
ENV="${CASCADE_REWARDS_REF:-/tmp/cascade-rewards-ref}"
ENV="${ENV%/}"
case "$ENV" in /*) ;; *) ENV="$PWD/$ENV" ;; esac
LOG="$ENV.log"
mkdir -p "$(dirname "$ENV")" || { echo "setup-rewards-ref: cannot create $(dirname "$ENV")" >&2; exit 1; }
: >"$LOG" 2>/dev/null || LOG=/dev/null

fail() {
  [ "$LOG" != /dev/null ] && [ -s "$LOG" ] && tail -n 15 "$LOG" >&2
  echo "setup-rewards-ref: $*" >&2
  exit 1
}

exec 9>"$ENV.lock" || fail "cannot open lock file $ENV.lock"
flock 9

SYS_PY="$(command -v python3)" || fail "python3 not found"
PY="$ENV/bin/python"
if ! { [ -x "$PY" ] && "$PY" -c "import sys; assert sys.version_info >= (3, 10)" >/dev/null 2>&1; }; then
  if [ -e "$ENV" ]; then
    [ -f "$ENV/pyvenv.cfg" ] || fail "$ENV exists and is not a venv; set CASCADE_REWARDS_REF to another path"
    rm -rf "$ENV" || fail "cannot remove broken venv $ENV"
  fi
  "$SYS_PY" -m venv "$ENV" >>"$LOG" 2>&1 || fail "$SYS_PY -m venv $ENV failed (log: $LOG)"
fi

pkgs_ok() {
  "$PY" - >/dev/null 2>&1 <<'PYEOF'
import importlib.metadata as md
assert md.version("math-verify") == "0.9.0"
assert md.version("lm_eval") == "0.4.13"
assert md.version("nvidia-mmath") == "26.3"
assert md.version("langdetect") == "1.0.9"
md.version("llama-index-core")
import math_verify, langdetect, nltk, immutabledict, packaging, datasets, sacrebleu  # noqa: F401
PYEOF
}
if ! pkgs_ok; then
  PIP=("$PY" -m pip install -q --disable-pip-version-check)
  "${PIP[@]}" "math-verify==0.9.0" "langdetect==1.0.9" "nltk>=3.9.1" immutabledict packaging \
    typing_extensions numpy pyyaml jinja2 requests datasets sacrebleu >>"$LOG" 2>&1 ||
    fail "pip install math-verify langdetect nltk failed (log: $LOG)"
  "${PIP[@]}" --no-deps "lm-eval==0.4.13" "nvidia-mmath==26.3" "llama-index-core" >>"$LOG" 2>&1 ||
    fail "pip install --no-deps lm-eval nvidia-mmath llama-index-core failed (log: $LOG)"
  pkgs_ok || fail "packages installed but not importable in $PY (log: $LOG)"
fi

# Smoke test: the bundled punkt data is found and lm-eval's IFEval registry imports without network.
if ! "$PY" "$(dirname "${BASH_SOURCE[0]}")/gen-ifeval-fixtures.py" --self-check >>"$LOG" 2>&1; then
  fail "lm-eval IFEval does not import with the bundled NLTK data (log: $LOG)"
fi
echo "$PY"
